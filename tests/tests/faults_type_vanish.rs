//! The virtual type disappears, end to end on real API servers, with the
//! runtime binary `vcluster-plugin-syncer` as a process (as in its sidecar):
//!
//! 1. the Car CRD is deleted from the virtual cluster (which deletes every virtual Car): the
//!    runtime keeps every host copy (same uid, zero host deletes in the audit log), reports
//!    `RuntimeHealthy=False, reason=TypeUnavailable`, retries the watch with a growing delay up
//!    to its cap (read from its JSON log lines); the CRD and the Cars are re-created: the host
//!    copies are adopted (their `object-uid` annotation follows the new Cars), zero host
//!    creates;
//! 2. the Car CRD is deleted from the host (which deletes the host copies): the virtual Cars are
//!    untouched (zero virtual writes), the same report and growing retries; the CRD is
//!    re-created: each host copy is created exactly once again;
//! 3. every line the runtime logged is one JSON object with exactly one `message` key (parsed
//!    with a duplicate-detecting visitor: a `serde_json::Map` would silently keep one of two).
//!
//! Deleting a CRD disturbs every other test of the control plane, so this binary has one test.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use kube::{Client, ResourceExt};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_tests::{Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, wait_for};

const NS: &str = "vc-vanish";
const VCLUSTER: &str = "vanish";
const VIRTUAL_NS: &str = "team";
const CARS: usize = 10;
const CRD: &str = "cars.example.loft.sh";
/// `--retry-max-seconds` (`VCLUSTER_PLUGIN_RETRY_MAX_SECONDS`) of the runtime: small, so that the cap is reached within seconds.
const RETRY_MAX_MS: u64 = 4_000;
/// The runtime's first retry delay (`vcp_syncer_runtime::retry::RETRY_MIN`, 500 ms).
const RETRY_MIN_MS: u64 = 500;
const TIMEOUT: Duration = Duration::from_secs(60);

fn cars() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.loft.sh", "v1", "Car"),
        "cars",
    )
}

/// The runtime binary, built with cargo into this test's target folder and profile.
fn runtime_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("<target>/<profile>/deps")
        .to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .current_dir(vcp_tests::repo_root())
        .args([
            "build",
            "--locked",
            "-p",
            "vcp-syncer-runtime",
            "--bin",
            "vcluster-plugin-syncer",
        ])
        .env("CARGO_TARGET_DIR", profile.parent().expect("target folder"));
    if profile.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let out = build.output().expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build of vcluster-plugin-syncer failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    profile.join("vcluster-plugin-syncer")
}

/// A JSON value in which no object has a key twice (the check is in the visitor).
struct NoDuplicateKeys(Value);

impl<'de> serde::Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Checked).map(NoDuplicateKeys)
    }
}

struct Checked;

impl<'de> Visitor<'de> for Checked {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(json!(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(json!(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(json!(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(NoDuplicateKeys(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let NoDuplicateKeys(value) = map.next_value()?;
            if object.insert(key.clone(), value).is_some() {
                return Err(de::Error::custom(format!("duplicate key {key:?}")));
            }
        }
        Ok(Value::Object(object))
    }
}

/// Every line of the runtime's log, each parsed as one JSON object without duplicate keys.
fn log_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read the runtime's log");
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .map(|line| {
            let NoDuplicateKeys(value) = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("runtime log line is not clean JSON ({e}): {line}"));
            assert!(value.is_object(), "not a JSON object: {line}");
            value
        })
        .collect()
}

/// Every "watch failed" line about `cluster`, from line `from` on: (when it was logged, the
/// `retry_in_ms` it announces).
fn watch_retries(path: &Path, cluster: &str, from: usize) -> Vec<(Timestamp, u64)> {
    log_lines(path)
        .into_iter()
        .skip(from)
        .filter(|l| {
            l["fields"]["message"] == "watch failed, retrying with backoff"
                && l["fields"]["cluster"] == cluster
        })
        .filter_map(|l| {
            let at: Timestamp = l["timestamp"].as_str()?.parse().ok()?;
            Some((at, l["fields"]["retry_in_ms"].as_u64()?))
        })
        .collect()
}

/// The announced delays start at the minimum, double and stay at the cap; and the runtime
/// really waited them: the time from one failure to the next (read from the log lines'
/// timestamps, not from what the runtime announces) is each announced delay plus at most the
/// time of one failing attempt.
fn assert_capped_exponential(what: &str, retries: &[(Timestamp, u64)]) {
    let delays: Vec<u64> = retries.iter().map(|r| r.1).collect();
    let gaps: Vec<u64> = retries
        .windows(2)
        .map(|w| {
            let gap = w[1].0.duration_since(w[0].0);
            u64::try_from(gap.as_millis()).unwrap_or(0)
        })
        .collect();
    let mut expected = RETRY_MIN_MS;
    for (i, delay) in delays.iter().enumerate() {
        assert_eq!(
            *delay, expected,
            "{what}: retry {i} announced {delay} ms, expected {expected} ms (all: {delays:?})"
        );
        expected = (expected * 2).min(RETRY_MAX_MS);
    }
    assert_eq!(
        delays.last(),
        Some(&RETRY_MAX_MS),
        "{what}: cap not reached: {delays:?}"
    );
    for (i, gap) in gaps.iter().enumerate() {
        assert!(
            *gap + 50 >= delays[i] && *gap <= delays[i] + 1_500,
            "{what}: {gap} ms between failures {i} and {}, announced {} ms (gaps {gaps:?}, delays {delays:?})",
            i + 1,
            delays[i]
        );
    }
    println!(
        "{what}: {} ms between failures (announced {delays:?} ms)",
        json!(gaps)
    );
}

struct Runtime {
    child: Child,
    log: PathBuf,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn apply(client: &Client, ar: &ApiResource, ns: Option<&str>, obj: Value) -> DynamicObject {
    let name = obj["metadata"]["name"].as_str().expect("name").to_string();
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    };
    let obj: DynamicObject = serde_json::from_value(obj).expect("object");
    api.patch(
        &name,
        &PatchParams::apply(TEST_FIELD_MANAGER).force(),
        &Patch::Apply(&obj),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {name}: {e}"))
}

async fn put_cars(virtual_: &Client) -> BTreeMap<String, String> {
    let mut uids = BTreeMap::new();
    for i in 0..CARS {
        let name = format!("car-{i}");
        let car = apply(
            virtual_,
            &cars(),
            Some(VIRTUAL_NS),
            json!({
                "apiVersion": "example.loft.sh/v1", "kind": "Car",
                "metadata": {"name": name, "namespace": VIRTUAL_NS},
                "spec": {"type": "BMW", "seats": i}
            }),
        )
        .await;
        uids.insert(name, car.uid().expect("uid"));
    }
    uids
}

/// Host copies by virtual name: (host uid, `object-uid` annotation).
async fn host_copies(host: &Client) -> BTreeMap<String, (String, String)> {
    let api = Api::<DynamicObject>::namespaced_with(host.clone(), NS, &cars());
    let Ok(list) = api.list(&Default::default()).await else {
        return BTreeMap::new();
    };
    list.items
        .iter()
        .filter_map(|c| {
            let name = c.annotations().get("vcluster.loft.sh/object-name")?.clone();
            let object_uid = c.annotations().get("vcluster.loft.sh/object-uid")?.clone();
            Some((name, (c.uid()?, object_uid)))
        })
        .collect()
}

/// Waits until every virtual Car has a host copy carrying its uid; returns the host copies.
async fn converged(
    host: &Client,
    virtual_uids: &BTreeMap<String, String>,
) -> BTreeMap<String, (String, String)> {
    wait_for(TIMEOUT, || async move {
        let copies = host_copies(host).await;
        (copies.len() == virtual_uids.len()
            && virtual_uids
                .iter()
                .all(|(name, uid)| copies.get(name).is_some_and(|(_, o)| o == uid)))
        .then_some(copies)
    })
    .await
}

async fn runtime_healthy(host: &Client, status: &str, reason: Option<&str>) -> String {
    let plugins: Api<VClusterPlugin> = Api::namespaced(host.clone(), NS);
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let p = plugins.get("car-plugin").await.ok()?;
            let c = vcp_tests::condition(&p, "RuntimeHealthy")?;
            (c.status == status && reason.is_none_or(|r| c.reason == r))
                .then(|| format!("{} {}: {}", c.status, c.reason, c.message))
        }
    })
    .await
}

async fn delete_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete(CRD, &DeleteParams::default())
        .await
        .expect("delete the Car CRD");
    wait_for(TIMEOUT, || {
        let crds = crds.clone();
        async move { crds.get_opt(CRD).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

/// Writes to Cars by the runtime on `cluster` from audit event `from` on: (verb, code, name).
fn runtime_car_writes(
    cp: &ControlPlane,
    cluster: Cluster,
    from: usize,
) -> Vec<(String, u16, String)> {
    vcp_tests::audited_write_events(cp, cluster)
        .expect("audit log")
        .into_iter()
        .skip(from)
        .filter(|w| w.user == Identity::Syncer.user() && w.uri.contains("/cars"))
        .map(|w| (w.verb, w.code, w.object_name))
        .collect()
}

fn audit_len(cp: &ControlPlane, cluster: Cluster) -> usize {
    vcp_tests::audited_write_events(cp, cluster)
        .expect("audit log")
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_type_keeps_its_host_copies_and_resumes() {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    vcp_tests::install_crds(&host).await;
    vcp_tests::install_crds(&virtual_).await;
    vcp_tests::create_namespace(&host, NS).await;
    vcp_tests::create_namespace(&virtual_, VIRTUAL_NS).await;
    // The runtime's identity is admin in both clusters here (RBAC is not the subject; in a
    // vCluster its virtual kubeconfig is admin too).
    for client in [&host, &virtual_] {
        vcp_tests::runtime::syncer_is_cluster_admin(client).await;
    }
    let services =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Service"), "services");
    apply(&host, &services, Some(NS), json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": VCLUSTER, "namespace": NS},
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}]}
    }))
    .await;
    let plugins = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("vcp.dev", "v1alpha1", "VClusterPlugin"),
        "vclusterplugins",
    );
    apply(
        &host,
        &plugins,
        Some(NS),
        json!({
            "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
            "metadata": {"name": "car-plugin", "namespace": NS},
            "spec": {
                "vcluster": {"name": VCLUSTER},
                "syncedTypes": [{"apiVersion": "example.loft.sh/v1", "kind": "Car"}]
            }
        }),
    )
    .await;

    let binary = runtime_binary();
    let log = cp.dir().join("vanish-runtime.log");
    let child = Command::new(&binary)
        .args(["--host-kubeconfig"])
        .arg(cp.kubeconfig(Cluster::Host, Identity::Syncer))
        .arg("--virtual-kubeconfig")
        .arg(cp.kubeconfig(Cluster::Virtual, Identity::Syncer))
        .args(["--namespace", NS, "--plugin", "car-plugin"])
        // (the environment variable of `--retry-max-seconds`)
        .env(
            "VCLUSTER_PLUGIN_RETRY_MAX_SECONDS",
            (RETRY_MAX_MS / 1000).to_string(),
        )
        .env("RUST_LOG", "info")
        .stdout(std::fs::File::create(&log).expect("log file"))
        .stderr(std::fs::File::create(cp.dir().join("vanish-runtime.stderr")).expect("stderr file"))
        .stdin(Stdio::null())
        .spawn()
        .expect("start vcluster-plugin-syncer");
    // stdout and stderr apart: the runtime logs to stderr; read both below
    let runtime = Runtime {
        child,
        log: cp.dir().join("vanish-runtime.stderr"),
    };
    let stdout_log = log;

    // 10 Cars in sync
    let first_uids = put_cars(&virtual_).await;
    let before = converged(&host, &first_uids).await;
    println!(
        "{} host copies in sync; {}",
        before.len(),
        runtime_healthy(&host, "True", None).await
    );

    // 1. The virtual CRD goes (and every virtual Car with it).
    let host_audit = audit_len(cp, Cluster::Host);
    let lines_before = log_lines(&runtime.log).len();
    let started = Instant::now();
    delete_crd(&virtual_).await;
    println!(
        "fault: CustomResourceDefinition {CRD} deleted in the virtual cluster ({CARS} virtual Cars with it)"
    );
    let report = runtime_healthy(&host, "False", Some("TypeUnavailable")).await;
    println!(
        "reported after {:.1} s: RuntimeHealthy={report}",
        started.elapsed().as_secs_f64()
    );
    // the watch retries grow to the cap: 0.5, 1, 2, 4, 4 s between 6 failures
    let retries = wait_for(TIMEOUT, || async {
        let r = watch_retries(&runtime.log, "virtual", lines_before);
        (r.len() >= 6).then_some(r)
    })
    .await;
    assert_capped_exponential("virtual watch", &retries);
    let kept = host_copies(&host).await;
    assert_eq!(
        kept, before,
        "host copies changed while the virtual type was gone"
    );
    // the runtime looked at each vanished Car and kept its host copy
    wait_for(TIMEOUT, || async {
        log_lines(&runtime.log)
            .iter()
            .skip(lines_before)
            .any(|l| l["fields"]["message"] == "synced type vanished, keeping its host copies")
            .then_some(())
    })
    .await;
    let writes = runtime_car_writes(cp, Cluster::Host, host_audit);
    assert!(
        writes.is_empty(),
        "host Car writes while the type was gone: {writes:?}"
    );
    println!(
        "{} host copies kept with their uids; 0 host writes in {:.1} s",
        kept.len(),
        started.elapsed().as_secs_f64()
    );

    // The CRD and the Cars come back: the host copies are adopted, not re-created.
    let back = Instant::now();
    vcp_tests::install_crds(&virtual_).await;
    let second_uids = put_cars(&virtual_).await;
    assert!(
        second_uids.iter().all(|(n, u)| first_uids[n] != *u),
        "re-created Cars have new uids"
    );
    let adopted = converged(&host, &second_uids).await;
    for (name, (host_uid, _)) in &adopted {
        assert_eq!(
            host_uid, &before[name].0,
            "host copy of {name} was re-created"
        );
    }
    runtime_healthy(&host, "True", None).await;
    let writes = runtime_car_writes(cp, Cluster::Host, host_audit);
    let verbs: BTreeSet<&str> = writes.iter().map(|w| w.0.as_str()).collect();
    assert!(
        !verbs.contains("create") && !verbs.contains("delete"),
        "host creates or deletes after the type came back: {writes:?}"
    );
    println!(
        "virtual type back: {} host copies adopted in {:.1} s ({} host patches, 0 creates, 0 deletes), RuntimeHealthy=True",
        adopted.len(),
        back.elapsed().as_secs_f64(),
        writes.len()
    );

    // 2. The host CRD goes (and every host copy with it).
    let virtual_audit = audit_len(cp, Cluster::Virtual);
    let host_audit = audit_len(cp, Cluster::Host);
    let lines_before = log_lines(&runtime.log).len();
    let started = Instant::now();
    delete_crd(&host).await;
    println!(
        "fault: CustomResourceDefinition {CRD} deleted on the host ({CARS} host copies with it)"
    );
    let report = runtime_healthy(&host, "False", Some("TypeUnavailable")).await;
    println!(
        "reported after {:.1} s: RuntimeHealthy={report}",
        started.elapsed().as_secs_f64()
    );
    let retries = wait_for(TIMEOUT, || async {
        let r = watch_retries(&runtime.log, "host", lines_before);
        (r.len() >= 6).then_some(r)
    })
    .await;
    assert_capped_exponential("host watch", &retries);
    let back = Instant::now();
    vcp_tests::install_crds(&host).await;
    converged(&host, &second_uids).await;
    runtime_healthy(&host, "True", None).await;
    let creates: Vec<String> = runtime_car_writes(cp, Cluster::Host, host_audit)
        .into_iter()
        .filter(|(verb, code, _)| verb == "create" && *code == 201)
        .map(|(_, _, name)| name)
        .collect();
    let unique: BTreeSet<&String> = creates.iter().collect();
    assert_eq!(creates.len(), CARS, "host creates: {creates:?}");
    assert_eq!(unique.len(), CARS, "a host copy created twice: {creates:?}");
    assert!(
        unique
            .iter()
            .all(|n| n.ends_with(&format!("-x-{VIRTUAL_NS}-x-{VCLUSTER}")))
    );
    let virtual_writes = runtime_car_writes(cp, Cluster::Virtual, virtual_audit);
    assert!(
        virtual_writes.is_empty(),
        "virtual Car writes: {virtual_writes:?}"
    );
    let virtual_cars = Api::<DynamicObject>::namespaced_with(virtual_.clone(), VIRTUAL_NS, &cars());
    for (name, uid) in &second_uids {
        let car = virtual_cars.get(name).await.expect("virtual Car kept");
        assert_eq!(car.uid().as_ref(), Some(uid));
    }
    println!(
        "host type back: {CARS} host copies created once each in {:.1} s; 0 virtual Car writes",
        back.elapsed().as_secs_f64()
    );

    // 3. Every log line is one JSON object with exactly one `message`.
    drop(runtime);
    let lines = log_lines(&cp.dir().join("vanish-runtime.stderr"));
    let stdout_lines = log_lines(&stdout_log);
    for line in lines.iter().chain(&stdout_lines) {
        let messages = line["fields"]
            .as_object()
            .map_or(0, |f| usize::from(f.contains_key("message")))
            + usize::from(line.get("message").is_some());
        assert_eq!(messages, 1, "log line without exactly one message: {line}");
    }
    let warnings = lines.iter().filter(|l| l["level"] == "WARN").count();
    println!(
        "{} runtime log lines ({warnings} warnings) are JSON objects with one message key each",
        lines.len() + stdout_lines.len()
    );
}

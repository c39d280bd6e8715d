//! `scripts/bench sync references` (`BENCH_SYNC_MODE=references`): the runtime with references
//! and objects that come back, on cert-manager's shapes.
//!
//! The types are cert-manager's `Issuer` and `Certificate` (the stand-in CRDs of
//! `tests/fixtures/import/cert-manager-crds.yaml`: cert-manager's names, group, version, scope
//! and status subresource, an open schema), on both API servers. The plugin is the common
//! cert-manager example (`config/samples/cert-manager.yaml`): two `reference` patches
//! (`spec.secretName` → Secret, `spec.issuerRef.name` → Issuer) and the produced Secret. The
//! bench plays cert-manager: a watch of the host's Certificates that creates, for each, the
//! Secret its (translated) `spec.secretName` names, a `kubernetes.io/tls` Secret of the size of
//! a real one.
//!
//! (a) floor: the same writes sent directly by one client at the runtime's worker count, with
//!     the same cert-manager stand-in and the same observing watches: each host Certificate as
//!     the runtime writes it (the runtime's own translator, `NamespacedTranslator::host_object`,
//!     with the two references replaced by their host names), and, as each host Secret appears,
//!     its copy in the virtual namespace under the virtual name (`FromHostTranslator`). The
//!     clock stops when the virtual watch has seen the last Secret.
//! (b) sync: `BENCH_OBJECTS` (default 2,000) virtual Certificates (one virtual Issuer made
//!     before the clock), until the virtual watch has seen every Secret come back;
//!     `refs_ratio` = sync / floor (wall time); `refs_runtime_cpu_ms_per_object` = the runtime
//!     process's CPU time / objects; `refs_machine_cpu_ratio` = the whole machine's busy CPU
//!     time in the sync / in the floor (what the runtime costs beyond the same writes);
//! (c) expressions: the plugin gains an `expression` patch (`spec.commonName`,
//!     `value.toUpperCase()`); the runtime restarts, converges the existing copies (not
//!     measured), then the same number of Certificates in a second virtual namespace;
//!     `expression_cpu_ms_per_object` = (the runtime's CPU per object in (c) − in (b)): the
//!     cost of one expression evaluated per object, with everything else the same.
//!
//! One run of each phase (the sync bench has no `BENCH_RUNS` median: its record runs are
//! repeated by hand on a quiet machine).
//!
//! Last line: `refs_ratio=<x> refs_machine_cpu_ratio=<x> refs_runtime_cpu_ms_per_object=<x>
//! refs_floor_machine_cpu_ms_per_object=<x> expression_cpu_ms_per_object=<x> objects=<n>`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_syncer_runtime::translate::{FromHostTranslator, NamespacedTranslator, host_name};
use vcp_tests::{Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, cpu};

use super::{HOST_NS, Seen, VCLUSTER, WORKERS, env_usize, processes, start_syncer, wait_count};

/// Virtual namespaces of the sync (b) and expression (c) phases, and the floor's namespace (the
/// same name on both sides).
const SYNC_NS: &str = "bench";
const EXPRESSION_NS: &str = "bench-expr";
const FLOOR_NS: &str = "floor";
/// The virtual Issuer every Certificate names.
const ISSUER: &str = "bench-issuer";
/// How long a phase may take before the bench says what is missing.
const PHASE_TIMEOUT: Duration = Duration::from_secs(900);

fn certificates() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"),
        "certificates",
    )
}

fn issuers() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cert-manager.io", "v1", "Issuer"),
        "issuers",
    )
}

fn secrets() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Secret"), "secrets")
}

fn certificate(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
        "metadata": {"name": name, "labels": {"bench": "yes"}},
        "spec": {
            "secretName": format!("{name}-tls"),
            "commonName": format!("{name}.example.com"),
            "dnsNames": [format!("{name}.example.com")],
            "issuerRef": {"name": ISSUER, "kind": "Issuer", "group": "cert-manager.io"}
        }
    }))
    .expect("certificate")
}

fn issuer() -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
        "metadata": {"name": ISSUER},
        "spec": {"selfSigned": {}}
    }))
    .expect("issuer")
}

/// The plugin of the cert-manager example, plus `extra` patches on the Certificate.
fn plugin(extra: &[Value]) -> VClusterPlugin {
    let mut patches = vec![
        json!({"path": "spec.secretName", "reference": {"apiVersion": "v1", "kind": "Secret"}}),
        json!({"path": "spec.issuerRef.name", "reference": {"apiVersion": "cert-manager.io/v1", "kind": "Issuer"}}),
    ];
    patches.extend(extra.iter().cloned());
    serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": {"name": "bench", "namespace": HOST_NS},
        "spec": {"vcluster": {"name": VCLUSTER}, "syncedTypes": [
            {"apiVersion": "cert-manager.io/v1", "kind": "Issuer"},
            {"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "syncStatus": true,
             "patches": patches,
             "produced": [{"apiVersion": "v1", "kind": "Secret", "namePath": "spec.secretName"}]}
        ]}
    }))
    .expect("plugin")
}

/// The host Certificate the runtime writes for [`certificate`]`(name)` in virtual namespace
/// `vns`, into host namespace `host_ns`: the runtime's translator, the two references replaced
/// by their host names (vCluster's `<name>-x-<namespace>-x-<vcluster>`).
fn host_certificate(name: &str, vns: &str, host_ns: &str) -> DynamicObject {
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut v = certificate(name);
    v.metadata.namespace = Some(vns.into());
    let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    v.metadata.uid = Some(format!("7c2e1d0b-3a4f-4b6c-8d9e-{serial:012x}"));
    let mut host =
        NamespacedTranslator::new(VCLUSTER, host_ns, "cert-manager.io/v1", "Certificate")
            .host_object(&v);
    host.data["spec"]["secretName"] = json!(host_name(&format!("{name}-tls"), vns, VCLUSTER));
    host.data["spec"]["issuerRef"]["name"] = json!(host_name(ISSUER, vns, VCLUSTER));
    host
}

/// cert-manager's place: watches the Certificates of host namespace `ns` and creates, for each,
/// the `kubernetes.io/tls` Secret named by its `spec.secretName` (a 2 KiB certificate and key,
/// the size of a real RSA-2048 pair in PEM).
fn play_cert_manager(host: Client, ns: &'static str) {
    let certs = Api::<DynamicObject>::namespaced_with(host.clone(), ns, &certificates());
    let secrets_api = Api::<DynamicObject>::namespaced_with(host, ns, &secrets());
    let pem = "A".repeat(1_400);
    tokio::spawn(async move {
        let events = watcher(certs, watcher::Config::default())
            .default_backoff()
            .applied_objects();
        let issued: Arc<Mutex<std::collections::HashSet<String>>> = Arc::default();
        events
            .for_each_concurrent(WORKERS, |event| {
                let secrets_api = secrets_api.clone();
                let issued = issued.clone();
                let pem = pem.clone();
                async move {
                    let Ok(cert) = event else { return };
                    let Some(name) = cert.data["spec"]["secretName"].as_str().map(String::from)
                    else {
                        return;
                    };
                    if !issued.lock().unwrap().insert(name.clone()) {
                        return;
                    }
                    let secret: DynamicObject = serde_json::from_value(json!({
                        "apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": name, "annotations": {
                            "cert-manager.io/certificate-name": cert.name_any(),
                            "cert-manager.io/issuer-name": cert.data["spec"]["issuerRef"]["name"],
                        }},
                        "type": "kubernetes.io/tls",
                        "stringData": {"tls.crt": pem, "tls.key": pem, "ca.crt": ""}
                    }))
                    .expect("secret");
                    match secrets_api.create(&PostParams::default(), &secret).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 409 => {}
                        Err(e) => eprintln!("cert-manager stand-in: create Secret {name}: {e}"),
                    }
                }
            })
            .await;
    });
}

/// The bench's watch of the Secrets of virtual namespace `ns`: name → first seen.
fn watch_virtual_secrets(client: Client, ns: &str) -> Seen {
    super::watch_named(Api::namespaced_with(client, ns, &secrets()))
}

/// Waits until `seen` holds `n` names starting with `prefix`, or panics after
/// [`PHASE_TIMEOUT`] naming the phase.
async fn wait_phase(seen: &Seen, prefix: &str, n: usize, phase: &str) -> Instant {
    tokio::time::timeout(PHASE_TIMEOUT, wait_count(seen, prefix, n))
        .await
        .unwrap_or_else(|_| {
            let have = seen
                .lock()
                .unwrap()
                .keys()
                .filter(|k| k.starts_with(prefix))
                .count();
            panic!(
                "{phase}: {have} of {n} Secrets came back within {PHASE_TIMEOUT:?} (does the runtime implement `produced`?)"
            )
        })
}

/// Creates `make(name)` for each of `names` in `api`, `concurrency` at a time.
async fn create_each(
    api: &Api<DynamicObject>,
    names: &[String],
    concurrency: usize,
    make: impl Fn(&str) -> DynamicObject,
) {
    let make = &make;
    stream::iter(names)
        .for_each_concurrent(concurrency, |name| async move {
            if let Err(e) = api.create(&PostParams::default(), &make(name)).await {
                panic!("create {name}: {e}");
            }
        })
        .await;
}

/// The floor's way back: as each host Secret of `host_ns` appears, its virtual copy (under the
/// virtual name of `virtual_names`, keyed by host name) is created in virtual namespace `vns`,
/// [`WORKERS`] at a time.
fn floor_bring_back(
    host: Client,
    virtual_: Client,
    host_ns: &'static str,
    vns: &'static str,
    virtual_names: HashMap<String, String>,
) {
    let host_secrets = Api::<DynamicObject>::namespaced_with(host, host_ns, &secrets());
    let virtual_secrets = Api::<DynamicObject>::namespaced_with(virtual_, vns, &secrets());
    let translator = FromHostTranslator::new(host_ns, "v1", "Secret");
    tokio::spawn(async move {
        let events = watcher(host_secrets, watcher::Config::default())
            .default_backoff()
            .applied_objects();
        let done: Arc<Mutex<std::collections::HashSet<String>>> = Arc::default();
        let virtual_names = &virtual_names;
        let translator = &translator;
        events
            .for_each_concurrent(WORKERS, |event| {
                let virtual_secrets = virtual_secrets.clone();
                let done = done.clone();
                async move {
                    let Ok(host) = event else { return };
                    let Some(vname) = virtual_names.get(&host.name_any()) else {
                        return;
                    };
                    if !done.lock().unwrap().insert(vname.clone()) {
                        return;
                    }
                    let mut copy = translator.virtual_object(&host, (vns, vname), None);
                    copy.metadata.resource_version = None;
                    copy.metadata.uid = None;
                    copy.metadata.managed_fields = None;
                    copy.metadata.creation_timestamp = None;
                    if let Err(e) = virtual_secrets.create(&PostParams::default(), &copy).await {
                        eprintln!("floor: create virtual Secret {vname}: {e}");
                    }
                }
            })
            .await;
    });
}

/// Sets the bench plugin's spec.
async fn set_plugin(host: &Client, plugin: &VClusterPlugin) {
    Api::<VClusterPlugin>::namespaced(host.clone(), HOST_NS)
        .patch(
            "bench",
            &PatchParams::apply(TEST_FIELD_MANAGER).force(),
            &Patch::Apply(plugin),
        )
        .await
        .expect("plugin");
}

/// Creates the virtual Issuer in `vns` and waits until its host copy exists.
async fn issuer_synced(host: &Client, virtual_: &Client, vns: &str) {
    Api::<DynamicObject>::namespaced_with(virtual_.clone(), vns, &issuers())
        .create(&PostParams::default(), &issuer())
        .await
        .expect("virtual issuer");
    let host_issuers = Api::<DynamicObject>::namespaced_with(host.clone(), HOST_NS, &issuers());
    let name = host_name(ISSUER, vns, VCLUSTER);
    vcp_tests::wait_for(Duration::from_secs(60), || {
        let api = host_issuers.clone();
        let name = name.clone();
        async move { api.get_opt(&name).await.ok().flatten().map(|_| ()) }
    })
    .await;
}

/// One measured sync phase: `n` Certificates created in virtual namespace `vns` until their
/// Secrets came back; returns (wall time, the runtime's CPU seconds, the machine's busy CPU
/// seconds).
async fn sync_phase(
    cp: &ControlPlane,
    virtual_: &Client,
    runtime_pid: u32,
    vns: &str,
    n: usize,
    phase: &str,
) -> (Duration, f64, f64) {
    let seen = watch_virtual_secrets(virtual_.clone(), vns);
    tokio::time::sleep(Duration::from_secs(1)).await; // the watch has listed
    let names: Vec<String> = (0..n).map(|i| format!("cert-{i}")).collect();
    let api = Api::<DynamicObject>::namespaced_with(virtual_.clone(), vns, &certificates());
    let procs = processes(cp, Some(runtime_pid));
    let cpu0 = cpu::snapshot(&procs);
    let start = Instant::now();
    create_each(&api, &names, WORKERS, certificate).await;
    let last = wait_phase(&seen, "cert-", n, phase).await;
    let took = last.duration_since(start);
    let used = cpu::report(phase, &cpu0, &cpu::snapshot(&procs));
    eprintln!(
        "{phase}: {n} virtual Certificates, every Secret back in the virtual namespace after {took:?}"
    );
    (took, used["runtime"], used["machine"])
}

/// The references mode (module docs).
pub async fn run() {
    let n = env_usize("BENCH_OBJECTS", 2_000);
    let cp = ControlPlane::start().expect("control plane");
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    let stand_ins = std::fs::read_to_string(
        vcp_tests::repo_root().join("tests/fixtures/import/cert-manager-crds.yaml"),
    )
    .expect("the stand-in CRDs");
    for client in [&host, &virtual_] {
        vcp_tests::install_crds(client).await;
        vcp_tests::apply_yaml(client, &stand_ins, None)
            .await
            .expect("apply the stand-in CRDs");
        let api = Api::<DynamicObject>::all_with(client.clone(), &certificates());
        vcp_tests::wait_for(Duration::from_secs(30), || {
            let api = api.clone();
            async move {
                api.list_metadata(&Default::default())
                    .await
                    .ok()
                    .map(|_| ())
            }
        })
        .await;
    }
    vcp_tests::create_namespace(&host, HOST_NS).await;
    vcp_tests::create_namespace(&host, FLOOR_NS).await;
    for ns in [SYNC_NS, EXPRESSION_NS, FLOOR_NS] {
        vcp_tests::create_namespace(&virtual_, ns).await;
    }
    super::bind_syncer(&host, &virtual_).await;
    play_cert_manager(host.clone(), HOST_NS);
    play_cert_manager(host.clone(), FLOOR_NS);

    // (a) floor
    let names: Vec<String> = (0..n).map(|i| format!("cert-{i}")).collect();
    let virtual_names: HashMap<String, String> = names
        .iter()
        .map(|c| {
            (
                host_name(&format!("{c}-tls"), FLOOR_NS, VCLUSTER),
                format!("{c}-tls"),
            )
        })
        .collect();
    floor_bring_back(
        host.clone(),
        virtual_.clone(),
        FLOOR_NS,
        FLOOR_NS,
        virtual_names,
    );
    let floor_seen = watch_virtual_secrets(virtual_.clone(), FLOOR_NS);
    let floor_certs =
        Api::<DynamicObject>::namespaced_with(host.clone(), FLOOR_NS, &certificates());
    tokio::time::sleep(Duration::from_secs(1)).await; // the watches have listed
    let procs = processes(&cp, None);
    let cpu0 = cpu::snapshot(&procs);
    let start = Instant::now();
    create_each(&floor_certs, &names, WORKERS, |c| {
        host_certificate(c, FLOOR_NS, FLOOR_NS)
    })
    .await;
    let floor = wait_phase(&floor_seen, "cert-", n, "floor")
        .await
        .duration_since(start);
    let floor_cpu = cpu::report("floor", &cpu0, &cpu::snapshot(&procs));
    eprintln!(
        "floor: {n} host Certificates and their Secrets' virtual copies, the last seen after {floor:?}"
    );

    // (b) sync with references and the produced Secret
    set_plugin(&host, &plugin(&[])).await;
    let syncer = start_syncer(&cp);
    tokio::time::sleep(Duration::from_secs(3)).await; // the runtime lists and is idle
    issuer_synced(&host, &virtual_, SYNC_NS).await;
    let (synced, runtime_cpu, machine_cpu) =
        sync_phase(&cp, &virtual_, syncer.id(), SYNC_NS, n, "sync").await;
    syncer.stop();

    // (c) the same with one expression patch more
    set_plugin(
        &host,
        &plugin(&[json!({"path": "spec.commonName", "expression": "value.toUpperCase()"})]),
    )
    .await;
    let syncer = start_syncer(&cp);
    // converge the existing copies first (their commonName changes), then idle
    let host_certs = Api::<DynamicObject>::namespaced_with(host.clone(), HOST_NS, &certificates());
    tokio::time::timeout(PHASE_TIMEOUT, async {
        loop {
            let list = host_certs.list(&Default::default()).await.expect("list");
            let upper = list
                .items
                .iter()
                .filter(|c| {
                    c.data["spec"]["commonName"]
                        .as_str()
                        .is_some_and(|s| s.starts_with("CERT-"))
                })
                .count();
            if upper >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .expect(
        "the expression reached the existing host copies (does the runtime evaluate `expression`?)",
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    issuer_synced(&host, &virtual_, EXPRESSION_NS).await;
    let (_, runtime_cpu_expr, _) = sync_phase(
        &cp,
        &virtual_,
        syncer.id(),
        EXPRESSION_NS,
        n,
        "sync with an expression",
    )
    .await;
    syncer.stop();

    let ratio = synced.as_secs_f64() / floor.as_secs_f64();
    let machine_ratio = machine_cpu / floor_cpu["machine"];
    let per = |s: f64| s * 1000.0 / n as f64;
    let expression = per(runtime_cpu_expr) - per(runtime_cpu);
    eprintln!(
        "references: sync {synced:?} vs floor {floor:?} (ratio {ratio:.2}); runtime CPU {:.3} ms per object; machine CPU {machine_cpu:.1} s vs {:.1} s in the floor (ratio {machine_ratio:.2}); one expression patch: {expression:.3} ms of runtime CPU per object",
        per(runtime_cpu),
        floor_cpu["machine"]
    );
    println!(
        "refs_ratio={ratio:.2} refs_machine_cpu_ratio={machine_ratio:.2} refs_runtime_cpu_ms_per_object={:.3} refs_floor_machine_cpu_ms_per_object={:.3} expression_cpu_ms_per_object={expression:.3} objects={n}",
        per(runtime_cpu),
        per(floor_cpu["machine"])
    );
}

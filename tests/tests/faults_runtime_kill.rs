//! The runtime killed between a host create and its status report, end to end on real API
//! servers with the runtime binary (`vcluster-plugin-syncer`) as a process.
//!
//! The test-only fault point (`vcp_crds::fault`) with `VCP_FAULT_WRITES_MATCHING=/apis/example.loft.sh/` ends
//! the process right after its first successful host Car create, before the runtime has even
//! seen the answer, so no status report can count that copy: once by `abort()` (SIGABRT),
//! once frozen (`VCP_FAULT_STOP_AFTER_WRITES`) and then killed by a real SIGKILL. A fresh
//! runtime then must not create the copy again (audit log: one create), must adopt it as its
//! own and report it (`syncedObjects`), and the host copy and the status must equal those of
//! an uninterrupted run in the same test.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use vcp_crds::{Car, VClusterPlugin};
use vcp_tests::{
    Audit, Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, exit_signal, wait_for,
};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The runtime binary as a process, killed on drop.
struct Runtime {
    child: Child,
}

impl Runtime {
    /// Runs the plugin `cars` of host namespace `host_ns` as `vcp-syncer`, with the fault
    /// point's variables `fault`.
    fn start(host_ns: &str, fault: &[(&str, &str)]) -> Runtime {
        let cp = ControlPlane::shared();
        let binary = vcp_tests::workspace_binary("vcp-syncer-runtime", "vcluster-plugin-syncer");
        let log = cp.dir().join(format!(
            "runtime-{host_ns}-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis()
        ));
        let mut command = Command::new(binary);
        command
            .arg("--host-kubeconfig")
            .arg(cp.kubeconfig(Cluster::Host, Identity::Syncer))
            .arg("--virtual-kubeconfig")
            .arg(cp.kubeconfig(Cluster::Virtual, Identity::Syncer))
            .args(["--namespace", host_ns, "--plugin", "cars"])
            .env("RUST_LOG", "info")
            .env_remove("VCP_FAULT_ABORT_AFTER_WRITES")
            .env_remove("VCP_FAULT_STOP_AFTER_WRITES")
            .env_remove("VCP_FAULT_WRITES_MATCHING")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("runtime log"));
        for (k, v) in fault {
            command.env(k, v);
        }
        Runtime {
            child: command.spawn().expect("start vcluster-plugin-syncer"),
        }
    }

    fn stopped(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
            .unwrap_or(false)
    }

    /// Waits (blocking) for the process to end by itself, or, with `kill_when_stopped`, to
    /// freeze, then SIGKILLs it; its exit status.
    fn wait_death(&mut self, kill_when_stopped: bool) -> Option<ExitStatus> {
        let deadline = Instant::now() + TIMEOUT;
        while Instant::now() < deadline {
            if kill_when_stopped && self.stopped() {
                let _ = self.child.kill();
                return self.child.wait().ok();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The plugin `cars` in `host_ns`, syncing the Cars labelled `case=<case>`; the virtual
/// namespace `case` with one such Car, `audi`.
async fn prepare(host: &Client, virtual_: &Client, case: &str) -> Car {
    let host_ns = format!("rk-{case}");
    vcp_tests::create_namespace(host, &host_ns).await;
    vcp_tests::create_namespace(virtual_, case).await;
    let plugin: VClusterPlugin = serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": {"name": "cars", "namespace": host_ns},
        "spec": {
            "vcluster": {"name": "my-vcluster"},
            "syncedTypes": [{"apiVersion": "example.loft.sh/v1", "kind": "Car",
                             "selector": {"matchLabels": {"case": case}}}]
        }
    }))
    .expect("plugin");
    Api::<VClusterPlugin>::namespaced(host.clone(), &host_ns)
        .patch(
            "cars",
            &PatchParams::apply(TEST_FIELD_MANAGER).force(),
            &Patch::Apply(&plugin),
        )
        .await
        .expect("apply the plugin");
    let car: Car = serde_json::from_value(json!({
        "apiVersion": "example.loft.sh/v1", "kind": "Car",
        "metadata": {"name": "audi", "labels": {"case": case}},
        "spec": {"type": "Audi", "seats": 4}
    }))
    .expect("car");
    Api::<Car>::namespaced(virtual_.clone(), case)
        .create(&PostParams::default(), &car)
        .await
        .expect("create the virtual Car")
}

/// The host copy's name.
fn host_name(case: &str) -> String {
    format!("audi-x-{case}-x-my-vcluster")
}

/// The runtime's (`vcp-syncer`) successful writes in host namespace `rk-<case>`, as
/// `(verb, path)`, once the audit log holds every request answered before the call.
async fn runtime_writes(case: &str) -> Vec<(String, String)> {
    Audit::writes()
        .by(Identity::Syncer)
        .in_namespace(&format!("rk-{case}"))
        .caught_up()
        .await
        .succeeded()
        .into_iter()
        .map(|w| {
            (
                w.verb,
                w.uri.split('?').next().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Waits until the plugin of `case` reports 1 synced Car; its status and the host copy,
/// normalized (server-set fields out, the case's names replaced by `CASE`).
async fn converged(host: &Client, case: &str) -> Value {
    let host_ns = format!("rk-{case}");
    let plugins = Api::<VClusterPlugin>::namespaced(host.clone(), &host_ns);
    let status = wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("cars").await.ok()?.status?;
            let cars = status.synced_objects.iter().find(|o| o.kind == "Car")?;
            (cars.count == 1).then_some(status)
        }
    })
    .await;
    let copy = Api::<Car>::namespaced(host.clone(), &host_ns)
        .get(&host_name(case))
        .await
        .expect("the host copy");
    let mut value = json!({
        "syncedObjects": status.synced_objects,
        "conditions": status.conditions.iter()
            .filter(|c| c.type_ == "RuntimeHealthy")
            .map(|c| json!({"status": c.status, "reason": c.reason}))
            .collect::<Vec<_>>(),
        "copy": serde_json::to_value(&copy).expect("json"),
    });
    if let Some(meta) = value
        .pointer_mut("/copy/metadata")
        .and_then(Value::as_object_mut)
    {
        for field in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "generation",
            "managedFields",
            "ownerReferences",
        ] {
            meta.remove(field);
        }
        // The virtual uid differs per case; that it is the live one is checked apart.
        if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            annotations.remove("vcluster.loft.sh/object-uid");
        }
    }
    serde_json::from_str(&value.to_string().replace(case, "CASE")).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_killed_between_a_host_create_and_its_status_report_creates_once() {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    for client in [&host, &virtual_] {
        vcp_tests::install_crds(client).await;
        vcp_tests::runtime::syncer_is_cluster_admin(client).await;
    }

    // The reference: an uninterrupted run.
    prepare(&host, &virtual_, "ref").await;
    let reference_run = Runtime::start("rk-ref", &[]);
    let reference = converged(&host, "ref").await;
    drop(reference_run);
    let reference_creates = runtime_writes("ref")
        .await
        .iter()
        .filter(|(verb, _)| verb == "create")
        .count();
    assert_eq!(
        reference_creates, 1,
        "the reference run creates the copy once"
    );

    for (case, stop) in [("abort", false), ("sigkill", true)] {
        let virtual_car = prepare(&host, &virtual_, case).await;
        let host_ns = format!("rk-{case}");
        let setting = if stop {
            "VCP_FAULT_STOP_AFTER_WRITES"
        } else {
            "VCP_FAULT_ABORT_AFTER_WRITES"
        };
        let mut faulted = Runtime::start(
            &host_ns,
            &[
                (setting, "1"),
                ("VCP_FAULT_WRITES_MATCHING", "/apis/example.loft.sh/"),
            ],
        );
        let status = tokio::task::spawn_blocking(move || {
            let status = faulted.wait_death(stop);
            (faulted, status)
        })
        .await
        .expect("wait");
        let status = status
            .1
            .expect("the runtime died after its first host Car create");
        assert_eq!(
            exit_signal(&status),
            Some(if stop { 9 } else { 6 }),
            "{case}: how it died"
        );
        // The API server's audit log may trail its answers by a moment.
        let at_death = wait_for(TIMEOUT, || async {
            let writes = runtime_writes(case).await;
            writes
                .iter()
                .any(|(verb, _)| verb == "create")
                .then_some(writes)
        })
        .await;
        let create = at_death
            .iter()
            .position(|(verb, path)| verb == "create" && path.ends_with("/cars"))
            .expect("the host create");
        let reports_after: Vec<_> = at_death[create + 1..].to_vec();
        assert!(
            reports_after.is_empty(),
            "{case}: nothing after the host create: {reports_after:?}"
        );
        let reported = Api::<VClusterPlugin>::namespaced(host.clone(), &host_ns)
            .get("cars")
            .await
            .expect("plugin")
            .status
            .and_then(|s| {
                s.synced_objects
                    .iter()
                    .find(|o| o.kind == "Car")
                    .map(|o| o.count)
            });
        assert_ne!(reported, Some(1), "{case}: the copy was never reported");

        let restarted = Instant::now();
        let _resumed = Runtime::start(&host_ns, &[]);
        let state = converged(&host, case).await;
        let took = restarted.elapsed();
        let writes = runtime_writes(case).await;
        let creates = writes.iter().filter(|(verb, _)| verb == "create").count();
        let deletes = writes.iter().filter(|(verb, _)| verb == "delete").count();
        println!(
            "runtime {case}: killed after its host create (write {} of {}; status reported then: \
             {reported:?}); restarted, it reported the copy {:.1} s later; {} writes in all: {} \
             host create(s), {} delete(s)",
            create + 1,
            at_death.len(),
            took.as_secs_f64(),
            writes.len(),
            creates,
            deletes
        );
        assert_eq!(
            creates, 1,
            "{case}: the host copy is created once: {writes:?}"
        );
        assert_eq!(deletes, 0, "{case}: nothing deleted: {writes:?}");
        assert_eq!(
            state, reference,
            "{case}: the host copy and the status equal the uninterrupted run's"
        );
        let copy = Api::<Car>::namespaced(host.clone(), &host_ns)
            .get(&host_name(case))
            .await
            .expect("copy");
        assert_eq!(
            copy.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("vcluster.loft.sh/object-uid")),
            virtual_car.metadata.uid.as_ref(),
            "{case}: the copy is the live virtual Car's"
        );
    }
}

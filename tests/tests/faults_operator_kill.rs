//! A killed operator at every write boundary, end to end on the real host
//! API server with the operator binary as a process.
//!
//! An uninterrupted reference run installs a plugin (finalizer added → workload applied →
//! RBAC applied → status written, with its Event) and removes it (status `Terminating` →
//! workload applied without it → RBAC deleted → finalizer removed); the audit log gives its
//! writes. Then, for every n, the operator is started with the test-only fault point
//! `VCP_FAULT_ABORT_AFTER_WRITES=n` (`vcluster_plugin_operator::fault`: `abort()` right after
//! the n-th successful write, SIGABRT, no cleanup) and started again without it; the end state
//! (pod template, Roles, bindings, ClusterRoles, status, finalizer) must equal the reference's,
//! nothing may be left behind, and no object may be written more often than in the reference
//! (the audit log's writes per object; every count first waits until the audit log has caught
//! up, [`vcp_tests::audit_caught_up`]). One more case kills the process with a real SIGKILL
//! frozen at a boundary by `VCP_FAULT_STOP_AFTER_WRITES=n`, for the install and the removal.
//!
//! One test, so this binary's operator processes are the only ones reconciling.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, Resource};
use serde_json::{Value, json};
use vcp_crds::{PLUGIN_NAMESPACE_LABEL, VClusterPlugin};
use vcp_tests::{
    Audit, AuditedWrite, Cluster, ControlPlane, Identity, OperatorOptions, OperatorProcess,
    exit_signal, wait_for, wait_ready,
};

const PLUGIN: &str = "cars";
const TIMEOUT: Duration = Duration::from_secs(60);

/// Starts the operator binary, with the fault point set for `fault`.
fn start(fault: Option<Fault>) -> OperatorProcess {
    let n = |f: Option<Fault>, want_stop: bool| match f {
        Some(Fault::AbortAfter(n)) if !want_stop => u64::try_from(n).ok(),
        Some(Fault::SigkillAfter(n)) if want_stop => u64::try_from(n).ok(),
        _ => None,
    };
    let options = OperatorOptions {
        kubeconfig: ControlPlane::shared().kubeconfig(Cluster::Host, Identity::Operator),
        runtime_image: "vcp-test/runtime:kill".into(),
        abort_after_writes: n(fault, false),
        stop_after_writes: n(fault, true),
        leader_election: None,
        concurrency: None,
    };
    OperatorProcess::start("kill", ControlPlane::shared().dir(), &options)
}

/// SIGTERM once `op` is ready (its caches filled), as a rolling update would.
async fn stop(op: OperatorProcess) {
    wait_for(TIMEOUT, || async {
        (op.get("/readyz").await?.0 == 200).then_some(())
    })
    .await;
    tokio::task::spawn_blocking(move || op.terminate(TIMEOUT))
        .await
        .expect("terminate");
}

/// CRDs, the operator's RBAC and the admission policies bounding it; the namespace `ns` with a
/// vCluster's workload as its chart renders it.
async fn setup(admin: &Client) {
    vcp_tests::prepare_operator_host(ControlPlane::shared(), admin).await;
}

async fn prepare(admin: &Client, ns: &str) {
    vcp_tests::create_namespace(admin, ns).await;
    vcp_tests::apply_yaml(admin, &vcp_tests::vcluster_workload(ns), Some(ns))
        .await
        .expect("create the vCluster's workload as its chart renders it");
}

/// The embedded runtime syncing Cars: a workload part (the sidecar) and RBAC of every kind
/// (a Role and RoleBinding for `cars` on the host, a ClusterRole and ClusterRoleBinding from
/// the explicit cluster rule that reads CRDs: nothing cluster-wide is derived).
fn spec() -> Value {
    json!({
        "vcluster": { "name": "my-vcluster" },
        "syncedTypes": [{ "apiVersion": "example.loft.sh/v1", "kind": "Car" }],
        "rbac": { "clusterRole": { "extraRules": [{
            "apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
            "verbs": ["get", "list", "watch"],
        }] } },
    })
}

/// The operator's successful writes concerning namespace `ns` (its objects, and the
/// cluster-scoped `vcp:<ns>:…` ones), Leases and dry runs left out: what the fault point
/// counts.
fn writes(ns: &str) -> Vec<AuditedWrite> {
    Audit::writes()
        .by(Identity::Operator)
        .in_namespace(ns)
        .and_its_cluster_objects()
        .excluding("/leases")
        .without_dry_runs()
        .succeeded()
}

/// [`writes`] once the audit log has caught up ([`vcp_tests::audit_caught_up`]): the API server
/// writes an audit event as the request's handler returns, so a count made right after the
/// operator died or converged could miss its last writes.
async fn settled_writes(ns: &str) -> Vec<AuditedWrite> {
    vcp_tests::audit_caught_up(ControlPlane::shared(), Cluster::Host).await;
    writes(ns)
}

/// A write as `verb path` with `ns` replaced by `NS` (the query left out): one key per object
/// and kind of write. Events are one key (their names are generated).
fn key(w: &AuditedWrite, ns: &str) -> String {
    let path = w.uri.split('?').next().unwrap_or_default();
    let path = path
        .replace(&format!("vcp%3A{ns}%3A"), "vcp:NS:")
        .replace(ns, "NS");
    if path.contains("/events") {
        return format!("{} events", w.verb);
    }
    format!("{} {path}", w.verb)
}

/// Writes per [`key`].
fn per_object(writes: &[AuditedWrite], ns: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for w in writes {
        *counts.entry(key(w, ns)).or_default() += 1;
    }
    counts
}

/// `obj` without what differs between two equal runs: server-set metadata (uid,
/// resourceVersion, creationTimestamp, generation, managedFields), owner uids, condition
/// transition times; the namespace's name is replaced by `NS`.
fn normalize(mut obj: Value, ns: &str) -> Value {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "generation",
            "managedFields",
        ] {
            meta.remove(field);
        }
        if let Some(owners) = meta
            .get_mut("ownerReferences")
            .and_then(Value::as_array_mut)
        {
            for o in owners {
                o.as_object_mut().map(|o| o.remove("uid"));
            }
        }
    }
    if let Some(conditions) = obj
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    {
        for c in conditions {
            c.as_object_mut().map(|c| c.remove("lastTransitionTime"));
        }
    }
    let text = obj.to_string().replace(ns, "NS");
    serde_json::from_str(&text).expect("json")
}

/// Everything the operator owns for the plugin in `ns`: the pod template, the Roles and
/// RoleBindings in `ns`, the ClusterRoles and ClusterRoleBindings labelled for `ns`, and the
/// plugin's finalizers and status (`null` when it is gone); normalized ([`normalize`]).
async fn snapshot(admin: &Client, ns: &str) -> Value {
    async fn all<K>(api: Api<K>, lp: &ListParams, ns: &str) -> Vec<Value>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    {
        api.list(lp)
            .await
            .expect("list")
            .items
            .into_iter()
            .map(|o| normalize(serde_json::to_value(o).expect("json"), ns))
            .collect()
    }
    let everything = ListParams::default();
    let labelled = ListParams::default().labels(&format!("{PLUGIN_NAMESPACE_LABEL}={ns}"));
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), ns)
        .get("my-vcluster")
        .await
        .expect("StatefulSet");
    let template = serde_json::to_value(sts.spec.expect("spec").template).expect("json");
    let plugin = Api::<VClusterPlugin>::namespaced(admin.clone(), ns)
        .get_opt(PLUGIN)
        .await
        .expect("get plugin")
        .map(|p| {
            let p = normalize(serde_json::to_value(p).expect("json"), ns);
            json!({ "finalizers": p["metadata"]["finalizers"], "status": p["status"] })
        });
    json!({
        "template": normalize(template, ns),
        "roles": all(Api::<Role>::namespaced(admin.clone(), ns), &everything, ns).await,
        "roleBindings": all(Api::<RoleBinding>::namespaced(admin.clone(), ns), &everything, ns).await,
        "clusterRoles": all(Api::<ClusterRole>::all(admin.clone()), &labelled, ns).await,
        "clusterRoleBindings": all(Api::<ClusterRoleBinding>::all(admin.clone()), &labelled, ns).await,
        "plugin": plugin,
    })
}

/// Waits until the plugin in `ns` is `Ready=True` at its generation and `op` has finished a
/// reconcile started after a touch of the plugin made after that (so every write of the
/// install has been made: reconciles of one plugin never overlap).
async fn converge_install(admin: &Client, ns: &str, op: &OperatorProcess) {
    wait_ready(admin, ns, PLUGIN, "True", None, TIMEOUT).await;
    let before = wait_for(TIMEOUT, || op.reconciles()).await;
    Api::<VClusterPlugin>::namespaced(admin.clone(), ns)
        .patch(
            PLUGIN,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { "e2e/touched": "1" } } })),
        )
        .await
        .expect("touch the plugin");
    wait_for(TIMEOUT, || async {
        (op.reconciles().await? > before).then_some(())
    })
    .await;
}

/// Waits until the plugin in `ns` is gone (its finalizer removed).
async fn converge_removal(admin: &Client, ns: &str) {
    let api = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    wait_for(TIMEOUT, || {
        let api = api.clone();
        async move { api.get_opt(PLUGIN).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

/// The reference: writes per object and end state of one uninterrupted install and removal.
struct Reference {
    install: Vec<AuditedWrite>,
    installed: Value,
    removal: Vec<AuditedWrite>,
    removed: Value,
    original: Value,
}

/// How a run was interrupted.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// `VCP_FAULT_ABORT_AFTER_WRITES=n`: SIGABRT right after the n-th write.
    AbortAfter(usize),
    /// `VCP_FAULT_STOP_AFTER_WRITES=n` (the process freezes right after the n-th write), then
    /// a real SIGKILL from the test.
    SigkillAfter(usize),
}

impl Fault {
    fn n(self) -> usize {
        match self {
            Fault::AbortAfter(n) | Fault::SigkillAfter(n) => n,
        }
    }
}

/// Runs `op`'s part (install or removal, begun by the caller) interrupted by `fault`, then
/// starts a fresh operator that finishes it; returns the fresh operator, the writes of the
/// interrupted run and when the fresh one started.
async fn interrupt(
    mut op: OperatorProcess,
    fault: Fault,
    ns: &str,
    before: usize,
) -> (OperatorProcess, usize, Instant) {
    let n = fault.n();
    let (op, status) = tokio::task::spawn_blocking(move || {
        let status = match fault {
            Fault::AbortAfter(_) => op.wait_exit(TIMEOUT),
            Fault::SigkillAfter(_) => {
                let deadline = Instant::now() + TIMEOUT;
                while !op.is_stopped() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                op.is_stopped().then(|| {
                    op.signal("KILL");
                    op.wait_exit(TIMEOUT).expect("dead after SIGKILL")
                })
            }
        };
        (op, status)
    })
    .await
    .expect("wait");
    drop(op);
    let status = status.unwrap_or_else(|| {
        panic!(
            "{ns}: the operator did not die after write {n}: writes {:?}",
            writes(ns)
                .iter()
                .skip(before)
                .map(|w| key(w, ns))
                .collect::<Vec<_>>()
        )
    });
    let signal = match fault {
        Fault::AbortAfter(_) => 6,
        Fault::SigkillAfter(_) => 9,
    };
    assert_eq!(exit_signal(&status), Some(signal), "{ns}: how it died");
    let seen = settled_writes(ns).await.len() - before;
    assert_eq!(
        seen, n,
        "{ns}: the n-th write of the process was this plugin's"
    );
    (start(None), seen, Instant::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_operator_at_every_write_boundary_converges_to_the_uninterrupted_end_state() {
    let cp = ControlPlane::shared();
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    setup(&admin).await;
    let plugins = |ns: &str| Api::<VClusterPlugin>::namespaced(admin.clone(), ns);

    // The reference run.
    let ns = "kill-ref";
    prepare(&admin, ns).await;
    let original = snapshot(&admin, ns).await;
    let op = start(None);
    vcp_tests::create_plugin(&admin, ns, PLUGIN, spec()).await;
    converge_install(&admin, ns, &op).await;
    let install = settled_writes(ns).await;
    let installed = snapshot(&admin, ns).await;
    plugins(ns)
        .delete(PLUGIN, &DeleteParams::default())
        .await
        .expect("delete");
    converge_removal(&admin, ns).await;
    let removal: Vec<AuditedWrite> = settled_writes(ns)
        .await
        .into_iter()
        .skip(install.len())
        .collect();
    let removed = snapshot(&admin, ns).await;
    stop(op).await;
    let reference = Reference {
        install,
        installed,
        removal,
        removed,
        original,
    };
    let show = |ws: &[AuditedWrite], ns: &str| ws.iter().map(|w| key(w, ns)).collect::<Vec<_>>();
    println!(
        "reference install: {} writes {:?}",
        reference.install.len(),
        show(&reference.install, "kill-ref")
    );
    println!(
        "reference removal: {} writes {:?}",
        reference.removal.len(),
        show(&reference.removal, "kill-ref")
    );
    assert!(
        reference.install.len() >= 6,
        "finalizer, workload, 4 RBAC objects, status"
    );
    assert!(
        reference.removal.len() >= 6,
        "workload, 4 RBAC deletes, finalizer"
    );
    assert_eq!(
        reference.removed["template"], reference.original["template"],
        "the removal restores the pod template"
    );
    assert_eq!(
        reference.removed["plugin"],
        Value::Null,
        "the plugin is gone"
    );
    for list in [
        "roles",
        "roleBindings",
        "clusterRoles",
        "clusterRoleBindings",
    ] {
        assert_eq!(
            reference.installed[list].as_array().map(Vec::len),
            Some(1),
            "{list} installed"
        );
        assert_eq!(reference.removed[list], json!([]), "{list} left behind");
    }
    let ref_install = per_object(&reference.install, "kill-ref");
    let ref_removal = per_object(&reference.removal, "kill-ref");

    // Every boundary: case k kills the install after write k and the removal after write k
    // (past the last write of one, that part runs uninterrupted).
    let cases = reference.install.len().max(reference.removal.len());
    let mut faults: Vec<(String, Fault, Fault)> = (1..=cases)
        .map(|k| {
            (
                format!("kill-{k:02}"),
                Fault::AbortAfter(k),
                Fault::AbortAfter(k),
            )
        })
        .collect();
    // A real SIGKILL: after the workload, before the RBAC of the install; after the
    // workload, before the RBAC deletes of the removal.
    faults.push((
        "kill-sig".into(),
        Fault::SigkillAfter(2),
        Fault::SigkillAfter(3),
    ));
    for (ns, install_fault, removal_fault) in faults {
        let ns = ns.as_str();
        prepare(&admin, ns).await;

        // The install.
        let active = |f: Fault, total: usize| f.n() <= total;
        let fault = active(install_fault, reference.install.len()).then_some(install_fault);
        let op = start(fault);
        let began = Instant::now();
        vcp_tests::create_plugin(&admin, ns, PLUGIN, spec()).await;
        let (op, seen, resumed) = match fault {
            Some(f) => interrupt(op, f, ns, 0).await,
            None => (op, reference.install.len(), began),
        };
        converge_install(&admin, ns, &op).await;
        let install = settled_writes(ns).await;
        let killed_after = install
            .get(seen.wrapping_sub(1))
            .map_or("-".to_string(), |w| key(w, ns));
        println!(
            "{ns} install, fault {fault:?}: killed after write {seen} ({killed_after}); {} writes \
             in all, {} by the restarted operator; converged {:.1} s after the restart",
            install.len(),
            install.len() - seen,
            resumed.elapsed().as_secs_f64()
        );
        assert_eq!(
            snapshot(&admin, ns).await,
            reference.installed,
            "{ns}: the installed state equals the uninterrupted run's"
        );
        let counts = per_object(&install, ns);
        for (object, n) in &counts {
            let want = ref_install.get(object).copied().unwrap_or(0);
            assert!(
                *n <= want,
                "{ns}: {object} written {n} times, {want} in the uninterrupted install: {:?}",
                show(&install, ns)
            );
        }
        for (object, want) in &ref_install {
            if !object.ends_with(" events") {
                assert_eq!(
                    counts.get(object),
                    Some(want),
                    "{ns}: {object} written as often as in the uninterrupted install"
                );
            }
        }

        // The removal.
        stop(op).await;
        let before = install.len();
        plugins(ns)
            .delete(PLUGIN, &DeleteParams::default())
            .await
            .expect("delete");
        let fault = active(removal_fault, reference.removal.len()).then_some(removal_fault);
        let op = start(fault);
        let began = Instant::now();
        let (op, seen, resumed) = match fault {
            Some(f) => interrupt(op, f, ns, before).await,
            None => (op, reference.removal.len(), began),
        };
        converge_removal(&admin, ns).await;
        let removal: Vec<AuditedWrite> =
            settled_writes(ns).await.into_iter().skip(before).collect();
        let killed_after = removal
            .get(seen.wrapping_sub(1))
            .map_or("-".to_string(), |w| key(w, ns));
        println!(
            "{ns} removal, fault {fault:?}: killed after write {seen} ({killed_after}); {} \
             writes in all, {} by the restarted operator; converged {:.1} s after the restart",
            removal.len(),
            removal.len() - seen,
            resumed.elapsed().as_secs_f64()
        );
        assert_eq!(
            snapshot(&admin, ns).await,
            reference.removed,
            "{ns}: nothing left behind; the pod template restored"
        );
        let counts = per_object(&removal, ns);
        for (object, n) in &counts {
            let want = ref_removal.get(object).copied().unwrap_or(0);
            assert!(
                *n <= want,
                "{ns}: {object} written {n} times, {want} in the uninterrupted removal: {:?}",
                show(&removal, ns)
            );
        }
        for (object, want) in &ref_removal {
            if !object.ends_with(" events") {
                assert_eq!(
                    counts.get(object),
                    Some(want),
                    "{ns}: {object} written as often as in the uninterrupted removal"
                );
            }
        }
        stop(op).await;
    }
}

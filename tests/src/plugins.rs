//! The shared operator of a test binary, and helpers for `VClusterPlugin`s: create one, wait
//! for its `Ready` condition, delete it and wait until it is gone, wait for an Event about it.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;

use crate::admission::install_admission_policies;
use crate::control_plane::{Cluster, ControlPlane, Identity};
use crate::fixtures::{apply_yaml_file, install_crds};
use crate::wait::{poll_for, wait_for};

/// Field manager of [`accept_as_operator`], the operator's stand-in in runtime tests.
pub const ACCEPTING_FIELD_MANAGER: &str = "vcp-test-operator-standin";

/// Stands in for the operator's verdict where a test runs the runtime without the operator:
/// writes `WorkloadPatched=True` for the plugin's current generation on its status, as the
/// operator does once it accepted (judged and installed) that generation. The runtime applies
/// only hooks accepted so ([`vcp_crds::accepted_by_operator`]). Returns the generation.
///
/// # Panics
/// When the plugin cannot be read or its status written.
pub async fn accept_as_operator(admin: &Client, ns: &str, name: &str) -> i64 {
    let api: Api<VClusterPlugin> = Api::namespaced(admin.clone(), ns);
    let plugin = api.get(name).await.expect("read the plugin to accept");
    let generation = plugin
        .metadata
        .generation
        .expect("a stored plugin has a generation");
    api.patch_status(
        name,
        &PatchParams::apply(ACCEPTING_FIELD_MANAGER).force(),
        &Patch::Apply(json!({
            "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
            "status": {
                "observedGeneration": generation,
                "conditions": [{
                    "type": vcp_crds::WORKLOAD_PATCHED, "status": "True", "reason": "Installed",
                    "message": "accepted by the test's stand-in for the operator",
                    "observedGeneration": generation,
                    "lastTransitionTime": "2026-01-01T00:00:00Z"
                }]
            }
        })),
    )
    .await
    .expect("write WorkloadPatched=True");
    generation
}

/// Installs the CRDs, the operator's RBAC (`config/rbac/role.yaml` plus the binding of the
/// static-token user `vcp-operator`) and the admission policies of the trust model
/// ([`install_admission_policies`]: the operator's own writes are bounded) on the shared host
/// cluster, and starts one operator for this test binary, as `vcp-operator`, with
/// `runtime_image` as its embedded-runtime image. The operator runs on a thread and tokio
/// runtime of its own, so it outlives each test's runtime; later calls only return a new admin
/// client.
///
/// # Panics
/// When the CRDs, the RBAC or the policies cannot be applied, or the operator stops.
pub async fn start_shared_operator(runtime_image: &'static str) -> Client {
    start_shared_operator_with_policy(
        runtime_image,
        vcluster_plugin_operator::policy::Policy::default(),
    )
    .await
}

/// [`start_shared_operator`] with the operator policy `policy` (what `--policy-file` gives the
/// binary) instead of the default. Only the first call of a test binary starts the operator, so
/// every test of a binary shares the policy of that call.
///
/// # Panics
/// As [`start_shared_operator`].
pub async fn start_shared_operator_with_policy(
    runtime_image: &'static str,
    policy: vcluster_plugin_operator::policy::Policy,
) -> Client {
    static STARTED: OnceLock<()> = OnceLock::new();
    let cp = ControlPlane::shared();
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    if STARTED.get().is_none() {
        prepare_operator_host(cp, &admin).await;
        STARTED.get_or_init(|| {
            std::thread::spawn(move || {
                let rt = tokio::runtime::Runtime::new().expect("operator runtime");
                rt.block_on(async {
                    let client = ControlPlane::shared()
                        .client(Cluster::Host, Identity::Operator)
                        .await;
                    let mut config = vcluster_plugin_operator::Config::new(client);
                    config.telemetry = operator_telemetry().clone();
                    config.runtime_image = runtime_image.into();
                    config.policy = policy;
                    vcluster_plugin_operator::run(config)
                        .await
                        .expect("operator stopped");
                });
            });
        });
    }
    admin
}

/// The operator's ClusterRole (`config/rbac/role.yaml`) and its binding to the static-token
/// user `vcp-operator` (`config/rbac/test-user-binding.yaml`) on the cluster of `admin`.
///
/// # Panics
/// When either file is refused.
pub async fn install_operator_role(admin: &Client) {
    for file in [
        "config/rbac/role.yaml",
        "config/rbac/test-user-binding.yaml",
    ] {
        apply_yaml_file(admin, file, None)
            .await
            .unwrap_or_else(|e| panic!("apply {file}: {e:#}"));
    }
}

/// What an operator bounded by the trust model needs on `cp`'s host cluster (`admin` is its
/// admin client): the CRDs, [`install_operator_role`] and the admission policies
/// ([`install_admission_policies`]).
///
/// # Panics
/// When any of them is refused.
pub async fn prepare_operator_host(cp: &ControlPlane, admin: &Client) {
    install_crds(admin).await;
    install_operator_role(admin).await;
    install_admission_policies(cp, admin).await;
}

/// The telemetry of this test binary's shared operator ([`start_shared_operator`]): its
/// reconcile counters, such as [`Telemetry::reconciled`](vcluster_plugin_operator::Telemetry::reconciled)
/// per plugin.
pub fn operator_telemetry() -> &'static Arc<vcluster_plugin_operator::Telemetry> {
    static TELEMETRY: OnceLock<Arc<vcluster_plugin_operator::Telemetry>> = OnceLock::new();
    TELEMETRY.get_or_init(|| Arc::new(vcluster_plugin_operator::Telemetry::new()))
}

/// Reconciles of the plugin `ns/name` the shared operator finished so far (0 before the first).
pub fn operator_reconciles(ns: &str, name: &str) -> u64 {
    operator_telemetry()
        .reconciled(ns, name)
        .map_or(0, |r| r.count)
}

/// Waits until the shared operator has finished a reconcile of the plugin `ns/name` that is
/// its `(after + 1)`-th or later and read the plugin at `resource_version` — the evidence that
/// the operator looked at the object after a trigger, before a test asserts what that look
/// wrote. Returns the plugin's reconcile count then.
///
/// # Panics
/// When no such reconcile finishes within `timeout`.
pub async fn wait_operator_reconciled(
    ns: &str,
    name: &str,
    resource_version: &str,
    after: u64,
    timeout: Duration,
) -> u64 {
    poll_for(timeout, || async move {
        let seen = operator_telemetry().reconciled(ns, name)?;
        (seen.count > after && seen.resource_version == resource_version).then_some(seen.count)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the operator did not reconcile {ns}/{name} at resourceVersion {resource_version} \
             after its reconcile #{after} within {timeout:?} (last: {:?})",
            operator_telemetry().reconciled(ns, name)
        )
    })
}

/// Triggers a reconcile of the plugin `ns/name` by the shared operator and waits until it has
/// finished: sets the annotation `e2e.vcp.dev/poke` to a fresh value (a change that is not in
/// `spec`, so a converged plugin must answer it with zero writes) and waits
/// ([`wait_operator_reconciled`]) for a reconcile that read the poked object. Returns the
/// plugin's reconcile count then.
///
/// # Panics
/// When the plugin cannot be annotated, or no such reconcile finishes within `timeout`.
pub async fn poke_plugin(admin: &Client, ns: &str, name: &str, timeout: Duration) -> u64 {
    let before = operator_reconciles(ns, name);
    let poke = json!({"metadata": {"annotations": {"e2e.vcp.dev/poke": format!("{before}-{:?}", std::time::SystemTime::now())}}});
    let poked = Api::<VClusterPlugin>::namespaced(admin.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&poke))
        .await
        .unwrap_or_else(|e| panic!("poke VClusterPlugin {ns}/{name}: {e}"));
    let rv = poked.metadata.resource_version.unwrap_or_default();
    wait_operator_reconciled(ns, name, &rv, before, timeout).await
}

/// Creates the VClusterPlugin `name` in `ns` with `spec` (JSON, as in a manifest) and returns
/// the created object.
///
/// # Panics
/// When `spec` is not a VClusterPlugin spec or the API server refuses it (the message names
/// the plugin and the API server's answer).
pub async fn create_plugin(admin: &Client, ns: &str, name: &str, spec: Value) -> VClusterPlugin {
    let p: VClusterPlugin = serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": { "name": name, "namespace": ns },
        "spec": spec,
    }))
    .expect("plugin");
    Api::<VClusterPlugin>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &p)
        .await
        .unwrap_or_else(|e| panic!("create VClusterPlugin {ns}/{name}: {e}"))
}

/// The condition of type `type_` (`Ready`, `WorkloadPatched`, `RBACReady`, ...) in `p`'s
/// status, if any.
pub fn condition<'a>(p: &'a VClusterPlugin, type_: &str) -> Option<&'a Condition> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// The plugin `name` in `ns` once its `Ready` condition has `status` (`True` / `False`) and,
/// when given, `reason`, with `status.observedGeneration` equal to `metadata.generation`;
/// `None` when `timeout` passes first.
pub async fn poll_ready(
    admin: &Client,
    ns: &str,
    name: &str,
    status: &str,
    reason: Option<&str>,
    timeout: Duration,
) -> Option<VClusterPlugin> {
    let api = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    poll_for(timeout, || {
        let api = api.clone();
        async move {
            let p = api.get(name).await.ok()?;
            let ready = condition(&p, "Ready")?;
            (ready.status == status
                && reason.is_none_or(|r| ready.reason == r)
                && p.status.as_ref()?.observed_generation == p.metadata.generation)
                .then_some(p)
        }
    })
    .await
}

/// [`poll_ready`], panicking when `timeout` passes first.
///
/// # Panics
/// When the condition is not reached within `timeout`.
pub async fn wait_ready(
    admin: &Client,
    ns: &str,
    name: &str,
    status: &str,
    reason: Option<&str>,
    timeout: Duration,
) -> VClusterPlugin {
    poll_ready(admin, ns, name, status, reason, timeout)
        .await
        .unwrap_or_else(|| {
            panic!(
                "VClusterPlugin {ns}/{name}: Ready={status} (reason {reason:?}) not reached within {timeout:?}"
            )
        })
}

/// Deletes the plugin `name` in `ns` and waits until it is gone (the operator's finalizer ran).
///
/// # Panics
/// When the delete is refused, or the plugin still exists after `timeout`.
pub async fn delete_plugin(admin: &Client, ns: &str, name: &str, timeout: Duration) {
    let api = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    api.delete(name, &DeleteParams::default())
        .await
        .expect("delete VClusterPlugin");
    wait_for(timeout, || {
        let api = api.clone();
        async move { api.get_opt(name).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

/// The first Event (`events.k8s.io/v1`) in `ns` for which `pred` holds, polled every 100 ms
/// ([`poll_for`]); `None` when `timeout` passes first (a list that fails counts as not yet).
pub async fn poll_event_where(
    client: &Client,
    ns: &str,
    timeout: Duration,
    pred: impl Fn(&Event) -> bool,
) -> Option<Event> {
    let events = Api::<Event>::namespaced(client.clone(), ns);
    let pred = &pred;
    poll_for(timeout, || {
        let events = events.clone();
        async move {
            events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| pred(e))
        }
    })
    .await
}

/// The first Event (`events.k8s.io/v1`) in `ns` with `reason` about the object named `about`
/// (`regarding.name`); `None` when `timeout` passes first.
pub async fn poll_event(
    admin: &Client,
    ns: &str,
    about: &str,
    reason: &str,
    timeout: Duration,
) -> Option<Event> {
    poll_event_where(admin, ns, timeout, |e| {
        e.reason.as_deref() == Some(reason)
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(about)
    })
    .await
}

/// [`poll_event`], panicking when `timeout` passes first.
///
/// # Panics
/// When no such Event appears within `timeout`.
pub async fn wait_event(
    admin: &Client,
    ns: &str,
    about: &str,
    reason: &str,
    timeout: Duration,
) -> Event {
    poll_event(admin, ns, about, reason, timeout)
        .await
        .unwrap_or_else(|| panic!("no Event {reason} about {ns}/{about} within {timeout:?}"))
}

//! Physical pod hooks (`--pod-sync=hooks`): the declared `Pod` hooks applied to the host pods
//! that a vCluster's own syncer made.
//!
//! Beside a real vCluster, its syncer creates the host pods; the runtime watches the pods
//! labelled [`MANAGED_BY_LABEL`]`=<vcluster>` in the vCluster's host namespace and applies every
//! hook of kind `Pod` (`apiVersion: v1`) whose events include `CreatePhysical` or
//! `UpdatePhysical`. A pod that already carries the hooks' changes is not written to
//! (idempotent); a write is a merge patch of exactly the changed fields, guarded by the cached
//! `resourceVersion`. The watch, cache (pods kept without `managedFields`), queue and retries
//! are the runtime's one driver (`driver.rs`).
//!
//! The pods exist already, so a hook's change of a field Kubernetes does not let change on an
//! existing pod (`spec.nodeName`, a container's name, ...) is left out and reported once
//! ([`existing_pod_update`]); the rest of the hook (labels, annotations) is applied.

use std::sync::Arc;
use vcp_crds::Reason;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::Value;
use tracing::warn;
use vcp_crds::Hook;

use crate::cache::Cache;
use crate::driver::{self, ObjectKey, Reconcile, Settings, Side, Watch};
use crate::error::Error;
use crate::hooks::{HookPoint, Hooks};
use crate::patch::to_json;
use crate::pod_update::mutable_update;
use crate::stats::{Outcome, TypeStats};
use crate::translate::MANAGED_BY_LABEL;
use crate::write::{Cluster, Part, Target, UpdateFilter, Writer};

/// The [`UpdateFilter`] of the syncers of `api_version` / `kind`: [`existing_pod_update`] for
/// `v1` `Pod` (an existing pod refuses most spec changes), none for every other type.
pub(crate) fn update_filter(api_version: &str, kind: &str) -> Option<UpdateFilter> {
    (api_version == "v1" && kind == "Pod").then_some(existing_pod_update as UpdateFilter)
}

/// Everything [`run_pod_hooks`] needs.
#[derive(Clone)]
pub struct PodHookOptions {
    /// Client of the host cluster.
    pub host: Client,
    /// The vCluster's host namespace.
    pub namespace: String,
    /// The vCluster name (pods labelled [`MANAGED_BY_LABEL`] with it are hooked).
    pub vcluster: String,
    /// The `v1` `Pod` hooks; their `CreatePhysical` and then `UpdatePhysical` points are applied
    /// to every pod (vCluster's syncer made the pod, so both count as "on its way to the host").
    pub hooks: Hooks,
    /// Statistics (objects = hooked pods) shared with the status reporter.
    pub stats: Arc<TypeStats>,
}

/// What of `desired` (the existing host pod `current` after the hooks) the API server accepts
/// ([`mutable_update`]): when the hooks change fields it refuses to change on an existing pod,
/// those changes are left out, with one log line and one `Warning` Event
/// ([`ImmutablePodFields`](vcp_crds::Reason::ImmutablePodFields)) per host pod (its uid) and set of skipped fields, so
/// the labels and annotations are still written and no refused update is ever sent. The Event
/// names the pod as its `related` object.
pub fn existing_pod_update(stats: &TypeStats, current: &Value, desired: Value) -> Value {
    let update = mutable_update(current, &desired);
    if update.skipped.is_empty() {
        return desired;
    }
    let namespace = current["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    let name = current["metadata"]["name"].as_str().unwrap_or_default();
    let fields = update.skipped.join(", ");
    let note = format!(
        "the pod hooks change fields of host pod {namespace}/{name} that Kubernetes does not allow to change on an existing pod ({fields}); those changes are skipped, its labels and annotations are still synced"
    );
    // keyed by the pod's uid and the skipped fields: a recreated pod of the same name, or other
    // skipped fields, are warned about again; forgotten when the pod goes (the driver's delete)
    let uid = current["metadata"]["uid"].as_str().unwrap_or(name);
    let pod = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: current["metadata"]["uid"].as_str().map(str::to_string),
        ..ObjectReference::default()
    };
    if stats.warn_once_about(
        Some(pod),
        &format!("{uid} {} {fields}", Reason::ImmutablePodFields),
        Reason::ImmutablePodFields,
        note.clone(),
    ) {
        warn!(pod = %format!("{namespace}/{name}"), skipped = %fields, "{note}");
    }
    update.desired
}

/// The hooks of `hooks` that apply to host pods: `apiVersion: v1`, `kind: Pod`, events
/// including `CreatePhysical` or `UpdatePhysical`, each once, in declaration order.
pub fn physical_pod_hooks(hooks: &[Hook]) -> Vec<Hook> {
    hooks
        .iter()
        .filter(|hook| {
            hook.api_version == "v1"
                && hook.kind == "Pod"
                && hook.events.iter().any(|event| event.is_physical())
        })
        .cloned()
        .collect()
}

/// Watches the vCluster's host pods and applies the physical pod hooks until the future is
/// dropped, on one worker. Returns at once when there is no such hook.
///
/// # Errors
/// None at present: failures of single pods are retried with backoff, watch failures are
/// retried and recorded in the statistics.
pub async fn run_pod_hooks(opts: PodHookOptions) -> Result<(), Error> {
    if !opts.hooks.handles(HookPoint::CreatePhysical)
        && !opts.hooks.handles(HookPoint::UpdatePhysical)
    {
        return Ok(());
    }
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods");
    let api = Api::<DynamicObject>::namespaced_with(opts.host.clone(), &opts.namespace, &ar);
    let config =
        watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={}", opts.vcluster));
    let watches = vec![Watch {
        side: Side::Host,
        api: driver::tolerant_api(opts.host.clone(), Some(&opts.namespace), &ar),
        config,
    }];
    let settings = Settings {
        workers: 1,
        resync_period: None,
        on_conflict: None,
        retry_max: crate::retry::DEFAULT_RETRY_MAX,
    };
    let pods = PodHooks {
        writer: Writer::new("v1", "Pod", opts.hooks.clone(), opts.stats.clone())
            .with_update_filter(Some(existing_pod_update)),
        api,
        cache: Cache::new(),
        opts,
    };
    driver::run(pods, watches, settings).await;
    Ok(())
}

/// The pod hooks of one vCluster; keys are the host pods' `(namespace, name)`.
struct PodHooks {
    opts: PodHookOptions,
    api: Api<DynamicObject>,
    cache: Cache<DynamicObject>,
    writer: Writer,
}

impl Reconcile for PodHooks {
    type Object = DynamicObject;

    fn stats(&self) -> &TypeStats {
        &self.opts.stats
    }

    fn cache(&self, _side: Side) -> &Cache<DynamicObject> {
        &self.cache
    }

    fn key_of(&self, _side: Side, pod: &DynamicObject, _deleted: bool) -> Option<ObjectKey> {
        Some(ObjectKey {
            namespace: self.opts.namespace.clone(),
            name: pod.name_any(),
        })
    }

    fn undecodable(&self, key: &ObjectKey) -> Option<String> {
        self.cache
            .undecodable(&key.namespace, &key.name)
            .map(|error| format!("host pod {key}: {error}"))
    }

    fn for_each_key(&self, push: &mut dyn FnMut(ObjectKey)) {
        self.cache.for_each_key(|namespace, name| {
            push(ObjectKey {
                namespace: namespace.to_string(),
                name: name.to_string(),
            });
        });
    }

    /// Applies the hooks to the cached pod; writes only when they change it.
    async fn reconcile(&self, key: &ObjectKey) -> Result<Option<Outcome>, Error> {
        let (namespace, name) = (&key.namespace, &key.name);
        let Some(pod) = self.cache.get(namespace, name) else {
            return Ok(None);
        };
        if pod.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        let current = to_json(&pod, name)?;
        let to = Target {
            api: self.api.clone(),
            cluster: Cluster::Host,
            namespace: namespace.clone(),
        };
        self.writer
            .patch(
                &to,
                name,
                Part::Object,
                &[HookPoint::CreatePhysical, HookPoint::UpdatePhysical],
                &current,
                current.clone(),
                pod.resource_version(),
            )
            .await?;
        Ok(Some(Outcome::InSync))
    }
}

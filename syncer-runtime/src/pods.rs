//! Physical pod hooks (`--pod-sync=hooks`): the declared `Pod` hooks applied to the host pods
//! that a vCluster's own syncer made.
//!
//! Beside a real vCluster, its syncer creates the host pods; the runtime watches the pods
//! labelled [`MANAGED_BY_LABEL`]`=<vcluster>` in the vCluster's host namespace and applies every
//! hook of kind `Pod` (`apiVersion: v1`) whose events include `CreatePhysical` or
//! `UpdatePhysical`. A pod that already carries the hooks' changes is not written to
//! (idempotent); a write is a merge patch of exactly the changed fields, guarded by the cached
//! `resourceVersion`.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tracing::{info, warn};
use vcp_crds::{Hook, HookEvent, RUNTIME_FIELD_MANAGER};

use crate::error::Error;
use crate::patch::guarded_merge_patch;
use crate::queue::work_queue;
use crate::sdk::{HookPoint, Hooks, to_json};
use crate::stats::{Outcome, TypeStats};
use crate::translate::MANAGED_BY_LABEL;

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

/// The hooks of `hooks` that apply to host pods: `apiVersion: v1`, `kind: Pod`, events
/// including `CreatePhysical` or `UpdatePhysical`, each once, in declaration order.
pub fn physical_pod_hooks(hooks: &[Hook]) -> Vec<Hook> {
    hooks
        .iter()
        .filter(|hook| {
            hook.api_version == "v1"
                && hook.kind == "Pod"
                && hook.events.iter().any(|event| {
                    matches!(event, HookEvent::CreatePhysical | HookEvent::UpdatePhysical)
                })
        })
        .cloned()
        .collect()
}

/// Watches the vCluster's host pods and applies the physical pod hooks until the future is
/// dropped. Returns at once when there is no such hook.
///
/// # Errors
/// None at present: failures of single pods are retried with backoff, watch failures are
/// retried and recorded in the statistics.
pub async fn run_pod_hooks(opts: PodHookOptions) -> Result<(), Error> {
    let hooks = opts.hooks.clone();
    if !hooks.handles(HookPoint::CreatePhysical) && !hooks.handles(HookPoint::UpdatePhysical) {
        return Ok(());
    }
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods");
    let api = Api::<DynamicObject>::namespaced_with(opts.host.clone(), &opts.namespace, &ar);
    let writer = Writer::new(ar.clone());
    let store = writer.as_reader();
    let config =
        watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={}", opts.vcluster));
    let events = watcher(api.clone(), config)
        .default_backoff()
        .reflect(writer);
    let (queue, receiver) = work_queue::<String>();
    let namespace = opts.namespace.clone();
    let watch = {
        let queue = queue.clone();
        let stats = opts.stats.clone();
        let store = store.clone();
        async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                        stats.set_type_error(None);
                        queue.push(pod.name_any());
                    }
                    Ok(watcher::Event::Delete(pod)) => stats.record(&pod.name_any(), None),
                    Ok(watcher::Event::InitDone) => {
                        stats.set_type_error(None);
                        for pod in store.state() {
                            queue.push(pod.name_any());
                        }
                    }
                    Ok(watcher::Event::Init) => {}
                    Err(error) => {
                        let message = format!("watching host pods in {namespace} failed: {error}");
                        warn!(%message, "watch failed, retrying with backoff");
                        stats.set_type_error(Some(message));
                    }
                }
            }
        }
    };
    let worker = async {
        let _ = store.wait_until_ready().await;
        opts.stats.set_ready();
        while let Some(name) = receiver.next().await {
            let result = hook_pod(
                &api,
                &store,
                &ar,
                &opts.namespace,
                &name,
                &hooks,
                &opts.stats,
            )
            .await;
            receiver.done(&name);
            match result {
                Ok(outcome) => {
                    queue.forget(&name);
                    opts.stats.record(&name, outcome);
                }
                Err(error) => {
                    if !error.is_conflict() {
                        warn!(pod = %name, %error, "pod hook failed, retrying with backoff");
                    }
                    opts.stats
                        .record(&name, Some(Outcome::Failed(error.to_string())));
                    queue.retry(name);
                }
            }
        }
    };
    tokio::select! {
        () = watch => {}
        () = worker => {}
    }
    Ok(())
}

/// Applies `hooks` to the cached pod `name`; writes only when they change it.
async fn hook_pod(
    api: &Api<DynamicObject>,
    store: &Store<DynamicObject>,
    ar: &ApiResource,
    namespace: &str,
    name: &str,
    hooks: &Hooks,
    stats: &TypeStats,
) -> Result<Option<Outcome>, Error> {
    let Some(pod) = store.get(&ObjectRef::new_with(name, ar.clone()).within(namespace)) else {
        return Ok(None);
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let current = to_json(&*pod, name)?;
    let desired = hooks.apply(HookPoint::CreatePhysical, current.clone())?;
    let desired = hooks.apply(HookPoint::UpdatePhysical, desired)?;
    let Some(patch) = guarded_merge_patch(&current, &desired, pod.resource_version()) else {
        return Ok(Some(Outcome::InSync));
    };
    stats.count_write();
    api.patch(
        name,
        &PatchParams {
            field_manager: Some(RUNTIME_FIELD_MANAGER.into()),
            ..PatchParams::default()
        },
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|e| Error::kube(format!("patch host pod {namespace}/{name}"), e))?;
    info!(pod = %name, "applied pod hooks");
    Ok(Some(Outcome::InSync))
}

//! The runtime's one write path. Every write of a synced object (the `ToHost` syncers'
//! [`SyncContext`](crate::sdk::SyncContext) helpers, the `FromHost` sync, the physical pod
//! hooks) goes through a [`Writer`], which does, in this order:
//!
//! 1. the type's hooks at the write's [`HookPoint`]s, on the object's JSON form;
//! 2. for an update, the type's [`UpdateFilter`] (what an existing object accepts: the pod
//!    syncers supply [`existing_pod_update`](crate::pods::existing_pod_update)) and a merge patch
//!    of exactly the fields that differ, guarded by the object's `resourceVersion` (no request
//!    when nothing differs);
//! 3. the request, with the runtime's field manager ([`RUNTIME_FIELD_MANAGER`]), counted in the
//!    type's [`TypeStats::count_write`];
//! 4. for the creates and object patches of a writer that tracks its own host writes
//!    ([`Writer::tracking_own_writes`]), the response's `resourceVersion` recorded in
//!    [`OwnWrites`], so that the watch event echoing the write is skipped.

use std::sync::Arc;

use std::fmt::Debug;

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tracing::info;
use vcp_crds::RUNTIME_FIELD_MANAGER;

use crate::error::Error;
use crate::hooks::{HookPoint, Hooks};
use crate::own_writes::OwnWrites;
use crate::patch::{guarded_merge_patch, to_json};
use crate::stats::TypeStats;

/// What the write path needs of an object type (every [`SyncObject`](crate::sdk::SyncObject)
/// is one).
pub(crate) trait Object: Resource + Clone + Debug + Serialize + DeserializeOwned {}

impl<K: Resource + Clone + Debug + Serialize + DeserializeOwned> Object for K {}

/// What an existing object of a type accepts of an update: `(statistics, current JSON, desired
/// JSON after the hooks) -> the JSON to patch towards`. Supplied by the syncers of a type whose
/// API server refuses some changes (pods: [`crate::pods::existing_pod_update`]).
pub type UpdateFilter = fn(&TypeStats, &Value, Value) -> Value;

/// The cluster a write goes to (in error messages, logs and own-write tracking).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cluster {
    /// The host cluster (the vCluster's host namespace).
    Host,
    /// The virtual cluster.
    Virtual,
}

impl Cluster {
    fn as_str(self) -> &'static str {
        match self {
            Cluster::Host => "host",
            Cluster::Virtual => "virtual",
        }
    }
}

/// Where a write goes: the type's API in one namespace of one cluster.
pub(crate) struct Target<K> {
    /// The type's API, constrained to `namespace`.
    pub(crate) api: Api<K>,
    /// The cluster `api` talks to.
    pub(crate) cluster: Cluster,
    /// The namespace of the written objects.
    pub(crate) namespace: String,
}

/// Which part of an object a patch writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// The object (everything but what the API server keeps for subresources).
    Object,
    /// Only `.status`, through the `status` subresource when `subresource`.
    Status {
        /// Whether the type has a `status` subresource.
        subresource: bool,
    },
}

/// The result of [`Writer::patch`].
#[derive(Debug)]
pub(crate) enum Patched {
    /// A patch was sent and accepted.
    Sent,
    /// Nothing differed: no request; the desired object after the hooks (and the filter).
    Unchanged(Value),
}

/// The write path of one synced type (see the module docs).
pub(crate) struct Writer {
    api_version: String,
    kind: String,
    hooks: Hooks,
    stats: Arc<TypeStats>,
    update_filter: Option<UpdateFilter>,
    own_writes: Option<OwnWrites>,
}

impl Writer {
    /// The writer of `api_version` / `kind` with its `hooks`, counting in `stats`; no update
    /// filter, no own-write tracking.
    pub(crate) fn new(
        api_version: impl Into<String>,
        kind: impl Into<String>,
        hooks: Hooks,
        stats: Arc<TypeStats>,
    ) -> Self {
        Self {
            api_version: api_version.into(),
            kind: kind.into(),
            hooks,
            stats,
            update_filter: None,
            own_writes: None,
        }
    }

    /// This writer, passing every object update through `filter` (after the hooks).
    #[must_use]
    pub(crate) fn with_update_filter(mut self, filter: Option<UpdateFilter>) -> Self {
        self.update_filter = filter;
        self
    }

    /// This writer, recording its host creates and object patches in an [`OwnWrites`]
    /// ([`Writer::own_writes`]), as the `ToHost` syncers do.
    #[must_use]
    pub(crate) fn tracking_own_writes(mut self) -> Self {
        self.own_writes = Some(OwnWrites::default());
        self
    }

    /// The writes not yet seen on the host watch, when this writer tracks them.
    pub(crate) fn own_writes(&self) -> Option<&OwnWrites> {
        self.own_writes.as_ref()
    }

    /// The type's hooks.
    pub(crate) fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// The type's statistics.
    pub(crate) fn stats(&self) -> &Arc<TypeStats> {
        &self.stats
    }

    fn describe(&self, verb: &str, cluster: Cluster, namespace: &str, name: &str) -> String {
        format!(
            "{verb} {} {} {} {namespace}/{name}",
            cluster.as_str(),
            self.api_version,
            self.kind
        )
    }

    /// The own-write tracker of a write to `cluster`, if this writer tracks it.
    fn tracker(&self, cluster: Cluster) -> Option<&OwnWrites> {
        self.own_writes
            .as_ref()
            .filter(|_| cluster == Cluster::Host)
    }

    /// `obj` after the hooks of each of `points` that a hook implements, in order.
    fn hooked(&self, points: &[HookPoint], mut obj: Value) -> Result<Value, Error> {
        for &point in points {
            if self.hooks.handles(point) {
                obj = self.hooks.apply(point, obj)?;
            }
        }
        Ok(obj)
    }

    /// Creates `obj` in `to` after the hooks of `point`. One request.
    ///
    /// # Errors
    /// A hook's error, [`Error::Json`] when the hooked object no longer fits the type, or
    /// [`Error::Kube`] (409 when the object exists; 404 when its namespace does not).
    #[tracing::instrument(name = "write", skip_all, fields(verb = "create", cluster = to.cluster.as_str(), kind = %self.kind, object = tracing::field::Empty))]
    pub(crate) async fn create<K: Object>(
        &self,
        to: &Target<K>,
        point: HookPoint,
        obj: K,
    ) -> Result<(), Error> {
        let obj = apply_typed(&self.hooks, point, obj)?;
        let name = obj.name_any();
        tracing::Span::current().record("object", format!("{}/{name}", to.namespace));
        let params = PostParams {
            field_manager: Some(RUNTIME_FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        self.stats.count_write();
        let request = to.api.create(&params, &obj);
        let result = match self.tracker(to.cluster) {
            Some(own_writes) => own_writes.track(&name, request).await,
            None => request.await,
        };
        result.map_err(|e| {
            Error::kube(self.describe("create", to.cluster, &to.namespace, &name), e)
        })?;
        info!("created");
        Ok(())
    }

    /// Brings `part` of the object `name` from `current` to `desired` after the hooks of
    /// `points` (and, for [`Part::Object`], the [`UpdateFilter`]): a merge patch of exactly the
    /// differing fields, carrying `resource_version` (409 when the object moved on). For
    /// [`Part::Status`], the hooks see the whole object and only `.status` is compared and
    /// written.
    ///
    /// # Errors
    /// A hook's error, or [`Error::Kube`].
    #[allow(clippy::too_many_arguments)]
    #[tracing::instrument(name = "write", skip_all, fields(verb = "patch", cluster = to.cluster.as_str(), kind = %self.kind, object = %format_args!("{}/{name}", to.namespace), part = ?part))]
    pub(crate) async fn patch<K: Object>(
        &self,
        to: &Target<K>,
        name: &str,
        part: Part,
        points: &[HookPoint],
        current: &Value,
        desired: Value,
        resource_version: Option<String>,
    ) -> Result<Patched, Error> {
        let desired = self.hooked(points, desired)?;
        let patch = match part {
            Part::Object => {
                let desired = match self.update_filter {
                    Some(filter) => filter(&self.stats, current, desired),
                    None => desired,
                };
                match guarded_merge_patch(current, &desired, resource_version) {
                    Some(patch) => patch,
                    None => return Ok(Patched::Unchanged(desired)),
                }
            }
            Part::Status { .. } => {
                let current_status = json!({"status": current.get("status")});
                let desired_status = json!({"status": desired.get("status")});
                match guarded_merge_patch(&current_status, &desired_status, resource_version) {
                    Some(patch) => patch,
                    None => return Ok(Patched::Unchanged(desired)),
                }
            }
        };
        self.stats.count_write();
        let params = PatchParams {
            field_manager: Some(RUNTIME_FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        let patch = Patch::Merge(&patch);
        let verb = match part {
            Part::Object => {
                let request = to.api.patch(name, &params, &patch);
                let result = match self.tracker(to.cluster) {
                    Some(own_writes) => own_writes.track(name, request).await,
                    None => request.await,
                };
                result.map(drop).map_err(|e| (e, "patch"))
            }
            Part::Status { subresource: true } => to
                .api
                .patch_status(name, &params, &patch)
                .await
                .map(drop)
                .map_err(|e| (e, "patch status of")),
            Part::Status { subresource: false } => to
                .api
                .patch(name, &params, &patch)
                .await
                .map(drop)
                .map_err(|e| (e, "patch status of")),
        };
        verb.map_err(|(e, verb)| {
            Error::kube(self.describe(verb, to.cluster, &to.namespace, name), e)
        })?;
        info!("patched");
        Ok(Patched::Sent)
    }

    /// Deletes `obj` from `to` (precondition: its uid) after the hooks of `point`; `false` when
    /// it was gone already (404).
    ///
    /// # Errors
    /// A hook's error, or [`Error::Kube`].
    #[tracing::instrument(name = "write", skip_all, fields(verb = "delete", cluster = to.cluster.as_str(), kind = %self.kind, object = %format_args!("{}/{}", to.namespace, obj.name_any())))]
    pub(crate) async fn delete<K: Object>(
        &self,
        to: &Target<K>,
        point: HookPoint,
        obj: &K,
    ) -> Result<bool, Error> {
        let name = obj.name_any();
        if self.hooks.handles(point) {
            self.hooks.apply(point, to_json(obj, &name)?)?;
        }
        self.stats.count_write();
        let deleted = delete_exact(&to.api, obj).await.map_err(|e| {
            Error::kube(self.describe("delete", to.cluster, &to.namespace, &name), e)
        })?;
        if deleted {
            info!("deleted");
        }
        Ok(deleted)
    }
}

/// [`Hooks::apply`] on a typed object (converted to JSON and back); `obj` itself when no hook
/// implements `point`.
///
/// # Errors
/// A hook's error, or [`Error::Json`] when the hooked JSON no longer fits the type.
pub(crate) fn apply_typed<K: Resource + Serialize + DeserializeOwned>(
    hooks: &Hooks,
    point: HookPoint,
    obj: K,
) -> Result<K, Error> {
    if !hooks.handles(point) {
        return Ok(obj);
    }
    let name = obj.name_any();
    let value = to_json(&obj, &name)?;
    let value = hooks.apply(point, value)?;
    serde_json::from_value(value).map_err(|source| Error::Json {
        what: format!("{name} after the {point:?} hooks"),
        source,
    })
}

/// Deletes `obj` through `api`, with its uid as precondition (a newer object of the same name is
/// never deleted). `Ok(false)` when it was gone already (404).
///
/// # Errors
/// The API error of any other failure.
async fn delete_exact<K: Object>(api: &Api<K>, obj: &K) -> Result<bool, kube::Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: obj.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&obj.name_any(), &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

//! Tolerant reading in the operator (it judges each plugin apart, so one bad plugin never
//! blocks another): every watch of the operator decodes object by object
//! ([`vcp_crds::tolerant`]), so one object its types cannot read never fails a list or a watch.
//!
//! | watch | [`StatusPolicy`] | why |
//! | --- | --- | --- |
//! | `VClusterPlugin` ([`crate::controller`]) | `PassWithout` | the operator writes its own part of the status and never needs another writer's conditions to decide; a plugin whose status alone is unreadable (a condition whose `lastTransitionTime` the API server's `date-time` check accepted, `k8s_openapi`'s `Time` does not) is reconciled as usual: installed, its status written, its deletion cleaned up |
//! | StatefulSets, Deployments ([`crate::cache`]) | `PassWithout` | the operator reads a workload's metadata and pod template, never its status ([`crate::workload::Workload`]) |
//! | Roles, RoleBindings, ClusterRoles, ClusterRoleBindings ([`crate::cache`], [`crate::patched_roles`]) | `PassWithout` | they have no status |
//! | lists of RBAC objects from the API server (the sweep, [`crate::sweep`]; the finalizer path and `PatchVClusterRoles`, `vcluster::observe`) | [`readable`] | the same, per listed item |
//!
//! What happens to an object that is skipped ([`on_skipped`]): a warning log naming its kind,
//! namespace, name and the error with its JSON path, and one count of
//! `vcp_operator_undecodable_objects_total{kind, part}` ([`crate::telemetry`]). An object that
//! turns unreadable is dropped from its cache: the watcher sends its last decoded version,
//! taken from the cache ([`ghost_of`]), as a delete. For a plugin that means it is treated as
//! refused: its cleanup is the sweep's ([`crate::sweep`], which runs after every plugin delete
//! event and finds nothing installed for a plugin the cache does not hold), and
//! [`UndecodablePlugins`] writes its `Ready=False` with reason `Undecodable`, a message naming
//! the field, and a Warning Event ([`report_undecodable`]). Once the object decodes again, the
//! watch passes it on and it is reconciled as any other: the poison removed heals with no
//! restart.
//!
//! A plugin passed on without its status carries `status: None`; the operator's own status
//! write is then compared with what this process last wrote ([`crate::status::WrittenStatuses`])
//! so that it is written once, not on every echo of the write.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::{debug, warn};
use vcp_crds::tolerant::{Skipped, Tolerant, key_of};
use vcp_crds::{OPERATOR_FIELD_MANAGER, Phase, Reason, VClusterPlugin, VClusterPluginStatus};

pub use vcp_crds::tolerant::StatusPolicy;

use crate::error::{Error, Result};
use crate::status::{self, Check};
use crate::telemetry::Telemetry;

/// Longest message the operator writes into a condition or an Event about an unreadable
/// object, in characters (the error's JSON path of a deeply nested value can be long).
pub const MESSAGE_LIMIT: usize = 1024;

/// The skipped-object callback of a tolerant watch of `kind` ([`vcp_crds::tolerant::watcher`]):
/// a warning log with the object's kind, namespace, name and the error, and one count of
/// `vcp_operator_undecodable_objects_total{kind, part}` in `telemetry`.
pub fn on_skipped(
    kind: &'static str,
    telemetry: Arc<Telemetry>,
) -> impl FnMut(&Skipped) + Send + 'static {
    move |s: &Skipped| log_skipped(kind, s, &telemetry)
}

/// The objects of a list read tolerantly (`items` of an `Api<Tolerant<K>>` list, such as the
/// sweep's and the finalizer path's lists of RBAC objects): each that decodes, whole or without
/// its status (RBAC objects have none), in the list's order; each other one is logged and
/// counted as a watch's ([`log_skipped`]) and left out, so that one object the operator cannot
/// read never fails the list, and the loop it feeds goes on with the others.
pub fn readable<K: Resource>(kind: &str, items: Vec<Tolerant<K>>, telemetry: &Telemetry) -> Vec<K> {
    items
        .into_iter()
        .filter_map(|item| {
            let (object, skipped) = match item {
                Tolerant::Whole(object) => return Some(object),
                Tolerant::WithoutStatus { object, error } => {
                    let skipped = Skipped {
                        metadata: object.meta().clone(),
                        error,
                        deleted: false,
                        passed_without_status: true,
                    };
                    (Some(object), skipped)
                }
                Tolerant::Undecodable(u) => (
                    None,
                    Skipped {
                        metadata: u.metadata,
                        error: u.error,
                        deleted: false,
                        passed_without_status: false,
                    },
                ),
            };
            log_skipped(kind, &skipped, telemetry);
            object
        })
        .collect()
}

/// What [`on_skipped`] does for one object.
pub fn log_skipped(kind: &str, s: &Skipped, telemetry: &Telemetry) {
    telemetry.count_undecodable(kind, s.passed_without_status);
    let namespace = s.metadata.namespace.as_deref().unwrap_or_default();
    let name = s.metadata.name.as_deref().unwrap_or_default();
    if s.passed_without_status {
        warn!(
            kind,
            namespace,
            name,
            error = %s.error,
            "cannot read the object's status: going on without it"
        );
    } else {
        warn!(
            kind,
            namespace,
            name,
            error = %s.error,
            deleted = s.deleted,
            "cannot read the object: skipped (every other object goes on)"
        );
    }
}

/// The ghost callback of a tolerant watch feeding `store` ([`vcp_crds::tolerant::watcher`]): the
/// last decoded version of the object the cache holds, so that the watcher's delete event drops
/// it from the cache (`None`: the cache never held it).
pub fn ghost_of<K>(store: Store<K>) -> impl FnMut(&ObjectMeta) -> Option<K> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    move |meta: &ObjectMeta| {
        let name = meta.name.as_deref()?;
        let mut key = ObjectRef::<K>::new(name);
        if let Some(namespace) = &meta.namespace {
            key = key.within(namespace);
        }
        store.get(&key).map(|k| (*k).clone())
    }
}

/// `object` as decoded, or [`Error::Undecodable`] (the answer to `action` of a write).
///
/// # Errors
/// [`Error::Undecodable`] when not even the object without its status could be read.
pub fn decoded(object: Tolerant<VClusterPlugin>, action: &'static str) -> Result<VClusterPlugin> {
    match object {
        Tolerant::Whole(p) | Tolerant::WithoutStatus { object: p, .. } => Ok(p),
        Tolerant::Undecodable(u) => Err(Error::Undecodable {
            action,
            object: key_of(&u.metadata),
            error: u.error,
        }),
    }
}

/// The plugins the operator could not read and has reported (or is reporting), by uid: what
/// was reported (generation and error), so that the echo of the status write, which is as
/// unreadable as the object was, reports nothing again. An entry leaves when the plugin decodes
/// again or is deleted ([`UndecodablePlugins::readable`]).
#[derive(Debug)]
pub struct UndecodablePlugins {
    reported: Mutex<HashMap<String, String>>,
    to_report: mpsc::UnboundedSender<Skipped>,
}

impl UndecodablePlugins {
    /// No plugin reported yet, and the queue [`report_undecodable`] drains.
    pub fn new() -> (Arc<Self>, mpsc::UnboundedReceiver<Skipped>) {
        let (to_report, rx) = mpsc::unbounded_channel();
        (
            Arc::new(UndecodablePlugins {
                reported: Mutex::default(),
                to_report,
            }),
            rx,
        )
    }

    /// Told of every skipped plugin (the watcher's callback): an unreadable one not reported
    /// for this generation and error is queued for [`report_undecodable`]; a deleted one is
    /// forgotten. A plugin passed on without its status is reconciled, not reported here.
    pub fn note(&self, s: &Skipped) {
        if s.passed_without_status {
            return;
        }
        let Some(uid) = s.metadata.uid.clone() else {
            return;
        };
        if s.deleted {
            self.lock().remove(&uid);
            return;
        }
        let what = format!("{:?}:{}", s.metadata.generation, s.error);
        let mut reported = self.lock();
        if reported.get(&uid) == Some(&what) {
            return;
        }
        reported.insert(uid, what);
        let _ = self.to_report.send(s.clone());
    }

    /// The plugin with `uid` decoded (or was deleted): it is no longer reported.
    pub fn readable(&self, uid: Option<&str>) {
        if let Some(uid) = uid {
            let mut reported = self.lock();
            if !reported.is_empty() {
                reported.remove(uid);
            }
        }
    }

    /// Forgets the report of `uid` so that its next event reports it again (a failed write).
    fn retry_later(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Plugins reported as unreadable now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no plugin is reported as unreadable now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.reported
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `text` cut to at most [`MESSAGE_LIMIT`] characters (`…` marks a cut).
pub fn bounded(text: &str) -> String {
    match text.char_indices().nth(MESSAGE_LIMIT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// The message of the `Undecodable` condition and Event of a plugin the operator cannot read
/// (`error`: the decoding error with its JSON path).
pub fn undecodable_message(error: &str) -> String {
    bounded(&format!(
        "the operator cannot read this VClusterPlugin ({error}); it is not installed, and what \
         an earlier version installed is removed: fix the field named or re-create the object"
    ))
}

/// The operator's status of a plugin it cannot read (generation `generation`): `Ready`,
/// `WorkloadPatched` and `RBACReady` `False` with reason `Undecodable` and `message`, phase
/// `Failed`.
pub fn undecodable_status(
    generation: Option<i64>,
    message: &str,
    now: &Time,
) -> VClusterPluginStatus {
    let check = Check::failed(Reason::Undecodable, message);
    VClusterPluginStatus {
        observed_generation: generation,
        phase: Some(Phase::Failed),
        conditions: status::OPERATOR_CONDITIONS
            .iter()
            .map(|t| status::condition(t, &check, generation, None, now))
            .collect(),
        ..Default::default()
    }
}

/// The server-side-apply body of [`undecodable_status`] for the plugin `namespace/name`.
fn apply_body(namespace: &str, name: &str, status: &VClusterPluginStatus) -> Value {
    json!({
        "apiVersion": VClusterPlugin::api_version(&()),
        "kind": VClusterPlugin::kind(&()),
        "metadata": { "name": name, "namespace": namespace },
        "status": status,
    })
}

/// Reports every plugin [`UndecodablePlugins::note`] queues, one after the other, until the
/// queue closes: its status ([`undecodable_status`], server-side apply under
/// [`OPERATOR_FIELD_MANAGER`]; the answer read tolerantly) and a Warning Event with reason
/// `Undecodable`. A failed write is logged and reported again at the plugin's next event.
pub async fn report_undecodable(
    client: kube::Client,
    reporter: Reporter,
    plugins: Arc<UndecodablePlugins>,
    mut queue: mpsc::UnboundedReceiver<Skipped>,
) {
    while let Some(s) = queue.recv().await {
        let (Some(namespace), Some(name)) = (&s.metadata.namespace, &s.metadata.name) else {
            continue;
        };
        let message = undecodable_message(&s.error);
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let body = apply_body(
            namespace,
            name,
            &undecodable_status(s.metadata.generation, &message, &now),
        );
        let api: Api<Tolerant<VClusterPlugin>> = Api::namespaced(client.clone(), namespace);
        if let Err(error) = api
            .patch_status(
                name,
                &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
                &Patch::Apply(body),
            )
            .await
        {
            warn!(namespace = %namespace, name = %name, %error, "cannot write the Undecodable status");
            plugins.retry_later(s.metadata.uid.as_deref().unwrap_or_default());
            continue;
        }
        debug!(namespace = %namespace, name = %name, "wrote the Undecodable status");
        let regarding = ObjectReference {
            api_version: Some(VClusterPlugin::api_version(&()).into()),
            kind: Some(VClusterPlugin::kind(&()).into()),
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            uid: s.metadata.uid.clone(),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: Reason::Undecodable.to_string(),
            note: Some(message),
            action: "Reconcile".into(),
            secondary: None,
        };
        // One Recorder per Event, as `crate::writes::write_status` (a Recorder keeps what it
        // sent).
        let recorder = Recorder::new(client.clone(), reporter.clone());
        if let Err(error) = recorder.publish(&event, &regarding).await {
            warn!(namespace = %namespace, name = %name, %error, "cannot publish the Undecodable Event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skipped(uid: &str, generation: i64, error: &str, deleted: bool, without: bool) -> Skipped {
        Skipped {
            metadata: ObjectMeta {
                name: Some("bad".into()),
                namespace: Some("team-a".into()),
                uid: Some(uid.into()),
                generation: Some(generation),
                ..ObjectMeta::default()
            },
            error: error.into(),
            deleted,
            passed_without_status: without,
        }
    }

    #[test]
    fn a_list_keeps_every_readable_object_and_counts_the_other() {
        use k8s_openapi::api::rbac::v1::Role;
        let role = |name: &str, rules: &str| {
            vcp_crds::tolerant::decode::<Role>(&format!(
                r#"{{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{{"name":"{name}","namespace":"team-a"}},"rules":{rules}}}"#
            ))
        };
        let telemetry = Telemetry::new();
        let listed = vec![
            role("first", "[]"),
            role("bad", r#""not a list""#),
            role(
                "last",
                r#"[{"apiGroups":[""],"resources":["pods"],"verbs":["get"]}]"#,
            ),
        ];
        let names: Vec<String> = readable("Role", listed, &telemetry)
            .iter()
            .map(|r| r.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["first", "last"]);
        assert_eq!(telemetry.undecodable("Role", false), 1);
        assert_eq!(telemetry.undecodable("Role", true), 0);
    }

    #[test]
    fn an_unreadable_plugin_is_reported_once_per_generation_and_error() {
        let (plugins, mut queue) = UndecodablePlugins::new();
        plugins.note(&skipped(
            "u1",
            1,
            "spec.config: recursion limit exceeded",
            false,
            false,
        ));
        // the echo of the status write: same generation, same error
        plugins.note(&skipped(
            "u1",
            1,
            "spec.config: recursion limit exceeded",
            false,
            false,
        ));
        assert_eq!(
            queue.try_recv().unwrap().metadata.uid.as_deref(),
            Some("u1")
        );
        assert!(queue.try_recv().is_err(), "reported once");
        // a new generation is reported again
        plugins.note(&skipped(
            "u1",
            2,
            "spec.config: recursion limit exceeded",
            false,
            false,
        ));
        assert!(queue.try_recv().is_ok());
        // passed on without its status: reconciled, not reported
        plugins.note(&skipped("u2", 1, "status.conditions[0]", false, true));
        assert!(queue.try_recv().is_err());
        assert_eq!(plugins.len(), 1);
        // readable again, then unreadable again: reported again
        plugins.readable(Some("u1"));
        assert!(plugins.is_empty());
        plugins.note(&skipped(
            "u1",
            2,
            "spec.config: recursion limit exceeded",
            false,
            false,
        ));
        assert!(queue.try_recv().is_ok());
        // deleted: forgotten
        plugins.note(&skipped(
            "u1",
            2,
            "spec.config: recursion limit exceeded",
            true,
            false,
        ));
        assert!(plugins.is_empty());
        assert!(queue.try_recv().is_err());
    }

    #[test]
    fn the_undecodable_status_refuses_with_the_field_and_a_bounded_message() {
        let path = format!("spec.config{}", "[0]".repeat(600));
        let message = undecodable_message(&format!("{path}: recursion limit exceeded"));
        assert!(
            message.starts_with("the operator cannot read this VClusterPlugin (spec.config[0]")
        );
        assert_eq!(
            message.chars().count(),
            MESSAGE_LIMIT + 1,
            "cut, with the mark"
        );
        assert!(message.ends_with('…'));
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let s = undecodable_status(Some(3), &message, &now);
        assert_eq!(s.phase, Some(Phase::Failed));
        assert_eq!(s.observed_generation, Some(3));
        let types: Vec<_> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "WorkloadPatched", "RBACReady"]);
        for c in &s.conditions {
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("False", "Undecodable")
            );
            assert_eq!(c.observed_generation, Some(3));
            assert_eq!(c.message, message);
        }
        assert_eq!(bounded("short"), "short");
    }

    #[test]
    fn a_ghost_is_the_cached_version_and_none_for_an_unknown_object() {
        let (store, mut writer) = kube::runtime::reflector::store::<VClusterPlugin>();
        let p: VClusterPlugin = serde_json::from_value(json!({
            "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
            "metadata": { "name": "bad", "namespace": "team-a", "resourceVersion": "5" },
            "spec": { "vcluster": { "name": "vc" } },
        }))
        .unwrap();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(p));
        let mut ghost = ghost_of(store);
        let meta = |ns: &str| ObjectMeta {
            name: Some("bad".into()),
            namespace: Some(ns.into()),
            ..ObjectMeta::default()
        };
        let found = ghost(&meta("team-a")).expect("the cached version");
        assert_eq!(found.metadata.resource_version.as_deref(), Some("5"));
        assert!(ghost(&meta("team-b")).is_none());
    }

    #[test]
    fn a_write_answer_decodes_tolerantly() {
        let poisoned = r#"{"apiVersion":"vcp.dev/v1alpha1","kind":"VClusterPlugin",
            "metadata":{"name":"p","namespace":"team-a","finalizers":["vcp.dev/cleanup"]},
            "spec":{"vcluster":{"name":"vc"}},
            "status":{"conditions":[{"type":"Evil","status":"True","reason":"X","message":"x",
                "lastTransitionTime":"2024-01-01T10:00:00Zt"}]}}"#;
        let p = decoded(vcp_crds::tolerant::decode(poisoned), "remove finalizer").unwrap();
        assert_eq!(
            p.metadata.finalizers.as_deref(),
            Some(&["vcp.dev/cleanup".to_string()][..])
        );
        let deep = format!(
            r#"{{"metadata":{{"name":"d","namespace":"team-a"}},"spec":{{"vcluster":{{"name":"vc"}},"config":{}{}}}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let err = decoded(vcp_crds::tolerant::decode(&deep), "add finalizer").unwrap_err();
        assert!(err.to_string().contains("team-a/d"), "{err}");
        assert!(err.to_string().contains("recursion limit"), "{err}");
    }
}

//! The watches of the vCluster Roles that `rbac.mode: PatchVClusterRoles` plugins append to, so
//! that someone's edit taking a plugin's rule out is seen and repaired at once, not
//! at the next trigger of the plugin.
//!
//! Such a Role is the user's (the vCluster chart's `vc-<vcluster>`, managed by Helm or Argo CD):
//! the operator changes only its `rules` and `vcp.dev/added-rules.*` annotations
//! ([`crate::rbac`]) and may not label it (`config/admission/operator-bounds.yaml`), so the
//! label-selected Role cache of [`crate::cache`] never sees it. Instead, for every namespace
//! that holds a plugin in that mode which is not being deleted, one watch of that namespace's
//! Roles that are *not* labelled [`PLUGIN_NAME_LABEL`] (the plugins' own Roles are the cache's)
//! runs; none runs elsewhere, so what the operator reads still follows the plugins, not the
//! cluster (the cache scope rules of [`crate::cache`]). Nothing is stored: each event is judged
//! and dropped.
//!
//! An event becomes a trigger ([`may_have_drifted`]) unless the Role is as the operator leaves
//! it: it carries `vcp.dev/added-rules.*` records and holds every rule they record, appended or
//! found present ([`rbac::records_held`]). So the operator's own patches trigger nothing, while a
//! recorded rule taken out (`kubectl edit`; an apply of the chart's rules by another field
//! manager, which then owns the atomic `rules` list; the restore of the plugin that appended a
//! rule another plugin recorded as present), a Role without records (its records taken out with
//! the rules, or a Role bound to the vCluster later) and a deleted Role do. The controller
//! ([`crate::controller`]) reconciles the namespace's plugins in that mode, whose reconcile
//! lists the Roles and restores what is missing ([`crate::vcluster::act`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use k8s_openapi::api::rbac::v1::Role;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::task::JoinHandle;
use tracing::{debug, warn};
use vcp_crds::tolerant::{self, StatusPolicy, Tolerant};
use vcp_crds::{PLUGIN_NAME_LABEL, VClusterPlugin};

use crate::cache::Reflected;
use crate::rbac;
use crate::telemetry::Telemetry;

/// Roles waiting for the controller; a full buffer holds the watches back (no event is lost).
const BUFFER: usize = 64;

/// The per-namespace Role watches ([`PatchedRoleWatches::sync`] starts and stops them). Dropping
/// it stops every watch.
pub struct PatchedRoleWatches {
    client: Client,
    telemetry: Arc<Telemetry>,
    events: mpsc::Sender<Role>,
    watches: Mutex<HashMap<String, JoinHandle<()>>>,
}

impl PatchedRoleWatches {
    /// No watch yet, and the stream of the Roles that may have drifted (one item per such
    /// event, [`may_have_drifted`]) of every watch [`PatchedRoleWatches::sync`] will start, with
    /// `client` (the operator's identity: list and watch on roles, `config/rbac/role.yaml`).
    /// Re-lists are counted in `telemetry` under kind `Role` ([`Telemetry::count_list`]).
    pub fn new(client: &Client, telemetry: &Arc<Telemetry>) -> (Self, Reflected<Role>) {
        let (events, rx) = mpsc::channel(BUFFER);
        let watches = PatchedRoleWatches {
            client: client.clone(),
            telemetry: telemetry.clone(),
            events,
            watches: Mutex::default(),
        };
        (watches, Box::pin(rx.map(Ok::<Role, watcher::Error>)))
    }

    /// Starts or stops the watch of `plugin`'s namespace after an event of `plugin` (`deleted`:
    /// a delete event), so that it runs exactly while `plugins` (the controller's cache, already
    /// holding the change) has a plugin of that namespace that [`watched`] keeps watching. The
    /// cache is scanned only when the watch may stop (the namespace is watched and the event's
    /// plugin no longer needs it), so the events of other plugins cost a map look-up. Must be
    /// called inside a tokio runtime.
    pub fn sync(&self, plugins: &Store<VClusterPlugin>, plugin: &VClusterPlugin, deleted: bool) {
        let namespace = plugin.namespace().unwrap_or_default();
        if !deleted && watched(plugin) {
            self.set(&namespace, true);
        } else if self.is_watched(&namespace) {
            let wanted = plugins
                .state()
                .iter()
                .any(|p| p.namespace().as_deref() == Some(namespace.as_str()) && watched(p));
            self.set(&namespace, wanted);
        }
    }

    /// [`PatchedRoleWatches::sync`] for every namespace: the ones of `plugins` in that mode and
    /// the ones watched now (after a re-list of the plugins, whose deletes during an outage
    /// came as no event).
    pub fn sync_all(&self, plugins: &Store<VClusterPlugin>) {
        let mut wanted: Vec<String> = plugins
            .state()
            .iter()
            .filter(|p| watched(p))
            .filter_map(|p| p.namespace())
            .collect();
        wanted.sort();
        wanted.dedup();
        let running: Vec<String> = self.namespaces();
        for ns in running.iter().filter(|ns| !wanted.contains(ns)) {
            self.set(ns, false);
        }
        for ns in &wanted {
            self.set(ns, true);
        }
    }

    /// The namespaces whose Roles are watched now, sorted.
    pub fn namespaces(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .watches
            .lock()
            .map(|w| w.keys().cloned().collect())
            .unwrap_or_default();
        out.sort();
        out
    }

    fn is_watched(&self, namespace: &str) -> bool {
        self.watches.lock().is_ok_and(|w| w.contains_key(namespace))
    }

    fn set(&self, namespace: &str, wanted: bool) {
        let Ok(mut watches) = self.watches.lock() else {
            return;
        };
        match (wanted, watches.contains_key(namespace)) {
            (true, false) => {
                debug!(namespace, "watching the namespace's vCluster Roles");
                let task = tokio::spawn(watch(
                    Api::namespaced(self.client.clone(), namespace),
                    self.events.clone(),
                    self.telemetry.clone(),
                ));
                watches.insert(namespace.to_string(), task);
            }
            (false, true) => {
                debug!(
                    namespace,
                    "no longer watching the namespace's vCluster Roles"
                );
                if let Some(task) = watches.remove(namespace) {
                    task.abort();
                }
            }
            _ => {}
        }
    }
}

impl Drop for PatchedRoleWatches {
    fn drop(&mut self) {
        if let Ok(watches) = self.watches.get_mut() {
            for (_, task) in watches.drain() {
                task.abort();
            }
        }
    }
}

/// Whether `plugin` needs its namespace's Roles watched: `rbac.mode: PatchVClusterRoles`, not
/// being deleted (its removal is the finalizer's, which reads the API server itself).
pub fn watched(plugin: &VClusterPlugin) -> bool {
    rbac::patches_vcluster_roles(plugin) && plugin.metadata.deletion_timestamp.is_none()
}

/// Whether an event of `role` (`deleted`: a delete event) may mean that a plugin's appended
/// rules are no longer in place (module docs): false only for a Role that carries records and
/// holds every rule they record.
pub fn may_have_drifted(role: &Role, deleted: bool) -> bool {
    deleted || rbac::records_held(role) != Some(true)
}

/// The plugins to reconcile for a Role of `namespace` that may have drifted: those of
/// `plugins` in that namespace that [`watched`] keeps watching.
pub fn plugins_of_role(
    plugins: &Store<VClusterPlugin>,
    namespace: &str,
) -> Vec<ObjectRef<VClusterPlugin>> {
    plugins
        .state()
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace) && watched(p))
        .map(|p| ObjectRef::from_obj(&**p))
        .collect()
}

/// One namespace's watch: the Roles not labelled [`PLUGIN_NAME_LABEL`], each event judged by
/// [`may_have_drifted`] and sent to `events` when it may have; ends when `events` is closed.
/// Errors are retried with kube's default backoff (0.8 s doubling to 30 s).
async fn watch(
    api: Api<Tolerant<Role>>,
    mut events: mpsc::Sender<Role>,
    telemetry: Arc<Telemetry>,
) {
    let wc = crate::cache::watch_config().labels(&format!("!{PLUGIN_NAME_LABEL}"));
    // Tolerant reading ([`crate::tolerant`]): a Role that cannot be decoded is skipped (logged,
    // counted) and, when it turned unreadable, passed on as deleted, which is a trigger.
    let skipped = crate::tolerant::on_skipped("Role", telemetry.clone());
    let ghost = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        Some(Role {
            metadata: meta.clone(),
            ..Role::default()
        })
    };
    let mut stream = std::pin::pin!(
        tolerant::watcher(api, wc, StatusPolicy::PassWithout, skipped, ghost).default_backoff()
    );
    let mut lists = 0;
    while let Some(event) = stream.next().await {
        let role = match event {
            Ok(watcher::Event::Apply(role) | watcher::Event::InitApply(role)) => {
                may_have_drifted(&role, false).then_some(role)
            }
            Ok(watcher::Event::Delete(role)) => may_have_drifted(&role, true).then_some(role),
            Ok(watcher::Event::Init) => {
                telemetry.count_list("Role", &mut lists);
                None
            }
            Ok(watcher::Event::InitDone) => None,
            Err(error) => {
                warn!(%error, "watching vCluster Roles failed, retrying with backoff");
                None
            }
        };
        if let Some(role) = role {
            debug!(role = %role.name_any(), namespace = ?role.namespace(), "a vCluster Role may have drifted");
            if events.send(role).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn role(annotations: serde_json::Value, rules: serde_json::Value) -> Role {
        serde_json::from_value(json!({
            "metadata": { "name": "vc-my-vcluster", "namespace": "ns", "annotations": annotations },
            "rules": rules,
        }))
        .unwrap()
    }

    fn plugin(name: &str, namespace: &str, mode: &str, deleting: bool) -> VClusterPlugin {
        let mut p: VClusterPlugin = serde_json::from_value(json!({
            "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
            "metadata": { "name": name, "namespace": namespace },
            "spec": { "vcluster": { "name": "my-vcluster" }, "rbac": { "mode": mode } },
        }))
        .unwrap();
        if deleting {
            p.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
        }
        p
    }

    #[test]
    fn only_a_role_as_the_operator_leaves_it_is_no_trigger() {
        let cars =
            json!({ "apiGroups": ["example.loft.sh"], "resources": ["cars"], "verbs": ["get"] });
        let pods = json!({ "apiGroups": [""], "resources": ["pods"], "verbs": ["get"] });
        let record = json!({ "vcp.dev/added-rules.car-syncer": json!([cars]).to_string() });
        let held = role(record.clone(), json!([pods, cars]));
        assert!(!may_have_drifted(&held, false), "the operator's own result");
        assert!(may_have_drifted(&held, true), "deleted");
        assert!(
            may_have_drifted(&role(record, json!([pods])), false),
            "a recorded rule taken out"
        );
        assert!(
            may_have_drifted(&role(json!({}), json!([pods])), false),
            "no record (taken out with the rule, or never written)"
        );
        // A rule one plugin appended (a record as an older operator wrote it) and another
        // recorded as present: held while the Role has it; once the first plugin's restore
        // took it out, a trigger (the second one appends it again).
        let present = json!({ "added": [], "present": [cars] }).to_string();
        let shared = json!({
            "vcp.dev/added-rules.car-syncer": json!([cars]).to_string(),
            "vcp.dev/added-rules.other": present,
        });
        assert!(!may_have_drifted(&role(shared, json!([pods, cars])), false));
        assert!(
            may_have_drifted(
                &role(
                    json!({ "vcp.dev/added-rules.other": present }),
                    json!([pods])
                ),
                false
            ),
            "a rule recorded as present taken out"
        );
    }

    /// The watches follow the plugins: started by the first live plugin in the mode, kept while
    /// one remains, stopped when the last leaves the mode, is being deleted or is gone. (The
    /// client points at a closed port: the watches only fail and retry; their events are the
    /// end-to-end test's, `tests/tests/operator_drift.rs`.)
    #[tokio::test]
    async fn a_namespace_is_watched_while_a_live_patch_mode_plugin_is_in_it() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let (watches, _events) = PatchedRoleWatches::new(&client, &Arc::new(Telemetry::new()));
        let (store, mut writer) = kube::runtime::reflector::store();
        let mut event = |p: &VClusterPlugin, deleted: bool| {
            writer.apply_watcher_event(&if deleted {
                watcher::Event::Delete(p.clone())
            } else {
                watcher::Event::Apply(p.clone())
            });
            watches.sync(&store, p, deleted);
            watches.namespaces()
        };
        let none: Vec<String> = Vec::new();
        assert_eq!(
            event(&plugin("dedicated", "a", "Dedicated", false), false),
            none
        );
        let one = plugin("one", "a", "PatchVClusterRoles", false);
        let two = plugin("two", "a", "PatchVClusterRoles", false);
        assert_eq!(event(&one, false), ["a"]);
        assert_eq!(event(&two, false), ["a"]);
        assert_eq!(
            event(&plugin("b1", "b", "PatchVClusterRoles", false), false),
            ["a", "b"]
        );
        assert_eq!(
            event(&plugin("one", "a", "Dedicated", false), false),
            ["a", "b"],
            "two remains"
        );
        assert_eq!(
            event(&plugin("two", "a", "PatchVClusterRoles", true), false),
            ["b"],
            "deleting"
        );
        assert_eq!(
            event(&plugin("b1", "b", "PatchVClusterRoles", false), true),
            none,
            "gone"
        );
        // After a re-list: what the cache holds decides.
        writer.apply_watcher_event(&watcher::Event::Apply(two.clone()));
        watches.sync_all(&store);
        assert_eq!(watches.namespaces(), ["a"]);
        drop(watches);
    }

    #[test]
    fn the_plugins_of_a_role_are_the_namespaces_live_ones_in_patch_mode() {
        let (store, mut writer) = kube::runtime::reflector::store();
        for p in [
            plugin("patcher", "a", "PatchVClusterRoles", false),
            plugin("leaving", "a", "PatchVClusterRoles", true),
            plugin("dedicated", "a", "Dedicated", false),
            plugin("elsewhere", "b", "PatchVClusterRoles", false),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(p));
        }
        let names = |ns| {
            plugins_of_role(&store, ns)
                .into_iter()
                .map(|r| r.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(names("a"), ["patcher"]);
        assert_eq!(names("b"), ["elsewhere"]);
        assert!(names("c").is_empty());
    }
}

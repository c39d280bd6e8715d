//! Where an embedded plugin's pod hooks can take effect (pure; issue 48, "Hooks run where they
//! can take effect, by default").
//!
//! An embedded sidecar applies its `CreatePhysical` pod hooks to the host pod vCluster's syncer
//! has already created, and the API server refuses to change most of an existing pod's spec.
//! The rule is Kubernetes' `ValidatePodUpdate` (`pkg/apis/core/validation/validation.go`):
//! "pod updates may not change fields other than `spec.containers[*].image`,
//! `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only
//! additions to existing tolerations), `spec.terminationGracePeriodSeconds`"; metadata may
//! change. (The runtime applies the same rule to values, `syncer-runtime/src/pod_update.rs`;
//! here it is read off the hook's JSON Patch paths, before anything runs.)
//!
//! A hook that needs more than that takes effect only when vCluster calls it *before* it
//! creates the pod, which it does for a v2 plugin. So:
//! - an embedded plugin that names no `version` and has such a hook runs the v2 way
//!   ([`PluginKind::EmbeddedV2`](super::PluginKind::EmbeddedV2), [`super::plugin_kind`]);
//! - one that asks for the sidecar (`version: v1`) and has such a hook is refused
//!   ([`Reason::HookCannotTakeEffect`](vcp_crds::Reason::HookCannotTakeEffect),
//!   [`sidecar_refusal`]), with the workload untouched: a Warning Event for a hook that silently
//!   does nothing is not enough.

use vcp_crds::{HookEvent, JsonPatchOp, JsonPatchOperation, Reason, VClusterPlugin};

use super::identity::Refusal;

/// One JSON Patch operation of a `CreatePhysical` pod hook that changes what an existing pod
/// cannot change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateTimeChange {
    /// The hook's name.
    pub hook: String,
    /// The operation (`add`, `remove`, ...).
    pub op: &'static str,
    /// The JSON Pointer it changes (`path`, or `from` for the source a `move` removes).
    pub path: String,
}

impl std::fmt::Display for CreateTimeChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hook {}: {} {}", self.hook, self.op, self.path)
    }
}

/// The changes of `plugin`'s `CreatePhysical` hooks on `v1` `Pod`s that only take effect
/// before the pod is created, in declaration order: those in `spec` beyond what an existing pod
/// may change. Empty when every such hook changes only metadata (labels, annotations,
/// `jsonPatch` under `/metadata`) or the fields an existing pod may change.
pub fn create_time_changes(plugin: &VClusterPlugin) -> Vec<CreateTimeChange> {
    let mut out = Vec::new();
    for hook in &plugin.spec.hooks {
        if hook.api_version != "v1"
            || hook.kind != "Pod"
            || !hook.events.contains(&HookEvent::CreatePhysical)
        {
            continue;
        }
        for op in &hook.json_patch {
            for path in changed_paths(op) {
                if !changeable_on_an_existing_pod(op.op, path) {
                    out.push(CreateTimeChange {
                        hook: hook.name.clone(),
                        op: op_name(op.op),
                        path: path.to_string(),
                    });
                }
            }
        }
    }
    out
}

/// The pointers `op` changes: its `path` (but for `test`, which changes nothing), and for a
/// `move` the `from` it removes.
fn changed_paths(op: &JsonPatchOperation) -> Vec<&str> {
    match op.op {
        JsonPatchOp::Test => Vec::new(),
        JsonPatchOp::Move => std::iter::once(op.path.as_str())
            .chain(op.from.as_deref())
            .collect(),
        _ => vec![op.path.as_str()],
    }
}

/// Whether `op` at `path` needs no create time: the API server lets it change an existing pod
/// (module docs: the rule of `ValidatePodUpdate`), or it is outside `spec`, where running
/// before the pod exists would not help either (metadata changes apply to existing pods;
/// `status`, `apiVersion` and `kind` are not the hook's to write in either way). Conservative
/// within `spec`: `terminationGracePeriodSeconds` (allowed only from a negative value) and
/// `schedulingGates` (only removals) need create time, as does removing
/// `activeDeadlineSeconds` (it may only be set or lowered); a toleration is changeable only as
/// an `add` at the end (`/spec/tolerations/-`).
fn changeable_on_an_existing_pod(op: JsonPatchOp, path: &str) -> bool {
    if path != "/spec" && !path.starts_with("/spec/") {
        return true;
    }
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    match segments.as_slice() {
        ["spec", "containers" | "initContainers", index, "image"] => is_index(index),
        ["spec", "activeDeadlineSeconds"] => op != JsonPatchOp::Remove,
        ["spec", "tolerations", "-"] => op == JsonPatchOp::Add,
        _ => false,
    }
}

/// A JSON Pointer array index (`0`, `12`; RFC 6901 allows no leading zero).
fn is_index(segment: &str) -> bool {
    !segment.is_empty()
        && segment.bytes().all(|b| b.is_ascii_digit())
        && (segment == "0" || !segment.starts_with('0'))
}

fn op_name(op: JsonPatchOp) -> &'static str {
    match op {
        JsonPatchOp::Add => "add",
        JsonPatchOp::Remove => "remove",
        JsonPatchOp::Replace => "replace",
        JsonPatchOp::Move => "move",
        JsonPatchOp::Copy => "copy",
        JsonPatchOp::Test => "test",
    }
}

/// The refusal of an embedded plugin run as a sidecar (`version: v1`, no `image`) whose
/// `CreatePhysical` pod hooks change what an existing pod cannot change; `None` for any other
/// plugin.
pub fn sidecar_refusal(plugin: &VClusterPlugin) -> Option<Refusal> {
    if plugin.spec.image.is_some() || plugin.spec.version != Some(vcp_crds::PluginVersion::V1) {
        return None;
    }
    let changes = create_time_changes(plugin);
    if changes.is_empty() {
        return None;
    }
    let listed: Vec<String> = changes.iter().map(ToString::to_string).collect();
    Some(Refusal {
        reason: Reason::HookCannotTakeEffect,
        message: format!(
            "version: v1 runs the plugin as a sidecar, which applies its CreatePhysical pod hooks to pods vCluster has already created, and Kubernetes does not let these change on an existing pod: {}; remove `version` (the plugin then runs the v2 way, and vCluster calls the hooks before it creates each pod) or move these changes to /metadata",
            listed.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plugin(spec: serde_json::Value) -> VClusterPlugin {
        serde_json::from_value(json!({
            "apiVersion": "vcp.dev/v1alpha1",
            "kind": "VClusterPlugin",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn with_hook(version: Option<&str>, events: &[&str], ops: serde_json::Value) -> VClusterPlugin {
        let mut spec = json!({
            "vcluster": {"name": "vc"},
            "hooks": [{
                "name": "h",
                "apiVersion": "v1",
                "kind": "Pod",
                "events": events,
                "labels": {"a": "b"},
                "jsonPatch": ops,
            }],
        });
        if let Some(v) = version {
            spec["version"] = json!(v);
        }
        plugin(spec)
    }

    #[test]
    fn spec_changes_of_a_create_time_pod_hook_need_the_pod_not_to_exist_yet() {
        // the issue's own case: an env var added to the first container
        let p = with_hook(
            None,
            &["CreatePhysical"],
            json!([{"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "X", "value": "1"}]}]),
        );
        assert_eq!(
            create_time_changes(&p),
            vec![CreateTimeChange {
                hook: "h".into(),
                op: "add",
                path: "/spec/containers/0/env".into(),
            }]
        );
        // the shipped hooks-only sample's field
        let p = with_hook(
            None,
            &["CreatePhysical", "UpdatePhysical"],
            json!([{"op": "add", "path": "/spec/enableServiceLinks", "value": false}]),
        );
        assert_eq!(create_time_changes(&p).len(), 1);
    }

    #[test]
    fn what_an_existing_pod_may_change_is_not_a_create_time_change() {
        let p = with_hook(
            None,
            &["CreatePhysical"],
            json!([
                {"op": "add", "path": "/metadata/labels/x", "value": "y"},
                {"op": "replace", "path": "/spec/containers/0/image", "value": "i:2"},
                {"op": "replace", "path": "/spec/initContainers/10/image", "value": "i:2"},
                {"op": "add", "path": "/spec/activeDeadlineSeconds", "value": 60},
                {"op": "add", "path": "/spec/tolerations/-", "value": {"key": "k", "operator": "Exists"}},
                {"op": "test", "path": "/spec/nodeName", "value": "n"},
            ]),
        );
        assert_eq!(create_time_changes(&p), vec![]);
    }

    #[test]
    fn near_misses_of_the_changeable_fields_are_create_time_changes() {
        let p = with_hook(
            None,
            &["CreatePhysical"],
            json!([
                {"op": "replace", "path": "/spec/containers/0/name", "value": "n"},
                {"op": "replace", "path": "/spec/containers/00/image", "value": "i"},
                {"op": "replace", "path": "/spec/containers/-/image", "value": "i"},
                {"op": "replace", "path": "/spec/tolerations/0", "value": {}},
                {"op": "remove", "path": "/spec/tolerations/-"},
                {"op": "add", "path": "/spec/terminationGracePeriodSeconds", "value": 1},
                {"op": "move", "from": "/spec/nodeName", "path": "/metadata/annotations/n"},
                {"op": "add", "path": "/spec", "value": {}},
                {"op": "remove", "path": "/spec/activeDeadlineSeconds"},
                // outside spec: not the hook's to write, before or after the pod exists
                {"op": "add", "path": "/status/phase", "value": "Running"},
                {"op": "replace", "path": "/kind", "value": "Pod"},
            ]),
        );
        let paths: Vec<String> = create_time_changes(&p)
            .into_iter()
            .map(|c| c.path)
            .collect();
        assert_eq!(
            paths,
            [
                "/spec/containers/0/name",
                "/spec/containers/00/image",
                "/spec/containers/-/image",
                "/spec/tolerations/0",
                "/spec/tolerations/-",
                "/spec/terminationGracePeriodSeconds",
                "/spec/nodeName",
                "/spec",
                "/spec/activeDeadlineSeconds",
            ]
        );
    }

    #[test]
    fn only_create_physical_hooks_on_pods_count() {
        let op = json!([{"op": "add", "path": "/spec/containers/0/env", "value": []}]);
        for events in [
            &["UpdatePhysical"][..],
            &["CreateVirtual"],
            &["UpdateVirtual", "CreateVirtual"],
        ] {
            assert_eq!(
                create_time_changes(&with_hook(None, events, op.clone())),
                vec![]
            );
        }
        let mut p = with_hook(None, &["CreatePhysical"], op);
        p.spec.hooks[0].kind = "Service".into();
        assert_eq!(create_time_changes(&p), vec![]);
    }

    #[test]
    fn an_explicit_sidecar_with_a_create_time_change_is_refused() {
        let op = json!([{"op": "add", "path": "/spec/enableServiceLinks", "value": false}]);
        let refusal = sidecar_refusal(&with_hook(Some("v1"), &["CreatePhysical"], op.clone()))
            .expect("refused");
        assert_eq!(refusal.reason, Reason::HookCannotTakeEffect);
        assert!(
            refusal
                .message
                .contains("hook h: add /spec/enableServiceLinks"),
            "{}",
            refusal.message
        );
        // no version (it runs the v2 way) and explicit v2: not refused
        assert_eq!(
            sidecar_refusal(&with_hook(None, &["CreatePhysical"], op.clone())),
            None
        );
        assert_eq!(
            sidecar_refusal(&with_hook(Some("v2"), &["CreatePhysical"], op)),
            None
        );
        // a sidecar whose hooks change only metadata is not refused
        let labels_only = with_hook(Some("v1"), &["CreatePhysical"], json!([]));
        assert_eq!(sidecar_refusal(&labels_only), None);
    }

    /// The plan of a vCluster's workload: the plugin (no `version`) goes in the v2 way,
    /// as an init container, and the same plugin asking for the sidecar is refused and adds
    /// nothing.
    #[test]
    fn the_plan_runs_such_a_plugin_the_v2_way_or_refuses_the_sidecar() {
        use crate::workload::tests::{plugin as named, workload};
        use crate::workload::{PluginKind, plan, plugin_kind};
        let hooks = with_hook(
            None,
            &["CreatePhysical"],
            json!([{"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "X", "value": "1"}]}]),
        )
        .spec
        .hooks;
        let mut default = named("env-hook", None, None);
        default.spec.hooks = hooks.clone();
        assert_eq!(plugin_kind(&default), PluginKind::EmbeddedV2);
        let planned = plan(&workload(), &[&default], "runtime:1");
        assert_eq!(
            planned.patch["spec"]["template"]["spec"]["initContainers"][0]["command"],
            json!([
                "/usr/local/bin/vcluster-plugin-syncer",
                "install-plugin",
                "/plugins/env-hook"
            ])
        );
        assert!(planned.installed.contains("env-hook"));

        let mut sidecar = named("env-hook", None, Some(vcp_crds::PluginVersion::V1));
        sidecar.spec.hooks = hooks;
        assert_eq!(plugin_kind(&sidecar), PluginKind::Embedded);
        let planned = plan(&workload(), &[&sidecar], "runtime:1");
        assert!(planned.installed.is_empty());
        assert_eq!(
            planned.refused["env-hook"].reason,
            Reason::HookCannotTakeEffect
        );
        assert_eq!(
            planned.patch["spec"]["template"]["spec"].get("containers"),
            None
        );
    }
}

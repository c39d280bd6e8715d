//! Which hooks the runtime applies: only hooks the operator has accepted.
//!
//! The operator judges a plugin's hooks (its pod policy, and a dry run of a representative pod
//! against the namespace's Pod Security level) before it installs the plugin, and says so with
//! `WorkloadPatched=True` for the generation it judged ([`vcp_crds::accepted_by_operator`]).
//! The runtime watches the same `VClusterPlugin` and would otherwise see an edit before the
//! operator does: hooks edited after the judgement (a harmless label swapped for
//! `hostNetwork`, `privileged`, a `hostPath` mount) would then change vCluster's pods until the
//! operator took the plugin out of the workload. So the hooks in force are, for each version of
//! the spec the runtime sees:
//!
//! 1. the spec's hooks, when the operator accepted this generation (they are remembered as the
//!    last accepted hooks);
//! 2. the spec's hooks, when they are none, or equal to the last accepted hooks (nothing new
//!    would run);
//! 3. otherwise the last accepted hooks, until the operator has judged the new generation
//!    (a refused generation is taken out of the workload by the operator, which stops the
//!    runtime);
//! 4. [`InForce::Pending`] when no hooks were accepted yet in this process: a hooked type is not
//!    synced and vCluster's `Mutate` is answered with an error (vCluster retries the object), so
//!    no object is written without the hooks it declares, nor with hooks nobody judged.

use vcp_crds::Hook;
use vcp_crds::{VClusterPlugin, accepted_by_operator};

/// The hooks to apply for one version of the spec (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub enum InForce {
    /// Apply these hooks (the spec's, or the last accepted ones).
    Hooks(Vec<Hook>),
    /// No accepted hooks yet: hooked types wait, `Mutate` answers with this message.
    Pending(String),
}

impl InForce {
    /// The hooks to apply, or `None` while pending.
    pub fn hooks(&self) -> Option<&[Hook]> {
        match self {
            InForce::Hooks(hooks) => Some(hooks),
            InForce::Pending(_) => None,
        }
    }
}

/// The last hooks the operator accepted, as seen by this runtime process, with the uid of the
/// object they were accepted for (a plugin deleted and made again under its name is judged
/// anew).
#[derive(Clone, Debug, Default)]
pub struct HookGate {
    accepted: Option<(Option<String>, Vec<Hook>)>,
}

impl HookGate {
    /// The hooks in force for `plugin` as just read (its spec and status), remembering them when
    /// the operator accepted its generation.
    pub fn observe(&mut self, plugin: &VClusterPlugin) -> InForce {
        let hooks = &plugin.spec.hooks;
        let uid = &plugin.metadata.uid;
        if accepted_by_operator(plugin) {
            self.accepted = Some((uid.clone(), hooks.clone()));
            return InForce::Hooks(hooks.clone());
        }
        let accepted = self
            .accepted
            .as_ref()
            .filter(|(for_uid, _)| for_uid == uid)
            .map(|(_, accepted)| accepted);
        if hooks.is_empty() || accepted == Some(hooks) {
            return InForce::Hooks(hooks.clone());
        }
        match accepted {
            Some(accepted) => InForce::Hooks(accepted.clone()),
            None => InForce::Pending(format!(
                "the hooks of VClusterPlugin {} generation {} are not accepted by the operator yet (WorkloadPatched=True for that generation); they are applied once it has judged them",
                plugin.metadata.name.as_deref().unwrap_or_default(),
                plugin.metadata.generation.unwrap_or_default(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use serde_json::json;
    use vcp_crds::{VClusterPluginSpec, VClusterPluginStatus, WORKLOAD_PATCHED};

    fn hook(label: &str) -> Hook {
        serde_json::from_value(json!({
            "name": "h", "apiVersion": "v1", "kind": "Pod", "events": ["CreatePhysical"],
            "labels": {"by": label}
        }))
        .expect("a hook")
    }

    /// A plugin at `generation` with `hooks`, whose `WorkloadPatched` the operator wrote for
    /// `judged` (`True` when `accepted`).
    fn plugin(generation: i64, hooks: Vec<Hook>, judged: Option<(i64, bool)>) -> VClusterPlugin {
        let mut p = VClusterPlugin::new(
            "p",
            VClusterPluginSpec {
                hooks,
                ..Default::default()
            },
        );
        p.metadata.generation = Some(generation);
        p.status = judged.map(|(g, accepted)| VClusterPluginStatus {
            conditions: vec![Condition {
                type_: WORKLOAD_PATCHED.into(),
                status: if accepted { "True" } else { "False" }.into(),
                reason: "x".into(),
                message: String::new(),
                observed_generation: Some(g),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            }],
            ..Default::default()
        });
        p
    }

    #[test]
    fn hooks_nobody_accepted_are_pending() {
        let mut gate = HookGate::default();
        let in_force = gate.observe(&plugin(1, vec![hook("a")], None));
        let InForce::Pending(message) = in_force else {
            panic!("pending: {in_force:?}")
        };
        assert!(message.contains("generation 1"), "{message}");
        // judged for an older generation only, or refused: still pending
        assert!(
            gate.observe(&plugin(2, vec![hook("a")], Some((1, true))))
                .hooks()
                .is_none()
        );
        assert!(
            gate.observe(&plugin(2, vec![hook("a")], Some((2, false))))
                .hooks()
                .is_none()
        );
    }

    #[test]
    fn accepted_hooks_apply_and_stay_in_force_while_an_edit_waits() {
        let mut gate = HookGate::default();
        assert_eq!(
            gate.observe(&plugin(1, vec![hook("a")], Some((1, true)))),
            InForce::Hooks(vec![hook("a")])
        );
        // the author edits the hooks: the runtime sees generation 2 before the operator judged it
        assert_eq!(
            gate.observe(&plugin(2, vec![hook("evil")], Some((1, true)))),
            InForce::Hooks(vec![hook("a")])
        );
        // the operator refuses it: the accepted hooks stay (the operator removes the plugin)
        assert_eq!(
            gate.observe(&plugin(2, vec![hook("evil")], Some((2, false)))),
            InForce::Hooks(vec![hook("a")])
        );
        // a later edit the operator accepts replaces them
        assert_eq!(
            gate.observe(&plugin(3, vec![hook("b")], Some((3, true)))),
            InForce::Hooks(vec![hook("b")])
        );
    }

    #[test]
    fn hooks_accepted_for_a_deleted_plugin_do_not_apply_to_its_successor() {
        let mut gate = HookGate::default();
        let mut first = plugin(1, vec![hook("a")], Some((1, true)));
        first.metadata.uid = Some("uid-1".into());
        assert_eq!(gate.observe(&first), InForce::Hooks(vec![hook("a")]));
        let mut second = plugin(1, vec![hook("b")], None);
        second.metadata.uid = Some("uid-2".into());
        assert!(gate.observe(&second).hooks().is_none());
        // not even the same hooks: the new object is judged anew
        let mut again = plugin(1, vec![hook("a")], None);
        again.metadata.uid = Some("uid-2".into());
        assert!(gate.observe(&again).hooks().is_none());
    }

    /// The seventh security review: the operator's `Terminating` status says
    /// `WorkloadPatched=True` for the deleting generation without judging it; hooks it had
    /// refused just before the delete must not come into force then.
    #[test]
    fn a_plugin_being_deleted_keeps_the_hooks_accepted_before() {
        let mut gate = HookGate::default();
        gate.observe(&plugin(1, vec![hook("a")], Some((1, true))));
        assert_eq!(
            gate.observe(&plugin(2, vec![hook("evil")], Some((2, false)))),
            InForce::Hooks(vec![hook("a")])
        );
        let mut deleting = plugin(2, vec![hook("evil")], Some((2, true)));
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(gate.observe(&deleting), InForce::Hooks(vec![hook("a")]));
    }

    #[test]
    fn no_hooks_or_the_accepted_ones_need_no_new_judgement() {
        let mut gate = HookGate::default();
        assert_eq!(
            gate.observe(&plugin(1, vec![], None)),
            InForce::Hooks(vec![])
        );
        gate.observe(&plugin(2, vec![hook("a")], Some((2, true))));
        // an edit of something else (generation 3, same hooks), not judged yet
        assert_eq!(
            gate.observe(&plugin(3, vec![hook("a")], Some((2, true)))),
            InForce::Hooks(vec![hook("a")])
        );
        // the hooks removed, not judged yet: none apply
        assert_eq!(
            gate.observe(&plugin(4, vec![], Some((3, true)))),
            InForce::Hooks(vec![])
        );
    }
}

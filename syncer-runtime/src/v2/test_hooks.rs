//! Hooks shared by the unit tests of the v2 protocol (`mutate`, `server`); test-only.

use serde_json::{Value, json};

use crate::hooks::{ClientHook, HookError, HookPoint};

/// The tutorial's pod hook in its JSON form: the label `created-by-plugin=pod-hook` on host
/// pods, at the physical points listed (create and update labelled alike).
pub(super) struct PodHook(pub &'static [HookPoint]);

impl ClientHook for PodHook {
    fn name(&self) -> &str {
        "pod-hook"
    }
    fn api_version(&self) -> &str {
        "v1"
    }
    fn kind(&self) -> &str {
        "Pod"
    }
    fn handles(&self, point: HookPoint) -> bool {
        self.0.contains(&point)
    }
    fn mutate_create_physical(&self, mut obj: Value) -> Result<Value, HookError> {
        obj["metadata"]["labels"]["created-by-plugin"] = json!("pod-hook");
        Ok(obj)
    }
    fn mutate_update_physical(&self, obj: Value) -> Result<Value, HookError> {
        self.mutate_create_physical(obj)
    }
}

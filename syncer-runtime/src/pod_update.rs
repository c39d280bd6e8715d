//! What a hook may change on a pod that already exists (pure).
//!
//! The API server refuses an update of an existing pod that changes its spec anywhere but in a
//! few fields. The rule is Kubernetes' own `ValidatePodUpdate`
//! (`pkg/apis/core/validation/validation.go`): "pod updates may not change fields other than
//! `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`,
//! `spec.tolerations` (only additions to existing tolerations),
//! `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously
//! negative)" (plus removing `spec.schedulingGates`). Metadata (labels, annotations) may change;
//! `status` is not written through the pod itself.
//!
//! So an `UpdatePhysical` hook (or, beside a vCluster, any physical pod hook: the pods exist
//! already) whose changes reach other spec fields — `spec.containers[0].name`,
//! `spec.nodeName`, `spec.serviceAccountName`, `spec.volumes`, ports, ... — would be refused on
//! every attempt, and with it the labels of the same write. [`mutable_update`] keeps what the
//! API server accepts: the hook's metadata changes always, its spec changes only when every one
//! of them is allowed (all or none, so that a container is never half-changed); the rest is
//! reported as skipped, by JSON pointer, for one `Warning` Event and a log line
//! ([`ImmutablePodFields`](vcp_crds::Reason::ImmutablePodFields)).
//!
//! Conservative where the rule depends on values: tolerations may only be appended (an added
//! entry at the end), `terminationGracePeriodSeconds` and `schedulingGates` count as immutable.

use serde_json::Value;

/// The update of an existing pod that the API server accepts, from the pod as it is
/// (`current`) and as the hooks would make it (`desired`), both full pod JSON objects.
#[derive(Clone, Debug, PartialEq)]
pub struct PodUpdate {
    /// `current` with the metadata of `desired` and, when all of them are allowed, its spec
    /// changes.
    pub desired: Value,
    /// JSON pointers (such as `/spec/containers/0/name`) of the changes left out, in order;
    /// empty when `desired` is kept whole.
    pub skipped: Vec<String>,
}

/// Splits the change from `current` to `desired` of an existing pod into what the API server
/// accepts and what it would refuse (see the module documentation for the rule's source).
pub fn mutable_update(current: &Value, desired: &Value) -> PodUpdate {
    let mut skipped = Vec::new();
    let mut allowed_spec = true;
    for op in json_patch::diff(current, desired).0 {
        let op = serde_json::to_value(&op).unwrap_or_default();
        let path = op["path"].as_str().unwrap_or_default().to_string();
        if path == "/metadata" || path.starts_with("/metadata/") {
            continue;
        }
        if let Some(spec_path) = path.strip_prefix("/spec") {
            if !spec_change_allowed(current, op["op"].as_str().unwrap_or_default(), spec_path) {
                allowed_spec = false;
            }
            skipped.push(path);
            continue;
        }
        // `status` and anything else outside metadata and spec.
        skipped.push(path);
        allowed_spec = false;
    }
    let mut out = current.clone();
    if let Some(metadata) = desired.get("metadata") {
        out["metadata"] = metadata.clone();
    }
    if allowed_spec {
        if let Some(spec) = desired.get("spec") {
            out["spec"] = spec.clone();
        }
        skipped.clear();
    }
    PodUpdate {
        desired: out,
        skipped,
    }
}

/// Whether the JSON-patch operation `op` at `path` (relative to `spec`) is one the API server
/// allows on an existing pod.
fn spec_change_allowed(current: &Value, op: &str, path: &str) -> bool {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["containers" | "initContainers", index, "image"] => {
            op == "replace" && index.parse::<usize>().is_ok()
        }
        ["activeDeadlineSeconds"] => true,
        ["tolerations"] => op == "add",
        ["tolerations", index] => {
            let existing = current["spec"]["tolerations"]
                .as_array()
                .map_or(0, Vec::len);
            op == "add" && index.parse::<usize>().is_ok_and(|i| i >= existing)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;

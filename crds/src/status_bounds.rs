//! Size bounds of `VClusterPlugin.status`, in the CRD's schema and in the writers that keep
//! within them.
//!
//! The status is written by the operator and by each plugin's runtime, as the vCluster's
//! ServiceAccount, which a tenant with `edit` may impersonate
//! (`config/admission/status-writers.yaml`). Without bounds, any such identity could store a
//! status of megabytes (a `syncedObjects` list of 1.3 MB was accepted), which every watcher of
//! plugins, the operator among them, then holds and decodes. The schema bounds every list and
//! string of the status, so the API server refuses an oversized write whoever sends it:
//!
//! | field | bound | source |
//! | --- | --- | --- |
//! | `conditions` | [`MAX_CONDITIONS`] items; `type` [`MAX_CONDITION_TYPE`], `reason` [`MAX_CONDITION_REASON`], `message` [`MAX_CONDITION_MESSAGE`] characters; `status` `True`, `False` or `Unknown` | the markers of Kubernetes' `metav1.Condition` (`apimachinery/pkg/apis/meta/v1/types.go`); four condition types exist |
//! | `syncedObjects` | [`MAX_SYNCED_OBJECTS`] items; `apiVersion` 317, `kind` 63 characters; counts ≥ 0 | the spec's own bounds of an `apiVersion` and a `kind` |
//! | `runtime` | 512 characters | `spec.image`'s bound |
//! | `workload` | `kind` 63, `name` 253 characters | a kind; a DNS subdomain name |
//!
//! The writers keep within them and never fail their report for it: [`crate::condition`] cuts a
//! message longer than [`MAX_CONDITION_MESSAGE`] ([`bounded_message`]); the runtime lists at most
//! [`MAX_SYNCED_OBJECTS`] kinds in `syncedObjects` and says in its `RuntimeHealthy` message how
//! many it left out (their objects stay counted in `syncedTotal`).

use schemars::Schema;
use serde_json::{Value, json};

/// Most entries of `status.syncedObjects`. A plugin syncs at most 32 types; the kinds its types
/// bring back (`produced`) add entries only when no synced type has the same `apiVersion` and
/// `kind`, so a plugin with more than 64 distinct kinds is one no real sync needs.
pub const MAX_SYNCED_OBJECTS: usize = 64;

/// Most entries of `status.conditions`: the four types `Ready`, `WorkloadPatched`, `RBACReady`
/// and `RuntimeHealthy`, and room for as many more.
pub const MAX_CONDITIONS: usize = 8;

/// Most characters of a condition's `message` (Kubernetes' `metav1.Condition`: 32768).
pub const MAX_CONDITION_MESSAGE: usize = 32768;

/// Most characters of a condition's `reason` (Kubernetes' `metav1.Condition`: 1024).
pub const MAX_CONDITION_REASON: usize = 1024;

/// Most characters of a condition's `type` (Kubernetes' `metav1.Condition`: 316).
pub const MAX_CONDITION_TYPE: usize = 316;

/// Field transform of `status.conditions`: the list and the strings of each condition bounded
/// as in the table of the module docs. Leaves a schema without inline item properties as it
/// is (the crate's test `status_is_bounded_in_the_crd` checks the generated CRD).
pub fn bounded_conditions(schema: &mut Schema) {
    schema.insert("maxItems".into(), json!(MAX_CONDITIONS));
    let Some(properties) = schema
        .get_mut("items")
        .and_then(|items| items.get_mut("properties"))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for (field, max) in [
        ("type", MAX_CONDITION_TYPE),
        ("reason", MAX_CONDITION_REASON),
        ("message", MAX_CONDITION_MESSAGE),
    ] {
        if let Some(Value::Object(p)) = properties.get_mut(field) {
            p.insert("maxLength".into(), json!(max));
        }
    }
    if let Some(Value::Object(p)) = properties.get_mut("status") {
        p.insert("enum".into(), json!(["True", "False", "Unknown"]));
    }
}

/// `message` cut to at most [`MAX_CONDITION_MESSAGE`] characters (Unicode scalar values, as the
/// API server counts `maxLength`), ending in ` … (N characters left out)` when cut; unchanged
/// when it fits.
pub fn bounded_message(message: String) -> String {
    bounded_to(message, MAX_CONDITION_MESSAGE)
}

/// `text` cut to at most `max` characters, as [`bounded_message`] does.
fn bounded_to(text: String, max: usize) -> String {
    let total = text.chars().count();
    if total <= max {
        return text;
    }
    // the note's length with the digits of `total`, at least those of the count left out
    let note_len = |omitted: usize| {
        format!(" … ({omitted} characters left out)")
            .chars()
            .count()
    };
    let kept = max.saturating_sub(note_len(total));
    let mut out: String = text.chars().take(kept).collect();
    out.push_str(&format!(" … ({} characters left out)", total - kept));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_within_the_bound_is_unchanged() {
        let fits = "é".repeat(MAX_CONDITION_MESSAGE);
        assert_eq!(bounded_message(fits.clone()), fits);
        assert_eq!(bounded_message(String::new()), "");
    }

    #[test]
    fn a_long_message_is_cut_to_the_bound_and_says_how_much_is_left_out() {
        // multi-byte characters: the bound counts characters, as the API server does
        let long = "é".repeat(MAX_CONDITION_MESSAGE + 1000);
        let cut = bounded_message(long);
        // within the bound, and close to it (the note's digits may be one fewer than planned)
        let len = cut.chars().count();
        assert!(
            (MAX_CONDITION_MESSAGE - 1..=MAX_CONDITION_MESSAGE).contains(&len),
            "{len}"
        );
        let kept = cut.chars().take_while(|c| *c == 'é').count();
        assert_eq!(
            cut,
            format!(
                "{} … ({} characters left out)",
                "é".repeat(kept),
                MAX_CONDITION_MESSAGE + 1000 - kept
            )
        );
        // small bounds: every length up to the bound, never over
        for len in 0..40 {
            let cut = bounded_to("x".repeat(len), 30);
            assert!(cut.chars().count() <= 30, "{len}: {cut}");
            if len <= 30 {
                assert_eq!(cut.len(), len);
            } else {
                assert!(cut.ends_with(" characters left out)"), "{cut}");
            }
        }
    }
}

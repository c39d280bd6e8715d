//! Keys folded the way vCluster's decoder matches them (pure): Go's `encoding/json` matches a
//! JSON key to a struct field case-insensitively, with Unicode simple folding (its `fold.go`:
//! `bytes.EqualFold`). One fold for every Rust check of a spelling: the operator's judge of
//! hooks (`operator/src/judge/hooks.rs`), its pod policy (`operator/src/policy/pod.rs`) and
//! [`crate::patch_path::PatchPath::is_protected`]. The CRD's CEL folds the same way
//! (`crate::plugin`'s `folded_pointer`, and `PROTECTED_PATCH_PATH_RULE`).

/// A JSON key folded the way Go's `encoding/json` matches keys to struct fields (`fold.go`:
/// equal under `bytes.EqualFold`, Unicode simple folding), for comparison with ASCII field
/// names: ASCII letters lower-cased, and the two non-ASCII letters whose fold is an ASCII one,
/// `ſ` (U+017F) as `s` and `K` (U+212A KELVIN SIGN) as `k`; other characters are kept (they
/// equal no ASCII letter).
pub fn go_fold(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            '\u{017f}' => 's',
            '\u{212a}' => 'k',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::go_fold;

    #[test]
    fn go_fold_matches_as_encoding_json_does() {
        assert_eq!(go_fold("Finalizers"), "finalizers");
        assert_eq!(go_fold("OwnerReferences"), "ownerreferences");
        // U+017F LATIN SMALL LETTER LONG S and U+212A KELVIN SIGN fold to ASCII letters.
        assert_eq!(go_fold("finalizer\u{17f}"), "finalizers");
        assert_eq!(go_fold("\u{212a}ind"), "kind");
        // Other non-ASCII letters equal no ASCII one.
        assert_ne!(go_fold("nam\u{e9}"), "name");
    }
}

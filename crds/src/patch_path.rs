//! The paths of `syncedTypes[].patches[]` (vCluster's `TranslatePatch.path` and the relative
//! paths of its `reference`), parsed, read and written over a [`serde_json::Value`] (pure).
//!
//! The notation is vCluster's, as its documentation of `sync.*.patches` describes it ("Path
//! syntax"): fields joined by dots (`spec.issuerRef.name`); brackets for map keys that contain
//! `.`, `[` or `]`, quoted with `"` or `'` (`metadata.annotations["example.com/key"]`); a
//! number in brackets for an array element (`spec.rules[0]`); and `[*]` for every element of an
//! array or every value of a map ("All entries": the patch runs once for each). A path that is
//! not found is skipped (vCluster's `config.TranslatePatch.path`: "If the path is not found
//! within the patch, the patch is not applied").
//!
//! Nothing here knows about patches' meaning: `syncer-runtime`'s `patches` module applies them,
//! the operator refuses a path that does not parse ([`PatchPath::parse`]) and the CRD's CEL
//! rule (`crate::plugin::PROTECTED_PATCH_PATH_RULE`) and [`PatchPath::is_protected`] refuse a
//! path that would write an object's identity.

use std::fmt;

use serde_json::Value;

/// One step of a [`PatchPath`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// A map key (`a`, `["a.b"]`, `['a']`). On an array, a key made of digits is read as an
    /// index too (vCluster's dotted form `spec.rules.0`).
    Key(String),
    /// An array index (`[0]`).
    Index(usize),
    /// Every element of an array, every value of a map (`[*]`).
    All,
}

/// One concrete step of a [`Location`]: a key or an index, never `[*]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A map key.
    Key(String),
    /// An array index.
    Index(usize),
}

/// Why a path does not parse: the message names the byte offset in the path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid patch path {path:?} at byte {offset}: {message}")]
pub struct PathError {
    /// The path given.
    pub path: String,
    /// Byte offset of the problem.
    pub offset: usize,
    /// What is wrong.
    pub message: &'static str,
}

/// A parsed patch path (see the module docs for the notation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchPath {
    segments: Vec<Segment>,
}

/// Where one value of a [`PatchPath`] was found: the concrete keys and indexes from the root
/// (a path with `[*]` has one location per element).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Location(pub Vec<Step>);

impl PatchPath {
    /// Parses `path` in vCluster's notation.
    ///
    /// # Errors
    /// [`PathError`] for an empty path or segment (`a..b`, `.a`, `a.`), an unterminated or
    /// unquoted-and-non-numeric bracket (`a[b]`: keys in brackets are quoted), a quote that is
    /// not closed, or text right after a closing bracket that is neither `.` nor `[`.
    pub fn parse(path: &str) -> Result<PatchPath, PathError> {
        let err = |offset: usize, message: &'static str| PathError {
            path: path.to_string(),
            offset,
            message,
        };
        let bytes = path.as_bytes();
        let mut segments = Vec::new();
        let mut i = 0;
        if bytes.is_empty() {
            return Err(err(0, "the path is empty"));
        }
        // whether the next character starts a segment that must be a plain key (after a dot, or
        // at the start)
        let mut expect_key = true;
        while i < bytes.len() {
            match bytes[i] {
                b'[' => {
                    let start = i;
                    i += 1;
                    match bytes.get(i) {
                        Some(b'*') if bytes.get(i + 1) == Some(&b']') => {
                            segments.push(Segment::All);
                            i += 2;
                        }
                        Some(&quote @ (b'"' | b'\'')) => {
                            i += 1;
                            let key_start = i;
                            while i < bytes.len() && bytes[i] != quote {
                                i += 1;
                            }
                            if i >= bytes.len() {
                                return Err(err(start, "a quoted key is not closed"));
                            }
                            let key = &path[key_start..i];
                            i += 1;
                            if bytes.get(i) != Some(&b']') {
                                return Err(err(i, "a quoted key must be followed by ']'"));
                            }
                            i += 1;
                            segments.push(Segment::Key(key.to_string()));
                        }
                        Some(b'0'..=b'9') => {
                            let digits_start = i;
                            while i < bytes.len() && bytes[i].is_ascii_digit() {
                                i += 1;
                            }
                            if bytes.get(i) != Some(&b']') {
                                return Err(err(i, "an index must be followed by ']'"));
                            }
                            let index = path[digits_start..i]
                                .parse::<usize>()
                                .map_err(|_| err(digits_start, "the index is too large"))?;
                            i += 1;
                            segments.push(Segment::Index(index));
                        }
                        _ => {
                            return Err(err(
                                start,
                                "a bracket holds a number, [*], or a key in quotes",
                            ));
                        }
                    }
                    expect_key = false;
                    match bytes.get(i) {
                        None | Some(b'[') => {}
                        Some(b'.') => {
                            i += 1;
                            expect_key = true;
                            if i >= bytes.len() {
                                return Err(err(i, "the path ends with '.'"));
                            }
                        }
                        Some(_) => return Err(err(i, "expected '.' or '[' after ']'")),
                    }
                }
                b'.' => return Err(err(i, "an empty segment")),
                b']' => return Err(err(i, "']' without '['")),
                _ => {
                    if !expect_key {
                        return Err(err(i, "expected '.' or '['"));
                    }
                    let start = i;
                    while i < bytes.len() && !matches!(bytes[i], b'.' | b'[' | b']') {
                        i += 1;
                    }
                    let key = &path[start..i];
                    segments.push(if key == "*" {
                        Segment::All
                    } else {
                        Segment::Key(key.to_string())
                    });
                    expect_key = false;
                    if bytes.get(i) == Some(&b'.') {
                        i += 1;
                        expect_key = true;
                        if i >= bytes.len() {
                            return Err(err(i, "the path ends with '.'"));
                        }
                    }
                }
            }
        }
        Ok(PatchPath { segments })
    }

    /// The parsed segments.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Every location of `root` the path reaches, in document order (arrays by index, maps in
    /// their key order); empty when the path is not found. Each `[*]` fans out over the
    /// elements present.
    pub fn locate(&self, root: &Value) -> Vec<Location> {
        let mut found = Vec::new();
        walk(root, &self.segments, &mut Vec::new(), &mut found);
        found
    }

    /// The first value the path reaches in `root`, if any (what vCluster reads for a relative
    /// `namePath`, `namespacePath`, `kindPath` or `apiVersionPath`; also the getter the
    /// `produced` objects read their `namePath` with).
    pub fn get<'a>(&self, root: &'a Value) -> Option<&'a Value> {
        let location = self.locate(root).into_iter().next()?;
        location.get(root)
    }

    /// Whether a write at this path could change what vCluster and the runtime identify an
    /// object by: `apiVersion`, `kind`, `metadata` as a whole or any of its fields through
    /// `[*]`, `metadata.name`, `namespace`, `generateName`, `uid`, `ownerReferences`,
    /// `finalizers` (or below them), `metadata.labels` / `metadata.annotations` as a whole or
    /// through `[*]`, a `vcluster.loft.sh/` label or annotation, and the label
    /// [`crate::RESERVED_LABELS`] (`release`). Keys are folded as the
    /// hooks' rule folds them (the CRD's `protected_path_rule` of `JsonPatchOperation`: ASCII
    /// lower case, `ſ` → `s`, `K` → `k`, Go's `encoding/json` field matching), so
    /// `metadata.Name` is protected like `metadata.name`, and an upper-case spelling of the
    /// `vcluster.loft.sh/` prefix (not a valid label key anyway) like the lower-case one. The
    /// CRD refuses the same paths with CEL (`PROTECTED_PATCH_PATH_RULE`); the runtime checks
    /// again before it writes.
    pub fn is_protected(&self) -> bool {
        let fold = crate::fold::go_fold;
        let mut segments = self.segments.iter();
        let first = match segments.next() {
            Some(Segment::Key(key)) => fold(key),
            Some(Segment::All) => return true,
            _ => return false,
        };
        if first == "apiversion" || first == "kind" {
            return true;
        }
        if first != "metadata" {
            return false;
        }
        let second = match segments.next() {
            None | Some(Segment::All) => return true,
            Some(Segment::Key(key)) => fold(key),
            Some(Segment::Index(_)) => return false,
        };
        match second.as_str() {
            "name" | "namespace" | "generatename" | "uid" | "ownerreferences" | "finalizers" => {
                true
            }
            "labels" | "annotations" => match segments.next() {
                None | Some(Segment::All) => true,
                Some(Segment::Key(key)) => {
                    let key = fold(key);
                    key.starts_with("vcluster.loft.sh/")
                        || (second == "labels"
                            && crate::RESERVED_LABELS.contains(&key.as_str())
                            && segments.next().is_none())
                }
                Some(Segment::Index(_)) => false,
            },
            _ => false,
        }
    }
}

/// Every path of `synced_types[].patches[]` (the patch's `path` and a reference's relative
/// paths) and of `synced_types[].produced[].namePath` that cannot be used: it does not parse,
/// or (a patch's `path`, a reference's `namePath` and `namespacePath`, the paths a patch
/// writes) it names the object's identity ([`PatchPath::is_protected`]; a reference's relative
/// path is read from the object's root, where the runtime reads `namespacePath` when the value
/// at `path` is a string). One message per path, naming its field
/// (`spec.syncedTypes[1].patches[0].path: …`); empty when all are usable. The CRD's CEL refuses
/// the protected paths it can see; this is what the operator checks before it installs (the
/// syntax is beyond CEL), and the runtime checks again.
pub fn unusable_patch_paths(synced_types: &[crate::SyncedType]) -> Vec<String> {
    let mut found = Vec::new();
    for (t, synced) in synced_types.iter().enumerate() {
        for (p, patch) in synced.patches.iter().enumerate() {
            let field = format!("spec.syncedTypes[{t}].patches[{p}]");
            match PatchPath::parse(&patch.path) {
                Err(e) => found.push(format!("{field}.path: {e}")),
                Ok(path) if path.is_protected() => found.push(format!(
                    "{field}.path: {:?} writes the object's identity or a vcluster.loft.sh/ key",
                    patch.path
                )),
                Ok(_) => {}
            }
            let Some(reference) = &patch.reference else {
                continue;
            };
            for (name, relative, written) in [
                ("apiVersionPath", &reference.api_version_path, false),
                ("kindPath", &reference.kind_path, false),
                ("namePath", &reference.name_path, true),
                ("namespacePath", &reference.namespace_path, true),
            ] {
                match relative.as_deref().map(PatchPath::parse) {
                    Some(Err(e)) => found.push(format!("{field}.reference.{name}: {e}")),
                    Some(Ok(path)) if written && path.is_protected() => found.push(format!(
                        "{field}.reference.{name}: {:?} writes the object's identity or a vcluster.loft.sh/ key",
                        relative.as_deref().unwrap_or_default()
                    )),
                    _ => {}
                }
            }
        }
        for (p, produced) in synced.produced.iter().enumerate() {
            if let Err(e) = PatchPath::parse(&produced.name_path) {
                found.push(format!("spec.syncedTypes[{t}].produced[{p}].namePath: {e}"));
            }
        }
    }
    found
}

impl fmt::Display for PatchPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, segment) in self.segments.iter().enumerate() {
            match segment {
                Segment::Key(key) => write_key(f, n, key)?,
                Segment::Index(index) => write!(f, "[{index}]")?,
                Segment::All => write!(f, "[*]")?,
            }
        }
        Ok(())
    }
}

/// Writes `key` as the `n`-th segment: dotted when it is a plain key, in brackets otherwise.
fn write_key(f: &mut fmt::Formatter<'_>, n: usize, key: &str) -> fmt::Result {
    let plain = !key.is_empty() && key != "*" && !key.contains(['.', '[', ']', '"', '\'']);
    if plain {
        if n > 0 {
            write!(f, ".")?;
        }
        write!(f, "{key}")
    } else if key.contains('"') {
        write!(f, "['{key}']")
    } else {
        write!(f, "[\"{key}\"]")
    }
}

fn walk(value: &Value, segments: &[Segment], at: &mut Vec<Step>, found: &mut Vec<Location>) {
    let Some((first, rest)) = segments.split_first() else {
        found.push(Location(at.clone()));
        return;
    };
    let mut descend = |step: Step, child: &Value, at: &mut Vec<Step>| {
        at.push(step);
        walk(child, rest, at, found);
        at.pop();
    };
    match (first, value) {
        (Segment::Key(key), Value::Object(map)) => {
            if let Some(child) = map.get(key) {
                descend(Step::Key(key.clone()), child, at);
            }
        }
        (Segment::Key(key), Value::Array(items)) => {
            if let Some((index, child)) = key
                .parse::<usize>()
                .ok()
                .and_then(|i| items.get(i).map(|c| (i, c)))
            {
                descend(Step::Index(index), child, at);
            }
        }
        (Segment::Index(index), Value::Array(items)) => {
            if let Some(child) = items.get(*index) {
                descend(Step::Index(*index), child, at);
            }
        }
        (Segment::All, Value::Array(items)) => {
            for (index, child) in items.iter().enumerate() {
                descend(Step::Index(index), child, at);
            }
        }
        (Segment::All, Value::Object(map)) => {
            for (key, child) in map {
                descend(Step::Key(key.clone()), child, at);
            }
        }
        _ => {}
    }
}

impl Location {
    /// The value at this location of `root`, if it is there.
    pub fn get<'a>(&self, root: &'a Value) -> Option<&'a Value> {
        self.0.iter().try_fold(root, |value, step| match step {
            Step::Key(key) => value.as_object()?.get(key),
            Step::Index(index) => value.as_array()?.get(*index),
        })
    }

    /// The value at this location of `root`, mutable, if it is there.
    pub fn get_mut<'a>(&self, root: &'a mut Value) -> Option<&'a mut Value> {
        self.0.iter().try_fold(root, |value, step| match step {
            Step::Key(key) => value.as_object_mut()?.get_mut(key),
            Step::Index(index) => value.as_array_mut()?.get_mut(*index),
        })
    }

    /// Replaces the value at this location of `root` with `value`; `None` removes it (a map
    /// key is removed; an array element becomes `null`, so the other locations of the same
    /// `[*]` keep their indexes). Returns whether the location was there.
    pub fn set(&self, root: &mut Value, value: Option<Value>) -> bool {
        let Some((last, parent)) = self.0.split_last() else {
            return match value {
                Some(v) => {
                    *root = v;
                    true
                }
                None => false,
            };
        };
        let Some(parent) = Location(parent.to_vec()).get_mut(root) else {
            return false;
        };
        match (last, parent, value) {
            (Step::Key(key), Value::Object(map), Some(v)) => match map.get_mut(key) {
                Some(slot) => {
                    *slot = v;
                    true
                }
                None => false,
            },
            (Step::Key(key), Value::Object(map), None) => map.remove(key).is_some(),
            (Step::Index(index), Value::Array(items), v) => match items.get_mut(*index) {
                Some(slot) => {
                    *slot = v.unwrap_or(Value::Null);
                    true
                }
                None => false,
            },
            _ => false,
        }
    }

    /// This location followed by `relative` (a path relative to the value found here, such as a
    /// reference's `namePath`): every location of `root` it reaches.
    pub fn join(&self, relative: &PatchPath, root: &Value) -> Vec<Location> {
        let Some(here) = self.get(root) else {
            return Vec::new();
        };
        relative
            .locate(here)
            .into_iter()
            .map(|tail| Location(self.0.iter().cloned().chain(tail.0).collect()))
            .collect()
    }
}

impl fmt::Display for Location {
    /// The location in vCluster's notation (`spec.rules[0].name`): the `context.path` an
    /// expression sees.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, step) in self.0.iter().enumerate() {
            match step {
                Step::Key(key) => write_key(f, n, key)?,
                Step::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys(path: &str) -> Vec<Segment> {
        PatchPath::parse(path)
            .unwrap_or_else(|e| panic!("{e}"))
            .segments
    }

    fn k(key: &str) -> Segment {
        Segment::Key(key.into())
    }

    #[test]
    fn vclusters_notation_parses() {
        // the documented examples (vCluster's docs, "Path syntax")
        assert_eq!(
            keys(r#"metadata.annotations["example.com/key"]"#),
            [k("metadata"), k("annotations"), k("example.com/key")]
        );
        assert_eq!(
            keys("spec.containers[*].env[*].value"),
            [
                k("spec"),
                k("containers"),
                Segment::All,
                k("env"),
                Segment::All,
                k("value")
            ]
        );
        assert_eq!(
            keys("spec.rules[0].name"),
            [k("spec"), k("rules"), Segment::Index(0), k("name")]
        );
        assert_eq!(
            keys("a['x.y'][\"b]c\"][12]"),
            [k("a"), k("x.y"), k("b]c"), Segment::Index(12)]
        );
        assert_eq!(keys("spec.secretName"), [k("spec"), k("secretName")]);
        assert_eq!(keys("a.*.b"), [k("a"), Segment::All, k("b")]);
        assert_eq!(keys("[0]"), [Segment::Index(0)]);
    }

    #[test]
    fn malformed_paths_are_refused_with_the_offset() {
        for (path, offset) in [
            ("", 0),
            (".a", 0),
            ("a.", 2),
            ("a..b", 2),
            ("a[b]", 1),
            ("a[\"b]", 1),
            ("a[\"b\"x]", 5),
            ("a[0", 3),
            ("a[0]b", 4),
            ("a]", 1),
            ("a[]", 1),
            ("a[99999999999999999999999]", 2),
        ] {
            let error = PatchPath::parse(path).expect_err(path);
            assert_eq!(error.offset, offset, "{path}: {error}");
        }
    }

    #[test]
    fn display_round_trips() {
        for path in [
            "spec.secretName",
            "spec.rules[0].name",
            "metadata.annotations[\"example.com/key\"]",
            "a[*].b[*]",
            "a['x\"y']",
        ] {
            let parsed = PatchPath::parse(path).unwrap();
            assert_eq!(parsed.to_string(), path);
            assert_eq!(PatchPath::parse(&parsed.to_string()).unwrap(), parsed);
        }
    }

    #[test]
    fn locate_get_and_set() {
        let mut doc = json!({
            "spec": {
                "backendRefs": [{"name": "a"}, {"name": "b", "port": 80}, {"port": 1}],
                "labels": {"x.y": "1", "z": "2"},
                "rules": [[1, 2], [3]]
            }
        });
        let all = PatchPath::parse("spec.backendRefs[*].name").unwrap();
        let found = all.locate(&doc);
        assert_eq!(
            found.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["spec.backendRefs[0].name", "spec.backendRefs[1].name"]
        );
        assert_eq!(all.get(&doc), Some(&json!("a")));
        // a dotted number indexes an array, a bracketed one too
        assert_eq!(
            PatchPath::parse("spec.rules.0[1]").unwrap().get(&doc),
            Some(&json!(2))
        );
        assert_eq!(
            PatchPath::parse("spec.labels[\"x.y\"]").unwrap().get(&doc),
            Some(&json!("1"))
        );
        // not found: nothing, never an error
        for missing in [
            "spec.nope",
            "spec.backendRefs[7].name",
            "spec.labels[0]",
            "spec.rules[*][5]",
        ] {
            assert!(
                PatchPath::parse(missing).unwrap().locate(&doc).is_empty(),
                "{missing}"
            );
        }
        // set replaces in place, None removes a key and nulls an element
        assert!(found[1].set(&mut doc, Some(json!("B"))));
        assert!(found[0].set(&mut doc, None));
        assert_eq!(
            doc["spec"]["backendRefs"],
            json!([{}, {"name": "B", "port": 80}, {"port": 1}])
        );
        // a location whose key is gone is not recreated
        assert!(!found[0].set(&mut doc, Some(json!("again"))));
        let element = &PatchPath::parse("spec.rules[1]").unwrap().locate(&doc)[0];
        assert!(element.set(&mut doc, None));
        assert_eq!(doc["spec"]["rules"], json!([[1, 2], null]));
        // join: a relative path below a location
        let refs = PatchPath::parse("spec.backendRefs[*]")
            .unwrap()
            .locate(&doc);
        let port = PatchPath::parse("port").unwrap();
        let ports: Vec<String> = refs
            .iter()
            .flat_map(|l| l.join(&port, &doc))
            .map(|l| l.to_string())
            .collect();
        assert_eq!(
            ports,
            ["spec.backendRefs[1].port", "spec.backendRefs[2].port"]
        );
    }

    #[test]
    fn unusable_paths_are_named_by_their_field() {
        let synced: Vec<crate::SyncedType> = serde_json::from_value(json!([
            {"apiVersion": "v1", "kind": "A", "patches": [{"path": "spec.ok", "labels": {}}]},
            {"apiVersion": "v1", "kind": "B", "patches": [
                {"path": "spec[x]", "expression": "value"},
                {"path": "metadata['name']", "expression": "value"},
                {"path": "spec.ref", "reference": {"apiVersion": "v1", "kind": "Secret", "namePath": "a..b"}},
                {"path": "spec.secretName", "reference": {"apiVersion": "v1", "kind": "Secret",
                    "namespacePath": "metadata.labels[\"vcluster.loft.sh/managed-by\"]"}},
                {"path": "spec.other", "reference": {"apiVersion": "v1", "kind": "Secret",
                    "namePath": "metadata.Name"}}
            ]},
            // read, never written: cert-manager's issuerRef (`kindPath: kind`), and a
            // namespacePath that is no identity
            {"apiVersion": "v1", "kind": "C", "patches": [
                {"path": "spec.issuerRef", "reference": {"apiVersion": "cert-manager.io/v1", "kind": "Issuer",
                    "namePath": "name", "kindPath": "kind", "apiVersionPath": "apiVersion",
                    "namespacePath": "namespace"}}
            ]}
        ]))
        .unwrap();
        assert_eq!(
            unusable_patch_paths(&synced),
            [
                "spec.syncedTypes[1].patches[0].path: invalid patch path \"spec[x]\" at byte 4: a bracket holds a number, [*], or a key in quotes",
                "spec.syncedTypes[1].patches[1].path: \"metadata['name']\" writes the object's identity or a vcluster.loft.sh/ key",
                "spec.syncedTypes[1].patches[2].reference.namePath: invalid patch path \"a..b\" at byte 2: an empty segment",
                "spec.syncedTypes[1].patches[3].reference.namespacePath: \"metadata.labels[\\\"vcluster.loft.sh/managed-by\\\"]\" writes the object's identity or a vcluster.loft.sh/ key",
                "spec.syncedTypes[1].patches[4].reference.namePath: \"metadata.Name\" writes the object's identity or a vcluster.loft.sh/ key",
            ]
        );
        assert!(unusable_patch_paths(&synced[..1]).is_empty());
        assert!(unusable_patch_paths(&synced[2..]).is_empty());
    }

    #[test]
    fn identity_paths_are_protected_in_every_spelling() {
        for path in [
            "metadata",
            "metadata.name",
            "metadata.Name",
            "metadata[\"namespace\"]",
            "metadata['uid']",
            "metadata.ownerReferences[0].uid",
            "metadata.finalizerſ",
            "metadata.generateName",
            "metadata.labels",
            "metadata.labels[*]",
            "metadata.annotations[\"vcluster.loft.sh/object-name\"]",
            "metadata.labels[\"vcluster.loft.sh/managed-by\"]",
            "metadata[*]",
            "metadata.labels[\"VCLUSTER.loft.sh/x\"]",
            "metadata.labels.release",
            "metadata.labels[\"release\"]",
            "[*]",
            "apiVersion",
            "KIND",
        ] {
            assert!(PatchPath::parse(path).unwrap().is_protected(), "{path}");
        }
        for path in [
            "spec.name",
            "metadata.labels.team",
            "metadata.labels.released",
            "metadata.annotations.release",
            "metadata.annotations[\"example.com/key\"]",
            "spec.metadata.name",
            "status.conditions[*].reason",
        ] {
            assert!(!PatchPath::parse(path).unwrap().is_protected(), "{path}");
        }
    }
}

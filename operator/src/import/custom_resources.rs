//! The `sync.toHost.customResources` and `sync.fromHost.customResources` blocks of a
//! `vcluster.yaml` (vCluster v0.21 and later: `config.SyncToHostCustomResource` and
//! `config.SyncFromHostCustomResource` of the v0.30 module's `config/config.go`) as the
//! `syncedTypes` of one VClusterPlugin run by the embedded runtime.
//!
//! Pure: the kind, version and scope of each key come in [`ResolvedTypes`] (read from the host
//! API server's discovery by [`super::resolve`]), since vCluster's key (`<resource>.<group>`, the
//! name of the CRD) holds neither: vCluster reads that CRD from the host cluster.
//!
//! What is carried over, per enabled entry (file order; `toHost` entries are `ToHost` types,
//! `fromHost` entries `FromHost` types):
//! - `patches`, unchanged: the VClusterPlugin's `patches` use vCluster's `config.TranslatePatch`
//!   field names and meanings. vCluster's omitted strings (`""`) stay omitted. vCluster's own
//!   refusals (`pkg/config/validation.go`, `validatePatches`: none or several of
//!   expression / labels / reference, two patches on one path) are import errors with its words.
//! - `mappings.byName` (`fromHost` only), unchanged (the runtime reads vCluster's shapes,
//!   `""` and `/<name>` for the vCluster's host namespace included, in vCluster's matching
//!   order). Entries for another host namespace are dropped with a warning: the runtime reads
//!   only the vCluster's own host namespace (the trust model), where vCluster reads any, and a
//!   plugin with such an entry is refused as a whole (`ForeignNamespace`).
//! - `syncStatus: true` when the host type has a `status` subresource: the host controller (such
//!   as cert-manager) writes the status users read in the virtual cluster.
//! - For `certificates.cert-manager.io` (`ToHost`) only: `produced: [{apiVersion: v1, kind:
//!   Secret, namePath: spec.secretName}]`, the Secret cert-manager issues brought back, with a
//!   note naming the entry. vCluster has no spelling for `produced`; for any other type it must be
//!   added by hand.
//!
//! Not carried over, each with a [`Warning`] naming its full path (such as
//! `sync.toHost.customResources["certificates.cert-manager.io"].scope`): an entry whose
//! `enabled` is not `true`, a cluster-scoped type (`scope: Cluster`, or a CRD the host serves as
//! cluster-scoped), a subresource key (`<resource>/status.<group>`), an unknown key (vCluster's
//! strict decoder refuses those too), and the other keys of `sync` (vCluster's own syncers).

use std::collections::{BTreeMap, BTreeSet};

use serde_yaml::{Mapping, Value};
use vcp_crds::{FromHostMappings, ProducedObject, SyncDirection, SyncedType, TranslatePatch};

use super::{ImportError, Warning, key_string, kind_of, scalar_text, typed};

/// The key of vCluster's config whose blocks are read here.
pub const SYNC_KEY: &str = "sync";

/// The CRD name of cert-manager's Certificate, the one type whose produced object the import
/// adds by itself (see the module docs).
pub const CERT_MANAGER_CERTIFICATES: &str = "certificates.cert-manager.io";

/// What the host API server serves for a key `<resource>.<group>` of `customResources`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedType {
    /// `group/version`, the group's preferred version in the host's discovery, such as
    /// `cert-manager.io/v1`.
    pub api_version: String,
    /// The kind, such as `Certificate`.
    pub kind: String,
    /// The plural resource name (the key's `<resource>`), such as `certificates`.
    pub resource: String,
    /// Whether the type is namespaced.
    pub namespaced: bool,
    /// Whether the type has a `status` subresource.
    pub status_subresource: bool,
}

/// The answers of the host's discovery, by key (`certificates.cert-manager.io`). `None`: no host
/// was asked (no `--kubeconfig`).
pub type ResolvedTypes = Option<BTreeMap<String, ResolvedType>>;

/// The two directions' blocks, as `(direction key, SyncDirection)`.
const DIRECTIONS: [(&str, SyncDirection); 2] = [
    ("toHost", SyncDirection::ToHost),
    ("fromHost", SyncDirection::FromHost),
];

/// The path of a `customResources` entry: `sync.toHost.customResources["<key>"]`.
fn entry_path(direction: &str, key: &str) -> String {
    format!("{SYNC_KEY}.{direction}.customResources[\"{key}\"]")
}

/// The enabled keys of both `customResources` blocks whose types must be resolved (each once,
/// sorted). Lenient: a block of the wrong shape yields no key here (the conversion reports it).
pub fn keys(root: &Mapping) -> Vec<String> {
    let mut keys = BTreeSet::new();
    for (direction, _) in DIRECTIONS {
        let Some(Value::Mapping(block)) = root
            .get(SYNC_KEY)
            .and_then(|s| s.get(direction))
            .and_then(|d| d.get("customResources"))
        else {
            continue;
        };
        for (key, entry) in block {
            if entry.get("enabled") == Some(&Value::Bool(true)) {
                let key = key_string(key);
                if split_key(&key).is_some() {
                    keys.insert(key);
                }
            }
        }
    }
    keys.into_iter().collect()
}

/// `<resource>.<group>` → `(resource, group)`; `None` for a subresource key (`/`) or a key
/// without a group.
pub fn split_key(key: &str) -> Option<(&str, &str)> {
    if key.contains('/') {
        return None;
    }
    let (resource, group) = key.split_once('.')?;
    (!resource.is_empty() && !group.is_empty()).then_some((resource, group))
}

/// What [`convert`] makes of the `sync:` value.
#[derive(Debug, Default)]
pub struct Converted {
    /// The synced types, in file order.
    pub types: Vec<SyncedType>,
    /// What was added or changed on the way (the cert-manager `produced`, an identity
    /// `expression`), each naming its path.
    pub notes: Vec<Warning>,
    /// The full paths of the keys whose types were not resolved (no host asked, or not served).
    pub unresolved: Vec<String>,
}

/// Converts the value of `sync:` (`sync` is its path); `namespace` is the vCluster's host
/// namespace.
///
/// # Errors
/// [`ImportError::Invalid`]: a block or entry of the wrong shape, a patch vCluster refuses.
pub fn convert(
    sync: &Value,
    namespace: &str,
    resolved: &ResolvedTypes,
    warnings: &mut Vec<Warning>,
) -> Result<Converted, ImportError> {
    let mut out = Converted::default();
    let sync = match sync {
        Value::Null => return Ok(out),
        Value::Mapping(m) => m,
        other => return Err(invalid(SYNC_KEY, "a map", other)),
    };
    for (dkey, dvalue) in sync {
        let dkey = key_string(dkey);
        let Some(direction) = DIRECTIONS.iter().find(|(k, _)| *k == dkey).map(|(_, d)| *d) else {
            warnings.push(not_ours(format!("{SYNC_KEY}.{dkey}")));
            continue;
        };
        let block = match dvalue {
            Value::Null => continue,
            Value::Mapping(m) => m,
            other => return Err(invalid(&format!("{SYNC_KEY}.{dkey}"), "a map", other)),
        };
        for (rkey, rvalue) in block {
            let rkey = key_string(rkey);
            let here = format!("{SYNC_KEY}.{dkey}.{rkey}");
            if rkey != "customResources" {
                warnings.push(not_ours(here));
                continue;
            }
            let entries = match rvalue {
                Value::Null => continue,
                Value::Mapping(m) => m,
                other => {
                    return Err(invalid(
                        &here,
                        "a map of `<resource>.<group>` to settings",
                        other,
                    ));
                }
            };
            for (key, entry) in entries {
                let key = key_string(key);
                if let Some(t) = convert_entry(
                    &dkey, direction, &key, entry, namespace, resolved, warnings, &mut out,
                )? {
                    out.types.push(t);
                }
            }
        }
    }
    Ok(out)
}

fn not_ours(path: String) -> Warning {
    Warning {
        path,
        message: "vCluster's own syncer setting, not a plugin setting; ignored (keep it in the vCluster's values)".into(),
    }
}

fn invalid(path: &str, expected: &str, found: &Value) -> ImportError {
    ImportError::Invalid {
        path: path.to_string(),
        message: format!("expected {expected}, found {}", kind_of(found)),
    }
}

/// One entry of a `customResources` block; `None` (with a warning) when it is not carried over.
#[allow(clippy::too_many_arguments)]
fn convert_entry(
    dkey: &str,
    direction: SyncDirection,
    key: &str,
    entry: &Value,
    namespace: &str,
    resolved: &ResolvedTypes,
    warnings: &mut Vec<Warning>,
    out: &mut Converted,
) -> Result<Option<SyncedType>, ImportError> {
    let path = entry_path(dkey, key);
    let map = match entry {
        Value::Mapping(m) => m,
        Value::Null => &Mapping::new(),
        other => {
            return Err(invalid(
                &path,
                "a map with `enabled`, `scope`, `patches`",
                other,
            ));
        }
    };
    let mut warn = |sub: &str, message: String| {
        warnings.push(Warning {
            path: format!("{path}{sub}"),
            message,
        })
    };
    let mut enabled = false;
    let mut scope = None;
    let mut patches = None;
    let mut mappings = None;
    for (k, v) in map {
        let k = key_string(k);
        match k.as_str() {
            "enabled" => match v {
                Value::Bool(b) => enabled = *b,
                Value::Null => {}
                other => return Err(invalid(&format!("{path}.enabled"), "a boolean", other)),
            },
            "scope" => scope = typed::<String>(&format!("{path}.scope"), v, "a string")?,
            "patches" => patches = Some(v),
            "mappings" if direction == SyncDirection::FromHost => mappings = Some(v),
            _ => warn(
                &format!(".{k}"),
                "unknown key (vCluster's strict config decoder refuses it too); ignored".into(),
            ),
        }
    }
    if !enabled {
        warn(
            ".enabled",
            "not `true`: vCluster does not sync this resource; skipped".into(),
        );
        return Ok(None);
    }
    let Some((resource, _group)) = split_key(key) else {
        warn(
            "",
            "not a CRD name `<resource>.<group>` (a subresource key such as `<resource>/status.<group>` is not supported: use the type's key, whose status the runtime copies up with syncStatus); skipped".into(),
        );
        return Ok(None);
    };
    match (direction, scope.as_deref()) {
        (_, None | Some("") | Some("Namespaced")) => {}
        (SyncDirection::ToHost, Some("Cluster")) => {
            warn(
                ".scope",
                "`Cluster`: vCluster syncs only namespaced custom resources to the host (its validation refuses `Cluster`), and so does the runtime; skipped".into(),
            );
            return Ok(None);
        }
        (SyncDirection::FromHost, Some("Cluster")) => {
            warn(
                ".scope",
                "`Cluster`: the runtime syncs from the vCluster's host namespace only, not cluster-scoped objects; skipped".into(),
            );
            return Ok(None);
        }
        (_, Some(other)) => {
            warn(
                ".scope",
                format!(
                    "`{other}` is neither `Namespaced` nor `Cluster` (vCluster refuses it); skipped"
                ),
            );
            return Ok(None);
        }
    }

    let patches = convert_patches(&path, patches, &mut warn)?;
    let mappings = match mappings {
        Some(v) => match convert_mappings(&path, v, namespace, &mut warn)? {
            MappingsOutcome::Kept(m) => m,
            MappingsOutcome::NoneLeft => {
                warn(
                    ".mappings.byName",
                    format!("no entry reads the vCluster's host namespace `{namespace}`; skipped"),
                );
                return Ok(None);
            }
        },
        None => None,
    };

    let Some(t) = resolved.as_ref().and_then(|r| r.get(key)) else {
        out.unresolved.push(path);
        return Ok(None);
    };
    if !t.namespaced {
        warn(
            "",
            format!(
                "the host serves `{key}` as cluster-scoped; the runtime syncs namespaced types only; skipped"
            ),
        );
        return Ok(None);
    }
    if direction == SyncDirection::FromHost && mappings.is_none() {
        warn(
            ".mappings",
            format!(
                "absent (vCluster requires it for a namespaced type): the runtime's default applies, every object of the host namespace `{namespace}` into the virtual namespace of the same name"
            ),
        );
    }

    let mut produced = Vec::new();
    if direction == SyncDirection::ToHost
        && key == CERT_MANAGER_CERTIFICATES
        && t.kind == "Certificate"
    {
        produced.push(ProducedObject {
            api_version: "v1".into(),
            kind: "Secret".into(),
            name_path: "spec.secretName".into(),
        });
        out.notes.push(Warning {
            path: path.clone(),
            message: "added `produced: [{apiVersion: v1, kind: Secret, namePath: spec.secretName}]`: cert-manager issues that Secret on the host, and vCluster's config has no spelling for bringing it back into the virtual namespace; delete it from the output to leave the Secret on the host".into(),
        });
        let has_reference = patches
            .iter()
            .any(|p| p.path == "spec.secretName" && p.reference.is_some());
        if !has_reference {
            warnings.push(Warning {
                path: format!("{path}.patches"),
                message: "no `reference` patch at `spec.secretName`: the host copy keeps the virtual Secret name, so two virtual namespaces asking for the same name share one host Secret, and the runtime brings back only a Secret named as a reference patch names it (otherwise `ProducedNameRefused`); add `{path: spec.secretName, reference: {apiVersion: v1, kind: Secret}}`".into(),
            });
        }
    }

    Ok(Some(SyncedType {
        api_version: t.api_version.clone(),
        kind: t.kind.clone(),
        resource: Some(resource.to_string()),
        direction,
        sync_status: direction == SyncDirection::ToHost && t.status_subresource,
        selector: None,
        patches,
        mappings,
        produced,
    }))
}

/// The keys of vCluster's `TranslatePatch` and `TranslatePatchReference`.
const PATCH_KEYS: [&str; 5] = [
    "path",
    "expression",
    "reverseExpression",
    "reference",
    "labels",
];
const REFERENCE_KEYS: [&str; 6] = [
    "apiVersion",
    "apiVersionPath",
    "kind",
    "kindPath",
    "namePath",
    "namespacePath",
];

/// `patches` of an entry at `path`, carried over unchanged (see the module docs).
fn convert_patches(
    path: &str,
    value: Option<&Value>,
    warn: &mut impl FnMut(&str, String),
) -> Result<Vec<TranslatePatch>, ImportError> {
    let items = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Sequence(s)) => s,
        Some(other) => {
            return Err(invalid(
                &format!("{path}.patches"),
                "a list of patches",
                other,
            ));
        }
    };
    let mut patches = Vec::with_capacity(items.len());
    let mut used_paths: BTreeMap<String, usize> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let here = format!("{path}.patches[{i}]");
        let Value::Mapping(map) = item else {
            return Err(invalid(&here, "a patch (a map)", item));
        };
        // vCluster's strings are `omitempty`: an empty string is an absent field.
        let mut clean = Mapping::new();
        for (k, v) in map {
            let k = key_string(k);
            if !PATCH_KEYS.contains(&k.as_str()) {
                warn(
                    &format!(".patches[{i}].{k}"),
                    "unknown patch key (vCluster's strict config decoder refuses it too); ignored"
                        .into(),
                );
                continue;
            }
            if v.is_null() || v.as_str() == Some("") {
                continue;
            }
            let v = if k == "reference" {
                let Value::Mapping(r) = v else {
                    return Err(invalid(&format!("{here}.reference"), "a map", v));
                };
                let mut rclean = Mapping::new();
                for (rk, rv) in r {
                    let rk = key_string(rk);
                    if !REFERENCE_KEYS.contains(&rk.as_str()) {
                        warn(
                            &format!(".patches[{i}].reference.{rk}"),
                            "unknown reference key (vCluster's strict config decoder refuses it too); ignored".into(),
                        );
                    } else if !(rv.is_null() || rv.as_str() == Some("")) {
                        rclean.insert(Value::String(rk), rv.clone());
                    }
                }
                Value::Mapping(rclean)
            } else {
                v.clone()
            };
            clean.insert(Value::String(k), v);
        }
        if !clean.contains_key("path") {
            return Err(ImportError::Invalid {
                path: format!("{here}.path"),
                message: "required (vCluster's schema marks it required)".into(),
            });
        }
        let patch = typed::<TranslatePatch>(
            &here,
            &Value::Mapping(clean),
            "a patch (path, and one of expression, reference, labels)",
        )?
        .unwrap_or_default();
        // vCluster's `validatePatches` (pkg/config/validation.go), with its words.
        let used = usize::from(patch.expression.is_some() || patch.reverse_expression.is_some())
            + usize::from(patch.labels.is_some())
            + usize::from(patch.reference.is_some());
        if used > 1 {
            return Err(ImportError::Invalid {
                path: here,
                message:
                    "can only use one of: expression, labels or reference (vCluster refuses it too)"
                        .into(),
            });
        }
        if used == 0 {
            return Err(ImportError::Invalid {
                path: here,
                message:
                    "need to use one of: expression, labels or reference (vCluster refuses it too)"
                        .into(),
            });
        }
        if let Some(j) = used_paths.insert(patch.path.clone(), i) {
            return Err(ImportError::Invalid {
                path: here,
                message: format!(
                    "has the same path {:?} as {path}.patches[{j}] (vCluster refuses it too)",
                    patch.path
                ),
            });
        }
        patches.push(patch);
    }
    Ok(patches)
}

enum MappingsOutcome {
    /// The mappings to carry over (`None`: there were none).
    Kept(Option<FromHostMappings>),
    /// There were entries, and none reads the vCluster's host namespace.
    NoneLeft,
}

/// `mappings` of a `fromHost` entry at `path` (see the module docs).
fn convert_mappings(
    path: &str,
    value: &Value,
    namespace: &str,
    warn: &mut impl FnMut(&str, String),
) -> Result<MappingsOutcome, ImportError> {
    let map = match value {
        Value::Null => return Ok(MappingsOutcome::Kept(None)),
        Value::Mapping(m) => m,
        other => {
            return Err(invalid(
                &format!("{path}.mappings"),
                "a map with `byName`",
                other,
            ));
        }
    };
    let mut by_name = BTreeMap::new();
    let mut seen = 0usize;
    for (k, v) in map {
        let k = key_string(k);
        if k != "byName" {
            warn(
                &format!(".mappings.{k}"),
                "unknown key (vCluster's strict config decoder refuses it too); ignored".into(),
            );
            continue;
        }
        let entries = match v {
            Value::Null => continue,
            Value::Mapping(m) => m,
            other => {
                return Err(invalid(
                    &format!("{path}.mappings.byName"),
                    "a map of `host-namespace/name` to `virtual-namespace/name`",
                    other,
                ));
            }
        };
        for (host, virt) in entries {
            seen += 1;
            let host = key_string(host);
            let here = format!(".mappings.byName[\"{host}\"]");
            let Value::String(virt) = virt else {
                return Err(invalid(&format!("{path}{here}"), "a string", virt));
            };
            // vCluster's own spellings of its host namespace, `""` and `/name`, are the
            // runtime's too: carried over as they are.
            match host.split_once('/') {
                _ if host.is_empty() => {
                    by_name.insert(host.clone(), virt.clone());
                }
                Some((ns, _)) if ns.is_empty() || ns == namespace => {
                    by_name.insert(host.clone(), virt.clone());
                }
                Some((ns, _)) => warn(
                    &here,
                    format!(
                        "reads the host namespace `{ns}`: the runtime reads only the vCluster's host namespace `{namespace}`; dropped"
                    ),
                ),
                None => warn(
                    &here,
                    format!(
                        "`{}` is not `namespace/name` or `namespace/*`; dropped",
                        scalar_text(&Value::String(host.clone()))
                    ),
                ),
            }
        }
    }
    if by_name.is_empty() {
        return Ok(if seen == 0 {
            MappingsOutcome::Kept(None)
        } else {
            MappingsOutcome::NoneLeft
        });
    }
    Ok(MappingsOutcome::Kept(Some(FromHostMappings { by_name })))
}

//! `vcluster-plugin-operator import`: a vCluster Helm values file into VClusterPlugin manifests.
//!
//! Pure conversion, no Helm and no API server. Two maps of the vCluster chart are read:
//!
//! - the legacy `plugin:` map: an entry with `version: v2` is a v2 plugin (init container that
//!   copies the plugin into `/plugins`, started by the syncer); any other entry is a v1 gRPC
//!   sidecar, as the chart's templates decide (`version` other than `v2` means legacy sidecar);
//! - the newer `plugins:` map: every entry is a v2 plugin.
//!
//! Each entry with an `image` becomes one `VClusterPlugin` named after its key, in the given
//! namespace, targeting the given vCluster. The keys the chart reads are carried over: `image`,
//! `imagePullPolicy`, `version`, `command`, `args`, `env` and `envFrom` (v1 only: the chart
//! renders none for a v2 plugin's init container, and its values schema refuses them under
//! `plugins:`; `tests/tests/oracle_chart.rs` checks this against the chart), `resources`,
//! `securityContext`, `volumeMounts` (without a mount of the v2 plugins' volume `plugins`, which
//! the operator makes itself and the CRD refuses from a plugin), `config` (v1 only: a v2 plugin gets its config from the
//! vCluster's own values, and the VClusterPlugin schema refuses `config` with v2), and
//! `rbac.role.extraRules` / `rbac.clusterRole.extraRules`.
//!
//! A `vcluster.yaml`'s `sync.toHost.customResources` and `sync.fromHost.customResources` blocks
//! (vCluster v0.21 and later) become the `syncedTypes` of one more VClusterPlugin, run by the
//! embedded runtime (named [`ImportOptions::name`], default [`CUSTOM_RESOURCES_PLUGIN`]): see
//! [`custom_resources`] for what is carried over. The kind and version of each entry are not in
//! vCluster's key (`certificates.cert-manager.io`): vCluster reads that CRD from the host, and
//! the import asks the host API server's discovery ([`resolve`], the CLI's `--kubeconfig`);
//! without it such an entry is an [`ImportError::Unresolved`].
//!
//! Nothing is dropped silently: every key that is not carried over becomes a [`Warning`] naming
//! its full path (such as `plugins.crd-sync.foo`), and what the import adds on its own (such as
//! cert-manager's `produced` Secret) a note ([`Imported::notes`]). Input that cannot be converted
//! at all (malformed YAML, a value of the wrong type) is an [`ImportError`]; then no manifest is
//! produced.

use k8s_openapi::api::core::v1::{
    EnvFromSource, EnvVar, ResourceRequirements, SecurityContext, VolumeMount,
};
use k8s_openapi::api::rbac::v1::PolicyRule;
use serde::de::DeserializeOwned;
use serde_yaml::Value;
use thiserror::Error;
use vcp_crds::{
    PluginRbac, PluginVersion, PullPolicy, RoleRules, VClusterPlugin, VClusterPluginSpec,
    VClusterRef,
};

pub mod custom_resources;
pub mod resolve;

pub use custom_resources::{ResolvedType, ResolvedTypes};

/// The legacy map of the vCluster chart (v1 sidecars and v2 plugins).
pub const LEGACY_KEY: &str = "plugin";
/// The newer map of the vCluster chart (v2 plugins only).
pub const PLUGINS_KEY: &str = "plugins";
/// Default name of the VClusterPlugin made from the `customResources` blocks.
pub const CUSTOM_RESOURCES_PLUGIN: &str = "custom-resources";

/// How [`import_with`] converts what needs more than the file.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// The types of the `customResources` keys, as the host serves them ([`resolve::resolve`]);
    /// `None`: no host was asked.
    pub resolved: ResolvedTypes,
    /// Name of the VClusterPlugin made from the `customResources` blocks; default
    /// [`CUSTOM_RESOURCES_PLUGIN`].
    pub name: Option<String>,
}

/// Container keys of the chart's v1 sidecar template that a VClusterPlugin has no field for.
const UNSUPPORTED_CONTAINER_KEYS: [&str; 8] = [
    "workingDir",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "lifecycle",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "volumeDevices",
];

/// Why a values file cannot be converted. Nothing is printed on stdout then.
#[derive(Debug, Error, PartialEq)]
pub enum ImportError {
    /// The file is not valid YAML.
    #[error("malformed YAML at line {line}, column {column}: {message}")]
    Yaml {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// The file is not valid YAML, and the parser gave no position (such as an empty stream of
    /// several documents).
    #[error("malformed YAML: {0}")]
    YamlNoPosition(String),
    /// The top level of the file is not a map of values.
    #[error("the values file must be a YAML map with a `plugin:` or `plugins:` key, found {0}")]
    NotAMap(&'static str),
    /// Neither `plugin:` nor `plugins:` holds an entry, and no custom resource is synced.
    #[error(
        "no plugin found: the values file has no entries under `plugin:` (legacy, v1 and v2) or `plugins:` (v2), and no enabled entry under `sync.toHost.customResources` / `sync.fromHost.customResources`"
    )]
    NoPlugins,
    /// Entries of `customResources` whose kind and version are unknown: vCluster's key
    /// (`<resource>.<group>`) holds neither, and the host was not asked (`asked: false`) or does
    /// not serve the resource (`asked: true`).
    #[error("{}", unresolved_message(paths, *asked))]
    Unresolved {
        /// Full paths of the entries, such as
        /// `sync.toHost.customResources["certificates.cert-manager.io"]`.
        paths: Vec<String>,
        /// Whether the host's discovery was asked.
        asked: bool,
    },
    /// A value has the wrong type or shape.
    #[error("{path}: {message}")]
    Invalid {
        /// Full path of the value, such as `plugins.crd-sync.env`.
        path: String,
        /// What is wrong and what is expected.
        message: String,
    },
    /// The same plugin name appears under both `plugin:` and `plugins:`.
    #[error(
        "plugin `{0}` is defined under both `plugin:` and `plugins:`; a VClusterPlugin name must be unique in its namespace: rename one"
    )]
    Duplicate(String),
    /// The name of the VClusterPlugin made from the `customResources` blocks is the name of a
    /// plugin of `plugin:` / `plugins:`.
    #[error(
        "the VClusterPlugin made from `sync.*.customResources` would be named `{0}`, like an entry of `plugin:` / `plugins:`: choose another name (--name)"
    )]
    NameTaken(String),
}

fn unresolved_message(paths: &[String], asked: bool) -> String {
    let list = paths.join(", ");
    if asked {
        format!(
            "{list}: the host API server serves no such resource (is its CRD installed? vCluster reads the CRD from the host cluster too)"
        )
    } else {
        format!(
            "{list}: the kind and version of a custom resource are not in the vcluster.yaml (vCluster reads the CRD from the host cluster); pass --kubeconfig of the host cluster so that import reads them from its discovery"
        )
    }
}

/// A key that is not carried over into the manifests, with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// Full path of the key, such as `plugin.crd-sync.foo`.
    pub path: String,
    /// Why it is not carried over, and what to do.
    pub message: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// The result of a conversion.
#[derive(Clone, Debug)]
pub struct Imported {
    /// One VClusterPlugin per converted entry: `plugin:` entries first, then `plugins:`, each in
    /// file order.
    pub plugins: Vec<VClusterPlugin>,
    /// Keys that were not carried over.
    pub warnings: Vec<Warning>,
    /// What the import added or changed on its own (such as cert-manager's `produced` Secret),
    /// each naming the path it concerns.
    pub notes: Vec<Warning>,
    /// [`Imported::plugins`] as multi-document YAML (documents separated by `---`), ready for
    /// `kubectl apply -f -`.
    pub yaml: String,
}

/// Converts the values file `text` into VClusterPlugins for the vCluster `vcluster` in
/// `namespace`.
///
/// # Errors
/// [`ImportError`]: malformed YAML (with line and column), a value of the wrong type, no
/// plugin at all, or the same name under both maps.
pub fn import(text: &str, vcluster: &str, namespace: &str) -> Result<Imported, ImportError> {
    import_with(text, vcluster, namespace, &ImportOptions::default())
}

/// The keys of the enabled `customResources` entries of the file `text` (such as
/// `certificates.cert-manager.io`), whose types [`resolve::resolve`] must find before
/// [`import_with`] can convert them; sorted, each once.
///
/// # Errors
/// [`ImportError`]: malformed YAML.
pub fn custom_resource_keys(text: &str) -> Result<Vec<String>, ImportError> {
    Ok(match parse(text)? {
        Value::Mapping(root) => custom_resources::keys(&root),
        _ => Vec::new(),
    })
}

fn parse(text: &str) -> Result<Value, ImportError> {
    serde_yaml::from_str(text).map_err(|e| match e.location() {
        Some(l) => ImportError::Yaml {
            line: l.line(),
            column: l.column(),
            message: strip_location(&e.to_string()),
        },
        None => ImportError::YamlNoPosition(e.to_string()),
    })
}

/// [`import`], with the types of the `customResources` keys and the name of the plugin made of
/// them in `options`.
///
/// # Errors
/// As [`import`], and [`ImportError::Unresolved`] for an enabled `customResources` entry whose
/// type is not in `options.resolved`.
pub fn import_with(
    text: &str,
    vcluster: &str,
    namespace: &str,
    options: &ImportOptions,
) -> Result<Imported, ImportError> {
    let root = match parse(text)? {
        Value::Mapping(m) => m,
        Value::Null => return Err(ImportError::NoPlugins),
        other => return Err(ImportError::NotAMap(kind_of(&other))),
    };

    let mut warnings = Vec::new();
    let mut notes = Vec::new();
    let mut plugins: Vec<VClusterPlugin> = Vec::new();
    let mut synced = custom_resources::Converted::default();
    for (key, value) in &root {
        let key = key_string(key);
        match key.as_str() {
            custom_resources::SYNC_KEY => {
                synced =
                    custom_resources::convert(value, namespace, &options.resolved, &mut warnings)?;
            }
            LEGACY_KEY | PLUGINS_KEY => {
                let legacy = key == LEGACY_KEY;
                let entries = match value {
                    Value::Mapping(m) => m,
                    Value::Null => continue,
                    other => {
                        return Err(ImportError::Invalid {
                            path: key,
                            message: format!(
                                "expected a map of plugin name to plugin, found {}",
                                kind_of(other)
                            ),
                        });
                    }
                };
                for (name, entry) in entries {
                    let name = key_string(name);
                    let path = format!("{key}.{name}");
                    let Some(plugin) =
                        convert_entry(&path, &name, entry, legacy, vcluster, namespace, &mut warnings)?
                    else {
                        continue;
                    };
                    if plugins.iter().any(|p| p.metadata.name == plugin.metadata.name) {
                        return Err(ImportError::Duplicate(name));
                    }
                    plugins.push(plugin);
                }
            }
            "rbac" => warnings.push(Warning {
                path: key,
                message: "the vCluster's own RBAC settings are not a plugin setting; ignored (the operator grants each plugin's rules itself)".into(),
            }),
            _ => warnings.push(Warning {
                path: key,
                message: "not a plugin setting; ignored (keep it in the vCluster's values)".into(),
            }),
        }
    }
    if !synced.unresolved.is_empty() {
        return Err(ImportError::Unresolved {
            paths: synced.unresolved,
            asked: options.resolved.is_some(),
        });
    }
    notes.extend(synced.notes);
    if !synced.types.is_empty() {
        let name = options.name.as_deref().unwrap_or(CUSTOM_RESOURCES_PLUGIN);
        if plugins
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some(name))
        {
            return Err(ImportError::NameTaken(name.to_string()));
        }
        let spec = VClusterPluginSpec {
            vcluster: VClusterRef {
                name: vcluster.to_string(),
            },
            synced_types: synced.types,
            ..Default::default()
        };
        let mut plugin = VClusterPlugin::new(name, spec);
        plugin.metadata.namespace = Some(namespace.to_string());
        plugins.push(plugin);
        for direction in ["toHost", "fromHost"] {
            let path = format!("{}.{direction}.customResources", custom_resources::SYNC_KEY);
            let present = root
                .get(custom_resources::SYNC_KEY)
                .and_then(|s| s.get(direction))
                .and_then(|d| d.get("customResources"))
                .is_some_and(|c| !c.is_null());
            if present {
                notes.push(Warning {
                    path,
                    message: format!("carried over into the VClusterPlugin `{name}`: remove it from the vCluster's values (the open-source vCluster refuses it: a feature of vCluster's paid build)"),
                });
            }
        }
    }
    if plugins.is_empty() {
        return Err(ImportError::NoPlugins);
    }
    let mut docs = Vec::with_capacity(plugins.len());
    for p in &plugins {
        docs.push(serde_yaml::to_string(p).map_err(|e| ImportError::Invalid {
            path: format!(
                "VClusterPlugin {}",
                p.metadata.name.as_deref().unwrap_or_default()
            ),
            message: format!("cannot be written as YAML: {e}"),
        })?);
    }
    Ok(Imported {
        plugins,
        warnings,
        notes,
        yaml: docs.join("---\n"),
    })
}

/// One entry of `plugin:` / `plugins:`; `None` (with a warning) when it installs nothing.
fn convert_entry(
    path: &str,
    name: &str,
    entry: &Value,
    legacy: bool,
    vcluster: &str,
    namespace: &str,
    warnings: &mut Vec<Warning>,
) -> Result<Option<VClusterPlugin>, ImportError> {
    let map = match entry {
        Value::Mapping(m) => m,
        other => {
            return Err(ImportError::Invalid {
                path: path.to_string(),
                message: format!(
                    "expected a map of plugin settings, found {}",
                    kind_of(other)
                ),
            });
        }
    };
    let mut warn = |key: &str, message: String| {
        warnings.push(Warning {
            path: format!("{path}.{key}"),
            message,
        });
    };

    let version = match (legacy, map.get("version")) {
        (_, Some(Value::String(v))) if v == "v2" => PluginVersion::V2,
        (true, None) => PluginVersion::V1,
        (true, Some(Value::String(v))) if v == "v1" => PluginVersion::V1,
        (false, None) => PluginVersion::V2,
        (legacy, Some(other)) => {
            let (version, note) = if legacy {
                (
                    PluginVersion::V1,
                    "is not `v2`, so the chart runs this plugin as a v1 sidecar; imported as `version: v1`",
                )
            } else {
                (
                    PluginVersion::V2,
                    "ignored: entries of `plugins:` are always v2 (put a v1 sidecar under `plugin:`)",
                )
            };
            warn("version", format!("`{}` {note}", scalar_text(other)));
            version
        }
    };

    let mut spec = VClusterPluginSpec {
        vcluster: VClusterRef {
            name: vcluster.to_string(),
        },
        version: Some(version),
        ..Default::default()
    };
    let mut config = None;
    for (key, value) in map {
        let key = key_string(key);
        let here = format!("{path}.{key}");
        match key.as_str() {
            "version" => {}
            "image" => spec.image = typed::<String>(&here, value, "a string")?,
            "imagePullPolicy" => {
                spec.image_pull_policy =
                    typed::<PullPolicy>(&here, value, "one of `Always`, `IfNotPresent`, `Never`")?;
            }
            "command" => spec.command = typed(&here, value, "a list of strings")?,
            "args" => spec.args = typed(&here, value, "a list of strings")?,
            "env" | "envFrom" if version == PluginVersion::V2 => warn(
                &key,
                format!(
                    "the chart renders no {key} for a v2 plugin's init container{}; dropped",
                    if legacy {
                        ""
                    } else {
                        " (and its values schema refuses it under `plugins:`)"
                    }
                ),
            ),
            "env" => spec.env = typed::<Vec<EnvVar>>(&here, value, "a list of EnvVar")?,
            "envFrom" => {
                spec.env_from =
                    typed::<Vec<EnvFromSource>>(&here, value, "a list of EnvFromSource")?;
            }
            "resources" => {
                spec.resources =
                    typed::<ResourceRequirements>(&here, value, "a ResourceRequirements map")?;
            }
            "securityContext" => {
                spec.security_context =
                    typed::<SecurityContext>(&here, value, "a SecurityContext map")?;
            }
            "volumeMounts" => {
                let mounts = typed::<Vec<VolumeMount>>(&here, value, "a list of VolumeMount")?;
                spec.volume_mounts = without_plugins_volume(&key, mounts, version, &mut warn);
            }
            "config" => config = Some(value),
            "rbac" => spec.rbac = convert_rbac(&here, value, &mut warn)?,
            "name" => {
                let container = typed::<String>(&here, value, "a string")?;
                if container.as_deref().is_some_and(|c| c != name) {
                    warn(
                        "name",
                        format!(
                            "the plugin's container is named after the VClusterPlugin (`{name}`), not `{}`; rename the key to keep the old name",
                            container.unwrap_or_default()
                        ),
                    );
                }
            }
            k if UNSUPPORTED_CONTAINER_KEYS.contains(&k) => {
                warn(k, "not supported by VClusterPlugin; dropped".into())
            }
            _ => warn(&key, "unknown plugin key; ignored".into()),
        }
    }

    if let Some(value) = config {
        let here = format!("{path}.config");
        match (version, value) {
            (_, Value::Null) => {}
            (PluginVersion::V1, Value::Mapping(_)) => {
                spec.config = Some(serde_json::to_value(value).map_err(|e| {
                    ImportError::Invalid {
                        path: here.clone(),
                        message: format!("cannot be represented as JSON: {e}"),
                    }
                })?);
            }
            (PluginVersion::V1, other) => {
                return Err(ImportError::Invalid {
                    path: here,
                    message: format!(
                        "expected a map (VClusterPlugin spec.config is an object), found {}",
                        kind_of(other)
                    ),
                });
            }
            (PluginVersion::V2, _) => warn(
                "config",
                "not carried over: a v2 plugin is started by the vCluster syncer, which passes it the config from the vCluster's own values; keep it there".into(),
            ),
        }
    }

    if spec.image.is_none() {
        warnings.push(Warning {
            path: path.to_string(),
            message: "no `image`: nothing to install (the chart only passes such an entry's config to the syncer); skipped".into(),
        });
        return Ok(None);
    }

    let mut plugin = VClusterPlugin::new(name, spec);
    plugin.metadata.namespace = Some(namespace.to_string());
    Ok(Some(plugin))
}

/// `volumeMounts` of an entry (`key`) without the mounts of the v2 plugins' volume `plugins`,
/// each with a warning: the operator mounts it into every v2 init container at `/plugins`
/// itself (the chart's values must repeat that mount once they list any), and the CRD refuses
/// any plugin's own mount of it (vCluster's syncer runs the binaries in it). `None` when no
/// mount is left.
fn without_plugins_volume(
    key: &str,
    mounts: Option<Vec<VolumeMount>>,
    version: PluginVersion,
    warn: &mut impl FnMut(&str, String),
) -> Option<Vec<VolumeMount>> {
    let mut kept = Vec::new();
    for (i, m) in mounts.into_iter().flatten().enumerate() {
        if m.name != crate::workload::PLUGINS_VOLUME {
            kept.push(m);
            continue;
        }
        let message = if version == PluginVersion::V2
            && m.mount_path == crate::workload::PLUGINS_MOUNT_PATH
        {
            "`plugins` at `/plugins`: vcluster-plugin-operator mounts it into every v2 init container itself; dropped".to_string()
        } else {
            format!(
                "`plugins` at `{}`: the volume of the v2 plugins' binaries, which vCluster's syncer runs, is mounted only by vcluster-plugin-operator's v2 init containers (at `/plugins`) and the syncer, and the VClusterPlugin schema refuses a plugin's own mount of it; dropped",
                m.mount_path
            )
        };
        warn(&format!("{key}[{i}]"), message);
    }
    Some(kept).filter(|k| !k.is_empty())
}

/// `rbac:` of an entry: `role.extraRules` and `clusterRole.extraRules`.
fn convert_rbac(
    path: &str,
    value: &Value,
    warn: &mut impl FnMut(&str, String),
) -> Result<Option<PluginRbac>, ImportError> {
    let map = match value {
        Value::Null => return Ok(None),
        Value::Mapping(m) => m,
        other => {
            return Err(ImportError::Invalid {
                path: path.to_string(),
                message: format!(
                    "expected a map with `role` / `clusterRole`, found {}",
                    kind_of(other)
                ),
            });
        }
    };
    let mut rbac = PluginRbac::default();
    for (key, value) in map {
        let key = key_string(key);
        let here = format!("{path}.{key}");
        let slot = match key.as_str() {
            "role" => &mut rbac.role,
            "clusterRole" => &mut rbac.cluster_role,
            _ => {
                warn(&format!("rbac.{key}"), "unknown rbac key; ignored".into());
                continue;
            }
        };
        let rules_map = match value {
            Value::Null => continue,
            Value::Mapping(m) => m,
            other => {
                return Err(ImportError::Invalid {
                    path: here,
                    message: format!("expected a map with `extraRules`, found {}", kind_of(other)),
                });
            }
        };
        for (rkey, rvalue) in rules_map {
            let rkey = key_string(rkey);
            if rkey == "extraRules" {
                let rules = typed::<Vec<PolicyRule>>(
                    &format!("{here}.extraRules"),
                    rvalue,
                    "a list of PolicyRule",
                )?
                .unwrap_or_default();
                if !rules.is_empty() {
                    *slot = Some(RoleRules { extra_rules: rules });
                }
            } else {
                warn(
                    &format!("rbac.{key}.{rkey}"),
                    "unknown rbac key; ignored".into(),
                );
            }
        }
    }
    Ok((rbac.role.is_some() || rbac.cluster_role.is_some()).then_some(rbac))
}

/// `value` as `T`; `null` is `None`.
fn typed<T: DeserializeOwned>(
    path: &str,
    value: &Value,
    expected: &str,
) -> Result<Option<T>, ImportError> {
    if value.is_null() {
        return Ok(None);
    }
    serde_yaml::from_value(value.clone())
        .map(Some)
        .map_err(|e| ImportError::Invalid {
            path: path.to_string(),
            message: format!("expected {expected}: {e}"),
        })
}

/// A map key as text (keys such as `1` or `true` are valid YAML).
fn key_string(key: &Value) -> String {
    match key {
        Value::String(s) => s.clone(),
        other => scalar_text(other),
    }
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "null".into(),
        other => serde_yaml::to_string(other)
            .map(|s| s.trim_end().to_string())
            .unwrap_or_else(|_| kind_of(other).to_string()),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a map",
        Value::Tagged(_) => "a tagged value",
    }
}

/// serde_yaml appends ` at line L column C` to its messages; the error carries them apart.
fn strip_location(message: &str) -> String {
    match message.find(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests;

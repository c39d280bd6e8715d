//! The two JSON documents of the v2 protocol (pure; unit-tested):
//!
//! - [`InitConfig`]: what the vCluster syncer sends in `Initialize` (vCluster v0.30.0,
//!   `pkg/plugin/v2/config.go` `InitConfig`, filled by `Manager.buildInitRequest`): the host
//!   kubeconfig (`workloadConfig`; the legacy `physicalClusterConfig` holds the same), the
//!   virtual cluster's kubeconfig (`syncerConfig`), the host namespace (`currentNamespace`),
//!   the vCluster's config (`config`: its values plus `name` and `hostNamespace`), the
//!   plugin's folder (`workingDir`) and its interceptor port (`port`). Go encodes its `[]byte`
//!   fields as standard base64 strings.
//! - [`PluginConfig`]: what the plugin answers to `GetPluginConfig` (`PluginConfig` in the
//!   same file): the client hooks it implements, one entry per `apiVersion` / `kind` with the
//!   hook points (`types`), which vCluster then calls through `Mutate`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;
use kube::config::Kubeconfig;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::contract::ProtocolError;
use crate::hooks::{ClientHook, HookPoint};

/// Every hook point, in the order vCluster's hook types are listed in its plugin SDK
/// (`CreatePhysical`, `UpdatePhysical`, `DeletePhysical`, `GetPhysical`, then the virtual
/// ones). Used to declare a plugin's hooks in a stable order.
pub const HOOK_POINTS: [HookPoint; 8] = [
    HookPoint::CreatePhysical,
    HookPoint::UpdatePhysical,
    HookPoint::DeletePhysical,
    HookPoint::GetPhysical,
    HookPoint::CreateVirtual,
    HookPoint::UpdateVirtual,
    HookPoint::DeleteVirtual,
    HookPoint::GetVirtual,
];

/// The hook type string vCluster uses for `point` (`pkg/util/pluginhookclient`: the verb
/// `Create` / `Update` / `Delete` / `Get` followed by `Physical` or `Virtual`).
pub fn hook_type(point: HookPoint) -> &'static str {
    match point {
        HookPoint::CreatePhysical => "CreatePhysical",
        HookPoint::UpdatePhysical => "UpdatePhysical",
        HookPoint::DeletePhysical => "DeletePhysical",
        HookPoint::GetPhysical => "GetPhysical",
        HookPoint::CreateVirtual => "CreateVirtual",
        HookPoint::UpdateVirtual => "UpdateVirtual",
        HookPoint::DeleteVirtual => "DeleteVirtual",
        HookPoint::GetVirtual => "GetVirtual",
    }
}

/// The hook point of a vCluster hook type string; `None` for a string vCluster does not send.
pub fn parse_hook_type(hook_type: &str) -> Option<HookPoint> {
    HOOK_POINTS
        .into_iter()
        .find(|p| self::hook_type(*p) == hook_type)
}

/// The configuration vCluster sends in `Initialize`, checked and decoded.
#[derive(Clone, Debug)]
pub struct InitConfig {
    /// Kubeconfig of the host cluster (`workloadConfig`, else `physicalClusterConfig`): the
    /// vCluster syncer's own host credentials (in a pod, its service account).
    pub host_kubeconfig: Kubeconfig,
    /// Kubeconfig of the virtual cluster (`syncerConfig`).
    pub virtual_kubeconfig: Kubeconfig,
    /// Host namespace of the vCluster (`currentNamespace`, else `config.hostNamespace`).
    pub host_namespace: String,
    /// Name of the vCluster (`config.name`, else the legacy `options.name`).
    pub vcluster: String,
    /// The vCluster's configuration (`config`: its Helm values, `name`, `hostNamespace`);
    /// `Null` when absent.
    pub vcluster_config: Value,
    /// The plugin's folder (`workingDir`: `/plugins/<name>`); its last component is the
    /// plugin's name in the vCluster's values.
    pub working_dir: Option<PathBuf>,
    /// Port vCluster reserves for this plugin's interceptors (`port`, from 13370); unused by
    /// this SDK, which registers no interceptors.
    pub port: Option<u16>,
    /// Whether vCluster Pro is enabled (`pro.enabled`) and its feature flags.
    pub pro_features: BTreeMap<String, bool>,
    /// The plugin's own configuration: the YAML vCluster passes in env `PLUGIN_CONFIG` (from
    /// `plugins.<name>.config` of its values), as JSON; `None` when not set.
    pub plugin_config: Option<Value>,
}

/// `[]byte` of Go's `encoding/json`: a standard base64 string, or `null`.
fn go_bytes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    let text: Option<String> = Option::deserialize(deserializer)?;
    match text {
        None => Ok(Vec::new()),
        Some(text) => base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom),
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawInitConfig {
    #[serde(default)]
    pro: RawPro,
    #[serde(default, deserialize_with = "go_bytes")]
    syncer_config: Vec<u8>,
    #[serde(default, deserialize_with = "go_bytes")]
    workload_config: Vec<u8>,
    #[serde(default, deserialize_with = "go_bytes")]
    config: Vec<u8>,
    #[serde(default)]
    working_dir: String,
    #[serde(default)]
    port: i64,
    #[serde(default, deserialize_with = "go_bytes")]
    options: Vec<u8>,
    #[serde(default)]
    current_namespace: String,
    #[serde(default, deserialize_with = "go_bytes")]
    physical_cluster_config: Vec<u8>,
}

#[derive(Deserialize, Default)]
struct RawPro {
    #[serde(default)]
    features: Option<BTreeMap<String, bool>>,
}

fn kubeconfig(field: &'static str, bytes: &[u8]) -> Result<Kubeconfig, ProtocolError> {
    let invalid = |message: String| ProtocolError::InitConfig {
        field,
        message: format!("not a kubeconfig: {message}"),
    };
    let text = std::str::from_utf8(bytes).map_err(|e| invalid(e.to_string()))?;
    let config = Kubeconfig::from_yaml(text).map_err(|e| invalid(e.to_string()))?;
    if config.clusters.is_empty() {
        return Err(invalid("it has no cluster".into()));
    }
    Ok(config)
}

fn json_field(field: &'static str, bytes: &[u8]) -> Result<Value, ProtocolError> {
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(bytes).map_err(|e| ProtocolError::InitConfig {
        field,
        message: format!("not JSON: {e}"),
    })
}

impl InitConfig {
    /// Decodes the `config` of an `Initialize` request; `plugin_config_yaml` is the value of
    /// env `PLUGIN_CONFIG`, if any.
    ///
    /// # Errors
    /// [`ProtocolError::InitConfig`] naming the field: not JSON, a `[]byte` field that is not
    /// base64, a kubeconfig that does not parse or has no cluster, no virtual or host
    /// kubeconfig, no namespace or no vCluster name; [`ProtocolError::PluginConfig`] when
    /// `PLUGIN_CONFIG` is not YAML.
    pub fn parse(config: &str, plugin_config_yaml: Option<&str>) -> Result<Self, ProtocolError> {
        let raw: RawInitConfig =
            serde_json::from_str(config).map_err(|e| ProtocolError::InitConfig {
                field: "config",
                message: e.to_string(),
            })?;
        if raw.syncer_config.is_empty() {
            return Err(ProtocolError::InitConfig {
                field: "syncerConfig",
                message: "missing: the virtual cluster's kubeconfig is needed".into(),
            });
        }
        let virtual_kubeconfig = kubeconfig("syncerConfig", &raw.syncer_config)?;
        let (host_field, host_bytes) = if raw.workload_config.is_empty() {
            ("physicalClusterConfig", &raw.physical_cluster_config)
        } else {
            ("workloadConfig", &raw.workload_config)
        };
        if host_bytes.is_empty() {
            return Err(ProtocolError::InitConfig {
                field: "workloadConfig",
                message: "missing (and no physicalClusterConfig): the host kubeconfig is needed"
                    .into(),
            });
        }
        let host_kubeconfig = kubeconfig(host_field, host_bytes)?;
        let vcluster_config = json_field("config", &raw.config)?;
        let options = json_field("options", &raw.options)?;
        let text = |value: &Value, key: &str| {
            value
                .get(key)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let host_namespace = Some(raw.current_namespace)
            .filter(|s| !s.is_empty())
            .or_else(|| text(&vcluster_config, "hostNamespace"))
            .ok_or(ProtocolError::InitConfig {
                field: "currentNamespace",
                message:
                    "missing (and no config.hostNamespace): the vCluster's host namespace is needed"
                        .into(),
            })?;
        let vcluster = text(&vcluster_config, "name")
            .or_else(|| text(&options, "name"))
            .ok_or(ProtocolError::InitConfig {
                field: "config",
                message: "has no name (and options has none): the vCluster's name is needed".into(),
            })?;
        let plugin_config = match plugin_config_yaml.filter(|s| !s.trim().is_empty()) {
            None => None,
            Some(yaml) => Some(serde_yaml::from_str::<Value>(yaml).map_err(|e| {
                ProtocolError::PluginConfig {
                    message: e.to_string(),
                }
            })?),
        };
        Ok(Self {
            host_kubeconfig,
            virtual_kubeconfig,
            host_namespace,
            vcluster,
            vcluster_config,
            working_dir: Some(PathBuf::from(raw.working_dir)).filter(|p| !p.as_os_str().is_empty()),
            port: u16::try_from(raw.port).ok().filter(|p| *p != 0),
            pro_features: raw.pro.features.unwrap_or_default(),
            plugin_config,
        })
    }

    /// The plugin's name: the last component of [`InitConfig::working_dir`] (vCluster starts
    /// `/plugins/<name>/plugin` in `/plugins/<name>`).
    pub fn plugin_name(&self) -> Option<String> {
        self.working_dir
            .as_ref()
            .and_then(|dir| dir.file_name())
            .map(|name| name.to_string_lossy().into_owned())
    }
}

/// The answer to `GetPluginConfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginConfig {
    /// The client hooks: vCluster calls `Mutate` for exactly these types and points.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_hooks: Vec<ClientHookDeclaration>,
}

/// One hooked type in a [`PluginConfig`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientHookDeclaration {
    /// `group/version` of the hooked type (`v1` for the core group).
    pub api_version: String,
    /// Kind of the hooked type.
    pub kind: String,
    /// The hook points, as vCluster's hook type strings (see [`hook_type`]).
    pub types: Vec<String>,
}

impl PluginConfig {
    /// The declaration of `hooks`: one entry per `apiVersion` / `kind` (in the order the
    /// types were first registered) with every point some hook of that type handles, in
    /// [`HOOK_POINTS`] order. Types whose hooks handle no point are left out.
    pub fn declare(hooks: &[Arc<dyn ClientHook>]) -> Self {
        let mut client_hooks: Vec<ClientHookDeclaration> = Vec::new();
        for hook in hooks {
            if client_hooks
                .iter()
                .any(|d| d.api_version == hook.api_version() && d.kind == hook.kind())
            {
                continue;
            }
            let of_type: Vec<&Arc<dyn ClientHook>> = hooks
                .iter()
                .filter(|h| h.api_version() == hook.api_version() && h.kind() == hook.kind())
                .collect();
            let types: Vec<String> = HOOK_POINTS
                .into_iter()
                .filter(|p| of_type.iter().any(|h| h.handles(*p)))
                .map(|p| hook_type(p).to_string())
                .collect();
            if !types.is_empty() {
                client_hooks.push(ClientHookDeclaration {
                    api_version: hook.api_version().to_string(),
                    kind: hook.kind().to_string(),
                    types,
                });
            }
        }
        Self { client_hooks }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: https://127.0.0.1:6443\nusers:\n- name: local\n  user:\n    token: abc\ncontexts:\n- name: local\n  context:\n    cluster: local\n    user: local\ncurrent-context: local\n";

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    /// An init config shaped like vCluster v0.30.0's `buildInitRequest` output (field names
    /// from `pkg/plugin/v2/config.go`, `[]byte` as base64, `config` = the JSON of
    /// `VirtualClusterConfig` with its inlined values, `name` and `hostNamespace`).
    fn vcluster_init_config() -> Value {
        json!({
            "pro": {},
            "syncerConfig": b64(KUBECONFIG),
            "workloadConfig": b64(KUBECONFIG),
            "controlPlaneConfig": b64(KUBECONFIG),
            "config": b64(&json!({"sync": {"toHost": {}}, "name": "my-vcluster", "hostNamespace": "vcluster-my"}).to_string()),
            "workingDir": "/plugins/car-sync",
            "port": 13370,
            "options": b64(&json!({"name": "my-vcluster", "serviceName": "my-vcluster"}).to_string()),
            "currentNamespace": "vcluster-my",
            "physicalClusterConfig": b64(KUBECONFIG),
        })
    }

    #[test]
    fn parses_what_vcluster_sends() {
        let config = InitConfig::parse(
            &vcluster_init_config().to_string(),
            Some("greeting: hello\ncount: 2\n"),
        )
        .unwrap();
        assert_eq!(config.host_namespace, "vcluster-my");
        assert_eq!(config.vcluster, "my-vcluster");
        assert_eq!(config.plugin_name().as_deref(), Some("car-sync"));
        assert_eq!(config.port, Some(13370));
        assert_eq!(
            config.virtual_kubeconfig.clusters[0]
                .cluster
                .as_ref()
                .unwrap()
                .server
                .as_deref(),
            Some("https://127.0.0.1:6443")
        );
        assert_eq!(config.host_kubeconfig.clusters[0].name, "local");
        assert_eq!(config.vcluster_config["sync"], json!({"toHost": {}}));
        assert_eq!(
            config.plugin_config,
            Some(json!({"greeting": "hello", "count": 2}))
        );
    }

    #[test]
    fn legacy_fields_are_the_fallbacks() {
        let mut raw = vcluster_init_config();
        let object = raw.as_object_mut().unwrap();
        object.remove("workloadConfig");
        object.remove("currentNamespace");
        object.insert(
            "config".into(),
            json!(b64(r#"{"hostNamespace": "ns-from-config"}"#)),
        );
        let config = InitConfig::parse(&raw.to_string(), None).unwrap();
        assert_eq!(config.host_namespace, "ns-from-config");
        assert_eq!(config.vcluster, "my-vcluster", "from options.name");
        assert_eq!(config.plugin_config, None);
    }

    #[test]
    fn bad_init_configs_name_the_field() {
        let cases: Vec<(Value, &str)> = vec![
            (json!({"workloadConfig": b64(KUBECONFIG)}), "syncerConfig"),
            (
                json!({"syncerConfig": "not base64!", "workloadConfig": b64(KUBECONFIG)}),
                "config",
            ),
            (
                json!({"syncerConfig": b64("clusters: 3"), "workloadConfig": b64(KUBECONFIG)}),
                "syncerConfig",
            ),
            (json!({"syncerConfig": b64(KUBECONFIG)}), "workloadConfig"),
            (
                json!({"syncerConfig": b64(KUBECONFIG), "workloadConfig": b64(KUBECONFIG), "config": b64(r#"{"name": "x"}"#)}),
                "currentNamespace",
            ),
            (
                json!({"syncerConfig": b64(KUBECONFIG), "workloadConfig": b64(KUBECONFIG), "currentNamespace": "ns"}),
                "config",
            ),
        ];
        for (raw, field) in cases {
            match InitConfig::parse(&raw.to_string(), None) {
                Err(ProtocolError::InitConfig { field: f, .. }) => assert_eq!(f, field, "{raw}"),
                other => panic!("{raw}: expected an error on {field}, got {other:?}"),
            }
        }
        let error =
            InitConfig::parse(&vcluster_init_config().to_string(), Some("a: [")).unwrap_err();
        assert!(
            matches!(error, ProtocolError::PluginConfig { .. }),
            "{error}"
        );
    }

    struct Hook(&'static str, &'static str, &'static [HookPoint]);
    impl ClientHook for Hook {
        fn name(&self) -> &str {
            "test"
        }
        fn api_version(&self) -> &str {
            self.0
        }
        fn kind(&self) -> &str {
            self.1
        }
        fn handles(&self, point: HookPoint) -> bool {
            self.2.contains(&point)
        }
    }

    #[test]
    fn declares_hooks_per_type_in_a_stable_order() {
        let hooks: Vec<Arc<dyn ClientHook>> = vec![
            Arc::new(Hook("v1", "Pod", &[HookPoint::UpdatePhysical])),
            Arc::new(Hook("example.loft.sh/v1", "Car", &[HookPoint::GetVirtual])),
            Arc::new(Hook(
                "v1",
                "Pod",
                &[HookPoint::CreatePhysical, HookPoint::UpdatePhysical],
            )),
            Arc::new(Hook("v1", "Secret", &[])),
        ];
        let declared = serde_json::to_value(PluginConfig::declare(&hooks)).unwrap();
        // The JSON vCluster's `parsePluginConfig` reads (`PluginConfig` / `ClientHook` tags).
        assert_eq!(
            declared,
            json!({"clientHooks": [
                {"apiVersion": "v1", "kind": "Pod", "types": ["CreatePhysical", "UpdatePhysical"]},
                {"apiVersion": "example.loft.sh/v1", "kind": "Car", "types": ["GetVirtual"]},
            ]})
        );
        assert_eq!(
            serde_json::to_value(PluginConfig::declare(&[])).unwrap(),
            json!({})
        );
    }

    #[test]
    fn hook_types_round_trip() {
        for point in HOOK_POINTS {
            assert_eq!(parse_hook_type(hook_type(point)), Some(point));
        }
        assert_eq!(parse_hook_type("Patch"), None);
    }
}

//! Fixtures: vCluster's chart rendered by helm (the workload of an e2e vCluster), the CRDs,
//! namespaces and YAML documents the tests create, by server-side apply under
//! [`TEST_FIELD_MANAGER`] (or created as `helm install` does, [`create_yaml`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};
use serde::Deserialize as _;

pub use crate::control_plane::TEST_FIELD_MANAGER;
use crate::control_plane::repo_root;
use crate::wait::wait_for;

/// The paths `scripts/oracles build` prints (`NAME=PATH`: `HELM`, `VCLUSTER_CHART`,
/// `TRANSLATE_ORACLE`, `PLUGIN_LOADER`), built or found once per test binary.
///
/// # Panics
/// When the script fails (Go missing, the module proxy unreachable): its output is in the panic.
pub fn oracle_paths() -> &'static BTreeMap<String, PathBuf> {
    static PATHS: OnceLock<BTreeMap<String, PathBuf>> = OnceLock::new();
    PATHS.get_or_init(|| {
        let out = Command::new(repo_root().join("scripts/oracles"))
            .arg("build")
            .output()
            .expect("run scripts/oracles build");
        assert!(
            out.status.success(),
            "scripts/oracles build failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
            .collect()
    })
}

/// The vCluster versions this project proves, oldest first: `(version, suffix)`, where the
/// suffix names that version's tools in [`oracle_paths`] (`TRANSLATE_ORACLE` + suffix,
/// `VCLUSTER_CHART` + suffix, ...): the pinned v0.30.0 (tests/vcluster-go/go.mod) and the newest
/// served, v0.36.1 (tests/vcluster-go-v0.36/go.mod), as in the README's compatibility table.
pub const VCLUSTER_VERSIONS: [(&str, &str); 2] = [("v0.30.0", ""), ("v0.36.1", "_V0_36")];

/// The path of tool `name` (an [`oracle_paths`] name without its version suffix, e.g.
/// `TRANSLATE_ORACLE`) built against vCluster `version`, one of [`VCLUSTER_VERSIONS`].
///
/// # Panics
/// When `version` is not in [`VCLUSTER_VERSIONS`] or `scripts/oracles build` printed no such
/// tool.
pub fn oracle_path_at(name: &str, version: &str) -> &'static PathBuf {
    let (_, suffix) = VCLUSTER_VERSIONS
        .iter()
        .find(|(v, _)| *v == version)
        .unwrap_or_else(|| panic!("vCluster {version} is not one of {VCLUSTER_VERSIONS:?}"));
    let key = format!("{name}{suffix}");
    oracle_paths()
        .get(&key)
        .unwrap_or_else(|| panic!("scripts/oracles build printed no {key}"))
}

/// vCluster's own chart (`chart/` of the pinned `github.com/loft-sh/vcluster` module) rendered by
/// `helm template my-vcluster <chart> --namespace <namespace>` with its default values and
/// `values` (YAML, may be empty): the YAML of every document, or helm's error.
///
/// # Errors
/// helm's message when it refuses the values (the chart's values schema, a template error).
pub fn render_vcluster_chart(namespace: &str, values: &str) -> anyhow::Result<String> {
    render_vcluster_chart_from(&oracle_paths()["VCLUSTER_CHART"], namespace, values)
}

/// [`render_vcluster_chart`] with the chart in folder `chart` (another vCluster version's, such
/// as `VCLUSTER_CHART_V0_36` of [`oracle_paths`]).
///
/// # Errors
/// As [`render_vcluster_chart`].
pub fn render_vcluster_chart_from(
    chart: &Path,
    namespace: &str,
    values: &str,
) -> anyhow::Result<String> {
    let paths = oracle_paths();
    let scratch = std::env::temp_dir().join(format!("vcp-helm-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let values_file = scratch.join(format!("values-{namespace}.yaml"));
    std::fs::write(&values_file, values)?;
    let out = Command::new(&paths["HELM"])
        .args(["template", "my-vcluster"])
        .arg(chart)
        .args(["--namespace", namespace, "-f"])
        .arg(&values_file)
        .env("HELM_CACHE_HOME", scratch.join("cache"))
        .env("HELM_CONFIG_HOME", scratch.join("config"))
        .env("HELM_DATA_HOME", scratch.join("data"))
        .output()
        .context("run helm")?;
    if !out.status.success() {
        bail!("helm template: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// vCluster's chart values that make its pods meet the `restricted` Pod Security level (the
/// syncer and the chart's `kubernetes` init container: non-root, no privilege escalation, no
/// capabilities, the runtime's default seccomp profile).
pub const RESTRICTED_VALUES: &str = r#"
controlPlane:
  statefulSet:
    security:
      podSecurityContext:
        runAsNonRoot: true
        runAsUser: 12345
        seccompProfile: { type: RuntimeDefault }
      containerSecurityContext:
        allowPrivilegeEscalation: false
        runAsUser: 12345
        runAsGroup: 12345
        capabilities: { drop: [ALL] }
  distro:
    k8s:
      securityContext:
        allowPrivilegeEscalation: false
        capabilities: { drop: [ALL] }
"#;

/// The workload part of a vCluster as vCluster's own chart (v0.30.0, default values) creates
/// it in `namespace`, as YAML for [`apply_yaml`]: the ServiceAccounts (`vc-my-vcluster`, the
/// StatefulSet's), the config Secret, the Services (`my-vcluster`, the owner vCluster puts on
/// host copies, and `my-vcluster-headless`) and the StatefulSet `my-vcluster` (container
/// `syncer`, init container `kubernetes`). The chart's RBAC objects are left out: each test
/// brings the Role it needs. Append further documents after a `---`.
///
/// # Panics
/// When helm cannot render the chart.
pub fn vcluster_workload(namespace: &str) -> String {
    vcluster_workload_with(namespace, "")
}

/// [`vcluster_workload`] with the chart's `values` (YAML) on top of its defaults; for example
/// `controlPlane.statefulSet.persistence.volumeClaim.enabled: false` makes the chart render a
/// Deployment instead of the StatefulSet.
///
/// # Panics
/// When helm cannot render the chart with these values.
pub fn vcluster_workload_with(namespace: &str, values: &str) -> String {
    let rendered = render_vcluster_chart(namespace, values).expect("render vCluster's chart");
    let docs: Vec<String> = serde_yaml::Deserializer::from_str(&rendered)
        .filter_map(|doc| serde_yaml::Value::deserialize(doc).ok())
        .filter(|doc| {
            matches!(
                doc["kind"].as_str(),
                Some("ServiceAccount" | "Secret" | "Service" | "StatefulSet" | "Deployment")
            )
        })
        .map(|doc| serde_yaml::to_string(&doc).expect("yaml"))
        .collect();
    docs.join("---\n")
}

/// What an operator process started by a test needs on the host: the committed CRDs, the
/// namespace `vcp-system`, the operator's ClusterRole and leader-election Role
/// (`config/rbac`), and their bindings to the test's operator user
/// (`config/rbac/test-user-*.yaml`).
///
/// # Panics
/// When a CRD or one of those files is refused.
pub async fn install_operator_rbac(admin: &Client) {
    install_crds(admin).await;
    create_namespace(admin, "vcp-system").await;
    for file in [
        "config/rbac/role.yaml",
        "config/rbac/test-user-binding.yaml",
        "config/rbac/leader_election_role.yaml",
        "config/rbac/test-user-leader-election-binding.yaml",
    ] {
        apply_yaml_file(admin, file, None)
            .await
            .unwrap_or_else(|e| panic!("apply {file}: {e:#}"));
    }
}

/// Installs the committed CRDs (`crds/*.yaml`) by server-side apply and waits until each is
/// Established.
///
/// # Panics
/// When a CRD is refused or not Established within 30 s.
pub async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in vcp_crds::CRD_FILES {
        let text = std::fs::read_to_string(repo_root().join("crds").join(file)).expect("read CRD");
        let crd: CustomResourceDefinition = serde_yaml::from_str(&text).expect("parse CRD");
        let name = crd.metadata.name.clone().expect("CRD name");
        crds.patch(
            &name,
            &PatchParams::apply(TEST_FIELD_MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("apply CRD {name}: {e}"));
        wait_for(Duration::from_secs(30), || {
            let crds = crds.clone();
            let name = name.clone();
            async move {
                let crd = crds.get(&name).await.ok()?;
                crd.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            }
        })
        .await;
    }
}

/// Creates namespace `name` (server-side apply: no error when it exists).
///
/// # Panics
/// When the API server refuses it.
pub async fn create_namespace(client: &Client, name: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
    }))
    .expect("namespace");
    namespaces
        .patch(
            name,
            &PatchParams::apply(TEST_FIELD_MANAGER),
            &Patch::Apply(&ns),
        )
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
}

/// Applies every document of a YAML file by server-side apply (field manager
/// [`TEST_FIELD_MANAGER`]), resolving each kind through API discovery. Namespaced objects
/// without a namespace go to `default_namespace`.
///
/// # Errors
/// When a document cannot be parsed, its kind is unknown, or the API server refuses it.
pub async fn apply_yaml(
    client: &Client,
    yaml: &str,
    default_namespace: Option<&str>,
) -> anyhow::Result<Vec<DynamicObject>> {
    write_yaml(client, yaml, default_namespace, None).await
}

/// Creates every document of `yaml` (POST, as `helm install` does) under `field_manager`, with
/// `default_namespace` for namespaced objects that name none; returns the created objects.
///
/// # Errors
/// As [`apply_yaml`]; an object that exists already is an error too.
pub async fn create_yaml(
    client: &Client,
    yaml: &str,
    default_namespace: Option<&str>,
    field_manager: &str,
) -> anyhow::Result<Vec<DynamicObject>> {
    write_yaml(client, yaml, default_namespace, Some(field_manager)).await
}

/// [`apply_yaml`] (`create_as: None`) or [`create_yaml`] (`Some(field manager)`).
async fn write_yaml(
    client: &Client,
    yaml: &str,
    default_namespace: Option<&str>,
    create_as: Option<&str>,
) -> anyhow::Result<Vec<DynamicObject>> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut applied = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        let obj: DynamicObject = serde_yaml::from_value(value)?;
        let types = obj
            .types
            .clone()
            .context("document without apiVersion/kind")?;
        let gvk = kube::core::GroupVersionKind::try_from(&types)?;
        let (resource, caps) = discovery
            .resolve_gvk(&gvk)
            .with_context(|| format!("unknown kind {gvk:?}"))?;
        let name = obj
            .metadata
            .name
            .clone()
            .context("document without metadata.name")?;
        let api: Api<DynamicObject> = if caps.scope == Scope::Namespaced {
            let ns = obj
                .metadata
                .namespace
                .clone()
                .or(default_namespace.map(str::to_string))
                .unwrap_or_else(|| "default".to_string());
            Api::namespaced_with(client.clone(), &ns, &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        let out = match create_as {
            Some(manager) => api
                .create(
                    &PostParams {
                        field_manager: Some(manager.into()),
                        ..PostParams::default()
                    },
                    &obj,
                )
                .await
                .with_context(|| format!("create {} {name}", gvk.kind))?,
            None => api
                .patch(
                    &name,
                    &PatchParams::apply(TEST_FIELD_MANAGER).force(),
                    &Patch::Apply(&obj),
                )
                .await
                .with_context(|| format!("apply {} {name}", gvk.kind))?,
        };
        applied.push(out);
    }
    Ok(applied)
}

/// [`apply_yaml`] of a file, path relative to the repository root or absolute.
///
/// # Errors
/// As [`apply_yaml`], or when the file cannot be read.
pub async fn apply_yaml_file(
    client: &Client,
    path: impl AsRef<Path>,
    default_namespace: Option<&str>,
) -> anyhow::Result<Vec<DynamicObject>> {
    let path = repo_root().join(path);
    let yaml =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    apply_yaml(client, &yaml, default_namespace).await
}

/// Labels as a sorted map from a list of pairs, for exact comparisons in tests.
pub fn string_map<const N: usize>(pairs: [(&str, &str); N]) -> BTreeMap<String, String> {
    pairs
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The API server's message when `result` is a refusal, `None` when it succeeded.
///
/// # Panics
/// When `result` failed otherwise than with an API answer.
pub fn refusal<T>(result: Result<T, kube::Error>) -> Option<String> {
    match result {
        Ok(_) => None,
        Err(kube::Error::Api(e)) => Some(format!("{} ({})", e.message, e.code)),
        Err(e) => panic!("not an API answer: {e}"),
    }
}

//! Test support: real `etcd` and `kube-apiserver` processes for the end-to-end suite.
//!
//! [`ControlPlane`] drives `scripts/control-plane` (the same steps the demo uses): the binaries
//! are built once from their pinned Go modules and cached outside the repo; each test binary
//! starts one etcd and two API servers, the **host** cluster and the **virtual** cluster (the
//! vCluster's own control plane), on free 127.0.0.1 ports, RBAC on, with static-token
//! identities ([`Identity`]). Tests share that control plane and keep apart by namespace.
//!
//! Stopping: an owned [`ControlPlane`] stops on drop, also when a test panics. The shared one
//! lives in a static, which Rust never drops, so `up` is also given the test binary's pid: a
//! watchdog stops the processes once the binary has exited, however it ended. Their state
//! folders (`$TMPDIR/vcp-control-plane-<pid>-<n>`: logs, audit log, kubeconfigs) outlive the
//! binary so a failure can be read afterwards; [`ControlPlane::start`] removes those of test
//! binaries that are no longer running.
//!
//! [`image`] builds the container image without a container engine: it replays the Dockerfile.

pub mod image;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::{Discovery, Scope};
use kube::{Client, Config};
use serde::Deserialize as _;

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

/// vCluster's own chart (`chart/` of the pinned `github.com/loft-sh/vcluster` module) rendered by
/// `helm template my-vcluster <chart> --namespace <namespace>` with its default values and
/// `values` (YAML, may be empty): the YAML of every document, or helm's error.
///
/// # Errors
/// helm's message when it refuses the values (the chart's values schema, a template error).
pub fn render_vcluster_chart(namespace: &str, values: &str) -> anyhow::Result<String> {
    let paths = oracle_paths();
    let scratch = std::env::temp_dir().join(format!("vcp-helm-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let values_file = scratch.join(format!("values-{namespace}.yaml"));
    std::fs::write(&values_file, values)?;
    let out = Command::new(&paths["HELM"])
        .args(["template", "my-vcluster"])
        .arg(&paths["VCLUSTER_CHART"])
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

/// Field manager of the writes the test support itself makes (fixtures, namespaces, CRDs).
pub const TEST_FIELD_MANAGER: &str = "vcp-tests";

/// Which of the two API servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cluster {
    /// The host cluster, where the vCluster's workload and the VClusterPlugins live.
    Host,
    /// The virtual cluster: the vCluster's own control plane.
    Virtual,
}

/// A static-token identity of the control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    /// User `admin` in `system:masters`: may do anything.
    Admin,
    /// User `vcp-operator`: holds only what RBAC grants it (config/rbac).
    Operator,
    /// User `vcp-syncer`: holds only what RBAC grants it.
    Syncer,
}

impl Cluster {
    fn as_str(self) -> &'static str {
        match self {
            Cluster::Host => "host",
            Cluster::Virtual => "virtual",
        }
    }
}

impl Identity {
    /// The user name the API server sees for this identity.
    pub fn user(self) -> &'static str {
        match self {
            Identity::Admin => "admin",
            Identity::Operator => "vcp-operator",
            Identity::Syncer => "vcp-syncer",
        }
    }
    fn as_str(self) -> &'static str {
        match self {
            Identity::Admin => "admin",
            Identity::Operator => "operator",
            Identity::Syncer => "syncer",
        }
    }
}

/// A running local control plane (one etcd, a host and a virtual API server), stopped on drop.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
}

/// The repository's root folder.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

impl ControlPlane {
    /// Starts a new control plane in a fresh temporary folder with `scripts/control-plane up`
    /// (building the binaries first when they are not cached).
    ///
    /// # Errors
    /// When the script fails: its output is in the error.
    pub fn start() -> anyhow::Result<Self> {
        static STARTED: AtomicU32 = AtomicU32::new(0);
        remove_stale_state_dirs(&std::env::temp_dir());
        let dir = std::env::temp_dir().join(format!(
            "{STATE_DIR_PREFIX}{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        let out = Command::new(repo_root().join("scripts/control-plane"))
            .arg("up")
            .arg("--dir")
            .arg(&dir)
            .arg("--watch-pid")
            .arg(std::process::id().to_string())
            .output()
            .context("run scripts/control-plane up")?;
        if !out.status.success() {
            bail!(
                "scripts/control-plane up failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(ControlPlane { dir })
    }

    /// The control plane of this test binary, started on first use; its processes stop when
    /// the test binary exits.
    ///
    /// # Panics
    /// When it cannot be started (the error says why).
    pub fn shared() -> &'static ControlPlane {
        static SHARED: OnceLock<ControlPlane> = OnceLock::new();
        SHARED.get_or_init(|| ControlPlane::start().expect("start the local control plane"))
    }

    /// Stops `cluster`'s kube-apiserver and starts it again on the same port with the same
    /// flags and certificates (`scripts/control-plane restart`), returning once it answers
    /// `/readyz`. etcd keeps running, so every object survives; clients made earlier reconnect
    /// on their next request, and the audit log is appended to. Blocks the calling thread for
    /// the restart (typically 3–10 s).
    ///
    /// # Errors
    /// When the script fails (the server did not stop, or was not ready within 60 s): its
    /// output is in the error.
    pub fn restart(&self, cluster: Cluster) -> anyhow::Result<()> {
        let out = Command::new(repo_root().join("scripts/control-plane"))
            .arg("restart")
            .arg(cluster.as_str())
            .arg("--dir")
            .arg(&self.dir)
            .output()
            .context("run scripts/control-plane restart")?;
        if !out.status.success() {
            bail!(
                "scripts/control-plane restart {} failed ({}):\n{}{}",
                cluster.as_str(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Starts Kubernetes' garbage collector for the host cluster (`scripts/control-plane gc`:
    /// kube-controller-manager, built from the same pinned Kubernetes module as kube-apiserver,
    /// with only its `garbagecollector` controller), once per control plane, returning when its
    /// resource monitors have synced (at most ~30 s). It runs until the control plane stops.
    /// Without it nothing deletes objects whose owners are gone: the test control plane runs
    /// no controllers.
    ///
    /// # Errors
    /// When the script fails (kube-controller-manager could not be built or exited): its
    /// output is in the error.
    pub fn start_garbage_collector(&self) -> anyhow::Result<()> {
        let out = Command::new(repo_root().join("scripts/control-plane"))
            .arg("gc")
            .arg("--dir")
            .arg(&self.dir)
            .output()
            .context("run scripts/control-plane gc")?;
        if !out.status.success() {
            bail!(
                "scripts/control-plane gc failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// The folder holding kubeconfigs, logs and the audit logs (`audit-{host,virtual}.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the kubeconfig for `cluster` as `identity`.
    pub fn kubeconfig(&self, cluster: Cluster, identity: Identity) -> PathBuf {
        self.dir.join(format!(
            "kubeconfig-{}-{}",
            cluster.as_str(),
            identity.as_str()
        ))
    }

    /// A kube client config for `cluster` as `identity`.
    ///
    /// # Errors
    /// When the kubeconfig cannot be read.
    pub async fn config(&self, cluster: Cluster, identity: Identity) -> anyhow::Result<Config> {
        config_from(&self.kubeconfig(cluster, identity)).await
    }

    /// A new client for `cluster` as `identity` (a client belongs to the tokio runtime that
    /// made it, so each test makes its own).
    ///
    /// # Panics
    /// When the kubeconfig cannot be read or the client cannot be built.
    pub async fn client(&self, cluster: Cluster, identity: Identity) -> Client {
        let config = self
            .config(cluster, identity)
            .await
            .expect("read kubeconfig");
        Client::try_from(config).expect("build client")
    }

    /// Mints a token for service account `namespace/name` of `cluster` with the TokenRequest
    /// API (the service account is created when missing). A vCluster's runtime acts as
    /// `vc-<vcluster>` on the host, so tests can hold it to exactly the RBAC the operator granted.
    ///
    /// # Errors
    /// When the service account or the token cannot be created.
    pub async fn service_account_token(
        &self,
        cluster: Cluster,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<String> {
        let admin = self.client(cluster, Identity::Admin).await;
        let sas: Api<ServiceAccount> = Api::namespaced(admin, namespace);
        let sa: ServiceAccount = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace}
        }))?;
        sas.patch(
            name,
            &PatchParams::apply(TEST_FIELD_MANAGER),
            &Patch::Apply(&sa),
        )
        .await?;
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![format!("https://{}.vcp.test", cluster.as_str())],
                expiration_seconds: Some(3600),
                ..Default::default()
            },
            ..Default::default()
        };
        Ok(sas
            .create_token_request(name, &PostParams::default(), &request)
            .await?
            .status
            .context("TokenRequest returned no status")?
            .token)
    }

    /// A client acting as service account `namespace/name` (see
    /// [`ControlPlane::service_account_token`]).
    ///
    /// # Errors
    /// When the token cannot be minted or the client built.
    pub async fn service_account_client(
        &self,
        cluster: Cluster,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<Client> {
        let token = self.service_account_token(cluster, namespace, name).await?;
        let mut config = self.config(cluster, Identity::Admin).await?;
        config.auth_info.token = Some(token.into());
        Ok(Client::try_from(config)?)
    }

    /// Writes a kubeconfig acting as service account `namespace/name` (see
    /// [`ControlPlane::service_account_token`]) into the control plane's folder, for a process
    /// such as `vcluster-plugin-syncer`; returns its path.
    ///
    /// # Errors
    /// When the token cannot be minted or the file written.
    pub async fn service_account_kubeconfig(
        &self,
        cluster: Cluster,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<PathBuf> {
        let token = self.service_account_token(cluster, namespace, name).await?;
        let text = std::fs::read_to_string(self.kubeconfig(cluster, Identity::Admin))?;
        let mut doc: serde_yaml::Value = serde_yaml::from_str(&text)?;
        doc["users"][0]["user"]["token"] = serde_yaml::Value::String(token);
        let path = self.dir.join(format!(
            "kubeconfig-{}-sa-{namespace}-{name}",
            cluster.as_str()
        ));
        std::fs::write(&path, serde_yaml::to_string(&doc)?)?;
        Ok(path)
    }
}

/// Name prefix of the state folders [`ControlPlane::start`] makes: `<prefix><pid>-<n>`.
const STATE_DIR_PREFIX: &str = "vcp-control-plane-";

/// Removes the state folders in `tmp` left by test binaries that are no longer running (no
/// `/proc/<pid>`). A folder that still lists processes (`pids`: the binary exited moments ago
/// and its watchdog, which polls every 0.5 s, has not run `down` yet) is first stopped with
/// `scripts/control-plane down --dir`, as the watchdog would, so no process loses its state
/// folder while running. Folders of running binaries (other test binaries of the same
/// `cargo test`) and names of another shape are kept. Errors are ignored: a folder that cannot
/// be removed is only disk space.
fn remove_stale_state_dirs(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(STATE_DIR_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let dir = entry.path();
        if dir.join("pids").exists() {
            let _ = Command::new(repo_root().join("scripts/control-plane"))
                .arg("down")
                .arg("--dir")
                .arg(&dir)
                .output();
        }
        if !dir.join("pids").exists() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("scripts/control-plane"))
            .arg("down")
            .arg("--dir")
            .arg(&self.dir)
            .output();
        // After a failed test the folder stays for reading (and goes at a later start).
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Installs the CRDs and the operator's RBAC (`config/rbac/role.yaml` plus the binding of the
/// static-token user `vcp-operator`) on the shared host cluster, and starts one operator for
/// this test binary, as `vcp-operator`, with `runtime_image` as its embedded-runtime image. The
/// operator runs on a thread and tokio runtime of its own, so it outlives each test's runtime;
/// later calls only return a new admin client.
///
/// # Panics
/// When the CRDs or the RBAC cannot be applied, or the operator stops.
pub async fn start_shared_operator(runtime_image: &'static str) -> Client {
    static STARTED: OnceLock<()> = OnceLock::new();
    let cp = ControlPlane::shared();
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    if STARTED.get().is_none() {
        install_crds(&admin).await;
        for file in [
            "config/rbac/role.yaml",
            "config/rbac/test-user-binding.yaml",
        ] {
            apply_yaml_file(&admin, file, None)
                .await
                .unwrap_or_else(|e| panic!("apply {file}: {e:#}"));
        }
        STARTED.get_or_init(|| {
            std::thread::spawn(move || {
                let rt = tokio::runtime::Runtime::new().expect("operator runtime");
                rt.block_on(async {
                    let client = ControlPlane::shared()
                        .client(Cluster::Host, Identity::Operator)
                        .await;
                    let mut config = vcluster_plugin_operator::Config::new(client);
                    config.runtime_image = runtime_image.into();
                    vcluster_plugin_operator::run(config)
                        .await
                        .expect("operator stopped");
                });
            });
        });
    }
    admin
}

/// Reads a kubeconfig file into a kube client config.
///
/// # Errors
/// When the file cannot be read or parsed.
pub async fn config_from(path: &Path) -> anyhow::Result<Config> {
    let kubeconfig =
        Kubeconfig::read_from(path).with_context(|| format!("read {}", path.display()))?;
    Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
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

/// Polls `check` every 100 ms until it returns `Some`, and returns that value.
///
/// # Panics
/// When `timeout` passes first.
pub async fn wait_for<T, F, Fut>(timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if Instant::now() > deadline {
            panic!("condition not met within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The complete audit events of `cluster`'s audit log, one JSON value per line. A last line
/// the API server is still writing (no newline yet) is left out; the log survives
/// [`ControlPlane::restart`] (the restarted server appends to the same file).
fn audit_events(cp: &ControlPlane, cluster: Cluster) -> anyhow::Result<Vec<serde_json::Value>> {
    let path = cp.dir.join(format!("audit-{}.log", cluster.as_str()));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter(|line| !line.is_empty())
        .map(|line| serde_json::from_str(line).with_context(|| format!("audit line {line}")))
        .collect()
}

/// Write requests (create, update, patch, delete) that `user` made on `cluster`, read from the
/// API server's audit log: one `(verb, request URI)` per request, in order.
///
/// # Errors
/// When the audit log cannot be read.
pub fn audited_writes(
    cp: &ControlPlane,
    cluster: Cluster,
    user: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    Ok(audited_write_events(cp, cluster)?
        .into_iter()
        .filter(|w| w.user == user)
        .map(|w| (w.verb, w.uri))
        .collect())
}

/// One write request from the API server's audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditedWrite {
    /// User name (such as `vcp-operator`).
    pub user: String,
    /// The request's `User-Agent` header (tells apart replicas that share a user).
    pub user_agent: String,
    /// `create`, `update`, `patch`, `delete` or `deletecollection`.
    pub verb: String,
    /// The request URI.
    pub uri: String,
    /// Name of the object written (`objectRef.name`; for a create, the name in the body);
    /// empty when absent.
    pub object_name: String,
    /// HTTP status of the response (`responseStatus.code`: 200, 201, 409, …; 0 when absent).
    pub code: u16,
    /// When the API server received the request (`requestReceivedTimestamp`, microsecond
    /// precision); the Unix epoch when absent.
    pub received_at: std::time::SystemTime,
}

/// Every write request made on `cluster` so far, in order, with user, user agent, response
/// code and time (see [`audited_writes`] for a user's `(verb, uri)` pairs).
///
/// # Errors
/// When the audit log cannot be read or a complete line is not JSON.
pub fn audited_write_events(
    cp: &ControlPlane,
    cluster: Cluster,
) -> anyhow::Result<Vec<AuditedWrite>> {
    let mut writes = Vec::new();
    for event in audit_events(cp, cluster)? {
        if event["stage"] != "ResponseComplete" {
            continue;
        }
        let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        let received_at = event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map_or(std::time::UNIX_EPOCH, std::time::SystemTime::from);
        writes.push(AuditedWrite {
            user: s(&event["user"]["username"]),
            user_agent: s(&event["userAgent"]),
            verb: s(&event["verb"]),
            uri: s(&event["requestURI"]),
            object_name: s(&event["objectRef"]["name"]),
            code: event["responseStatus"]["code"]
                .as_u64()
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(0),
            received_at,
        });
    }
    Ok(writes)
}

/// Labels as a sorted map from a list of pairs, for exact comparisons in tests.
pub fn string_map<const N: usize>(pairs: [(&str, &str); N]) -> BTreeMap<String, String> {
    pairs
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_state_dirs_of_dead_test_binaries_are_removed() {
        let tmp = std::env::temp_dir().join(format!("vcp-stale-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        // 999999999 is above any Linux pid_max (at most 2^22), so it never runs.
        let dead = tmp.join(format!("{STATE_DIR_PREFIX}999999999-0"));
        let alive = tmp.join(format!("{STATE_DIR_PREFIX}{}-0", std::process::id()));
        let other = tmp.join("vcp-control-plane-notapid-0");
        let unrelated = tmp.join("something-else");
        for d in [&dead, &alive, &other, &unrelated] {
            std::fs::create_dir_all(d.join("logs")).unwrap();
        }
        // A process of the dead binary's control plane whose watchdog has not run yet (not a
        // child of this test, like the real ones, so it is reaped once stopped).
        let out = Command::new("sh")
            .args(["-c", "sleep 600 >/dev/null 2>&1 & echo $!"])
            .output()
            .unwrap();
        let leftover = String::from_utf8(out.stdout).unwrap().trim().to_string();
        std::fs::write(dead.join("pids"), format!("{leftover} etcd\n")).unwrap();
        remove_stale_state_dirs(&tmp);
        let running = Path::new("/proc").join(&leftover).exists();
        let _ = Command::new("kill").arg(&leftover).status();
        assert!(
            !running,
            "the leftover process is stopped before its folder goes"
        );
        let left: Vec<bool> = [&dead, &alive, &other, &unrelated]
            .iter()
            .map(|d| d.exists())
            .collect();
        std::fs::remove_dir_all(&tmp).unwrap();
        assert_eq!(left, [false, true, true, true]);
    }
}

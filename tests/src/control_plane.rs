//! The local control plane: one etcd and two `kube-apiserver`s, the **host** cluster and the
//! **virtual** cluster (the vCluster's own control plane), started by `scripts/control-plane`
//! on free 127.0.0.1 ports, RBAC on, with static-token identities ([`Identity`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context as _, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

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
    /// User `tenant-edit`: a namespace user; no rights of its own, tests bind them (typically
    /// the built-in ClusterRole `edit` in a namespace, plus VClusterPlugins).
    TenantEdit,
    /// User `tenant-nosecrets`: a namespace user that tests give edit-like rights without
    /// `secrets`.
    TenantNoSecrets,
    /// User `tenant-nopatch`: a namespace user that tests give edit-like rights without `patch`
    /// on StatefulSets.
    TenantNoPatch,
    /// User `tenant-norbac`: a namespace user that tests give the built-in `edit` alone, which
    /// may not write Roles or RoleBindings.
    TenantNoRbac,
}

impl Cluster {
    /// `host` or `virtual`, as the runtime's messages and the control plane's files name it.
    pub fn as_str(self) -> &'static str {
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
            Identity::TenantEdit => "tenant-edit",
            Identity::TenantNoSecrets => "tenant-nosecrets",
            Identity::TenantNoPatch => "tenant-nopatch",
            Identity::TenantNoRbac => "tenant-norbac",
        }
    }
    /// The identity's name in `scripts/control-plane`'s kubeconfig files
    /// (`kubeconfig-<cluster>-<name>`).
    fn as_str(self) -> &'static str {
        match self {
            Identity::Admin => "admin",
            Identity::Operator => "operator",
            Identity::Syncer => "syncer",
            Identity::TenantEdit => "tenant-edit",
            Identity::TenantNoSecrets => "tenant-nosecrets",
            Identity::TenantNoPatch => "tenant-nopatch",
            Identity::TenantNoRbac => "tenant-norbac",
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
        let pid = std::process::id().to_string();
        control_plane_script(&["up"], &dir, &["--watch-pid", &pid])?;
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
        control_plane_script(&["restart", cluster.as_str()], &self.dir, &[])
    }

    /// Stops etcd and starts it again on the same port with the same data folder
    /// (`scripts/control-plane restart etcd`), returning once it answers `/health`. Both API
    /// servers lose their storage meanwhile (requests fail, watches end) and reconnect on
    /// their own; every object survives. Blocks the calling thread (typically 1–10 s).
    ///
    /// # Errors
    /// When the script fails: its output is in the error.
    pub fn restart_etcd(&self) -> anyhow::Result<()> {
        control_plane_script(&["restart", "etcd"], &self.dir, &[])
    }

    /// Compacts etcd at its current revision with etcd's own API (`scripts/control-plane
    /// compact`: its gRPC gateway's `/v3/kv/range` for the revision, then `/v3/kv/compaction`
    /// with `physical: true`), and returns that revision: from then on, a watch or list from
    /// an older revision is answered `410 Gone` by etcd.
    ///
    /// # Errors
    /// When the script fails or prints no revision.
    pub fn compact_etcd(&self) -> anyhow::Result<u64> {
        let out = Command::new(repo_root().join("scripts/control-plane"))
            .arg("compact")
            .arg("--dir")
            .arg(&self.dir)
            .output()
            .context("run scripts/control-plane compact")?;
        if !out.status.success() {
            bail!(
                "scripts/control-plane compact failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .context("the revision scripts/control-plane compact printed")
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
        control_plane_script(&["gc"], &self.dir, &[])
    }

    /// The kubectl `scripts/control-plane` chose (the machine's own, else the one it built), as
    /// written in the first `PATH` entry of the control plane's `env` file; `kubectl` when the
    /// file names none.
    pub fn kubectl(&self) -> PathBuf {
        let env = std::fs::read_to_string(self.dir.join("env")).unwrap_or_default();
        env.lines()
            .find_map(|l| l.strip_prefix("export PATH="))
            .and_then(|p| p.split(':').next())
            .map(|dir| PathBuf::from(dir).join("kubectl"))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("kubectl"))
    }

    /// The folder holding kubeconfigs, logs and the audit logs (`audit-{host,virtual}.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pid `scripts/control-plane` recorded last for process `name` (`etcd`,
    /// `apiserver-host`, `apiserver-virtual`) in this control plane's `pids` file; a restart
    /// records the new one.
    ///
    /// # Panics
    /// When the file cannot be read or names no such process.
    pub fn pid_of(&self, name: &str) -> u32 {
        let pids = std::fs::read_to_string(self.dir.join("pids")).expect("read the pids file");
        pids.lines()
            .rev()
            .filter_map(|line| line.split_once(' '))
            .filter(|(_, n)| *n == name)
            .find_map(|(pid, _)| pid.parse().ok())
            .unwrap_or_else(|| panic!("{name} is not in the pids file:\n{pids}"))
    }

    /// Asserts that process `name` was restarted since it had pid `before`: another pid now,
    /// and that one running; returns it. `context` starts each failure message.
    ///
    /// # Panics
    /// When it was not restarted, or the new process is not running.
    pub fn assert_restarted(&self, name: &str, before: u32, context: &str) -> u32 {
        let after = self.pid_of(name);
        assert_ne!(
            after, before,
            "{context}{name} was not restarted (same pid {before})"
        );
        assert!(
            Path::new(&format!("/proc/{after}")).exists(),
            "{context}the restarted {name} (pid {after}) is not running"
        );
        after
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

/// Reads a kubeconfig file into a kube client config.
///
/// # Errors
/// When the file cannot be read or parsed.
pub async fn config_from(path: &Path) -> anyhow::Result<Config> {
    let kubeconfig =
        Kubeconfig::read_from(path).with_context(|| format!("read {}", path.display()))?;
    Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
}

/// Runs `scripts/control-plane <command...> --dir <dir> <extra...>` and waits for it.
///
/// # Errors
/// When the script cannot be started or exits non-zero: `scripts/control-plane <command>
/// failed (<exit status>)` followed by its stdout and stderr.
fn control_plane_script(command: &[&str], dir: &Path, extra: &[&str]) -> anyhow::Result<()> {
    let what = format!("scripts/control-plane {}", command.join(" "));
    let out = Command::new(repo_root().join("scripts/control-plane"))
        .args(command)
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .output()
        .with_context(|| format!("run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
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
            let _ = control_plane_script(&["down"], &dir, &[]);
        }
        if !dir.join("pids").exists() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = control_plane_script(&["down"], &self.dir, &[]);
        // After a failed test the folder stays for reading (and goes at a later start).
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
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

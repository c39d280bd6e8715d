//! vCluster's own syncer as a local process: `scripts/control-plane syncer start|stop`.
//!
//! The binary is the `VCLUSTER_SYNCER` oracle (`tests/vcluster-go/cmd/vcluster-syncer`: a `main`
//! calling vCluster's `cmd/vcluster` command, built by `scripts/oracles` from
//! `github.com/loft-sh/vcluster` at the version pinned in `tests/vcluster-go/go.mod`). It runs
//! what the pod of a chart-rendered vCluster runs, `start --config <vc-config Secret's
//! config.yaml>`, against the host API server (as the pod template's service account), with the
//! virtual API server of the [`ControlPlane`] as its control plane, a TLS etcd (signed by the
//! control plane's CA) as its mapping store, and a plugins folder as its `/plugins`: see
//! `cmd_syncer_start` in `scripts/control-plane` for each override of the chart's configuration
//! and why a machine without nodes needs it.
//!
//! vCluster's legacy v1 plugin server always binds `localhost:10099`, so one syncer runs at a
//! time on a machine (a lock the script takes waits for the previous one to stop); a test binary
//! that uses one should run its tests one after another (one `#[tokio::test]` driving the
//! steps, or a static lock).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kube::Client;
use serde::Deserialize as _;

use crate::control_plane::{ControlPlane, repo_root};
use crate::fixtures::{apply_yaml, oracle_paths, render_vcluster_chart_from};

/// The chart's release name, as the other tests render it (`helm template my-vcluster`).
pub const VCLUSTER_RELEASE: &str = "my-vcluster";

/// A running vCluster syncer, stopped (SIGTERM, then SIGKILL after 10 s) on drop.
#[derive(Debug)]
pub struct VClusterSyncer {
    cp_dir: PathBuf,
    namespace: String,
    name: String,
    plugins: PathBuf,
    pid: Option<u32>,
}

/// Every object of vCluster's chart rendered for release [`VCLUSTER_RELEASE`] in `namespace`
/// with `values` (YAML on top of the chart's defaults), applied to the host by `admin` as
/// `helm install` leaves them: the service accounts, the config Secret `vc-config-<release>`
/// (whose `config.yaml` is the syncer's configuration), the Services, the StatefulSet and the
/// chart's RBAC (the Role the operator appends plugin rules to, and the ClusterRole), each with
/// helm's ownership metadata (label `app.kubernetes.io/managed-by: Helm`, annotations
/// `meta.helm.sh/release-name` and `meta.helm.sh/release-namespace`). vCluster relies on the
/// Service having annotations: v0.30's service-CIDR detection (`pkg/util/servicecidr`) writes
/// its result into the Service's annotation map and panics when the Service has none. Nothing
/// runs the StatefulSet: a [`VClusterSyncer`] is its pod.
///
/// # Errors
/// When helm refuses the values or the host refuses an object.
pub async fn install_vcluster_chart(
    admin: &Client,
    namespace: &str,
    values: &str,
) -> anyhow::Result<()> {
    install_vcluster_chart_from(admin, &oracle_paths()["VCLUSTER_CHART"], namespace, values).await
}

/// [`install_vcluster_chart`] with the chart in folder `chart` (another vCluster version's).
///
/// # Errors
/// As [`install_vcluster_chart`].
pub async fn install_vcluster_chart_from(
    admin: &Client,
    chart: &Path,
    namespace: &str,
    values: &str,
) -> anyhow::Result<()> {
    let rendered = render_vcluster_chart_from(chart, namespace, values)?;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&rendered) {
        let mut doc = serde_yaml::Value::deserialize(doc)?;
        if doc.is_null() {
            continue;
        }
        let meta = doc
            .get_mut("metadata")
            .context("a rendered document without metadata")?;
        meta["labels"]["app.kubernetes.io/managed-by"] = "Helm".into();
        meta["annotations"]["meta.helm.sh/release-name"] = VCLUSTER_RELEASE.into();
        meta["annotations"]["meta.helm.sh/release-namespace"] = namespace.into();
        docs.push(serde_yaml::to_string(&doc)?);
    }
    apply_yaml(admin, &docs.join("---\n"), Some(namespace)).await?;
    Ok(())
}

impl VClusterSyncer {
    /// Starts vCluster's syncer for the chart-rendered vCluster `name` in host namespace
    /// `namespace` (its chart objects must be on the host: [`install_vcluster_chart`]), with
    /// `plugins` as its plugins folder, and returns once it has started its controllers
    /// ("Successfully started vCluster controllers" in its log) and its proxy serves.
    /// Blocks the calling thread meanwhile (typically 5–20 s; longer while another syncer holds
    /// the machine's `localhost:10099`).
    ///
    /// # Errors
    /// When the script fails (the syncer exited, or did not start within 180 s): its output and
    /// the end of vCluster's log are in the error.
    pub fn start(
        cp: &ControlPlane,
        namespace: &str,
        name: &str,
        plugins: &Path,
    ) -> anyhow::Result<Self> {
        Self::start_binary(cp, namespace, name, plugins, None)
    }

    /// [`VClusterSyncer::start`] with `binary` as vCluster's syncer (another version's, such as
    /// `VCLUSTER_SYNCER_V0_36` of [`oracle_paths`]); `None` is the pinned `VCLUSTER_SYNCER`.
    ///
    /// # Errors
    /// As [`VClusterSyncer::start`].
    pub fn start_binary(
        cp: &ControlPlane,
        namespace: &str,
        name: &str,
        plugins: &Path,
        binary: Option<&Path>,
    ) -> anyhow::Result<Self> {
        Self::start_with(cp, namespace, name, plugins, binary, &[])
    }

    /// [`VClusterSyncer::start_binary`] with `sets`, `KEY=VALUE` values given to vCluster's
    /// `start --set` after the harness's own overrides (vCluster's strvals syntax, as helm's
    /// `--set`), such as a legacy plugin listed under `plugin:`, for vCluster to wait for.
    ///
    /// # Errors
    /// As [`VClusterSyncer::start`].
    pub fn start_with(
        cp: &ControlPlane,
        namespace: &str,
        name: &str,
        plugins: &Path,
        binary: Option<&Path>,
        sets: &[String],
    ) -> anyhow::Result<Self> {
        let mut command = Command::new(repo_root().join("scripts/control-plane"));
        command
            .args(["syncer", "start", namespace, name, "--plugins"])
            .arg(plugins)
            .arg("--dir")
            .arg(cp.dir());
        for set in sets {
            command.arg("--set").arg(set);
        }
        if let Some(binary) = binary {
            command.env("VCLUSTER_SYNCER", binary);
        }
        let out = command
            .output()
            .context("run scripts/control-plane syncer start")?;
        if !out.status.success() {
            bail!(
                "scripts/control-plane syncer start {namespace} {name} failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let pid = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .context("the pid scripts/control-plane syncer start printed")?;
        Ok(Self {
            cp_dir: cp.dir().to_path_buf(),
            namespace: namespace.into(),
            name: name.into(),
            plugins: plugins.to_path_buf(),
            pid: Some(pid),
        })
    }

    /// Stops the syncer as a container runtime stops its pod (SIGTERM, SIGKILL after 10 s);
    /// the plugins it started exit with it. Stopping a stopped syncer does nothing.
    ///
    /// # Errors
    /// When the script fails.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if self.pid.take().is_none() {
            return Ok(());
        }
        let out = Command::new(repo_root().join("scripts/control-plane"))
            .args(["syncer", "stop", &self.namespace, &self.name, "--dir"])
            .arg(&self.cp_dir)
            .output()
            .context("run scripts/control-plane syncer stop")?;
        if !out.status.success() {
            bail!(
                "scripts/control-plane syncer stop failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Kills the syncer's own process alone: SIGKILL to its pid, not to its process group, as
    /// when vCluster's process dies without stopping the plugins it started (they keep running,
    /// re-parented, and must notice by themselves). Returns once the process has exited (a
    /// zombie counts as exited). The rest of its process group (its plugins) is stopped by
    /// [`VClusterSyncer::stop`], or on drop.
    ///
    /// # Errors
    /// When the syncer was stopped already, `kill` fails, or the process still runs after 10 s.
    pub fn kill_syncer_only(&self) -> anyhow::Result<()> {
        let pid = self.pid.context("the syncer is not running")?;
        let out = Command::new("kill")
            .args(["-KILL", "--", &pid.to_string()])
            .output()
            .context("run kill")?;
        if !out.status.success() {
            bail!("kill -KILL {pid}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let start = Instant::now();
        while process_runs(pid) {
            if start.elapsed() > Duration::from_secs(10) {
                bail!("vCluster's syncer {pid} still runs 10 s after SIGKILL");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The version vCluster's syncer reported at its last start in [`VClusterSyncer::log`]: its
    /// `vCluster version` line (`cmd/vcluster/cmd/start.go`: `vCluster version: v0.30.0` at
    /// v0.30, the field `"version": "v0.36.1"` at v0.36), the value of `pkg/telemetry`'s
    /// `SyncerVersion`, which the harness's build sets from the vCluster module it compiled
    /// (`tests/vcluster-go/cmd/vcluster-syncer`). `None` when the log has no such line.
    pub fn reported_version(&self) -> Option<String> {
        let log = self.log();
        let line = log.lines().rev().find(|l| l.contains("vCluster version"))?;
        if let Some((_, rest)) = line.split_once("\"version\": \"") {
            return rest.split('"').next().map(str::to_string);
        }
        let (_, rest) = line.split_once("vCluster version: ")?;
        rest.split_whitespace().next().map(str::to_string)
    }

    /// The syncer's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The plugins folder it was started with (vCluster's `/plugins`).
    pub fn plugins(&self) -> &Path {
        &self.plugins
    }

    /// Its state folder: `config.yaml` (the chart's rendering), `command` (the command line with
    /// every override), `kubeconfig` (the host, as the pod's service account), `vcluster.log`.
    pub fn state_dir(&self) -> PathBuf {
        state_dir(&self.cp_dir, &self.namespace, &self.name)
    }

    /// Everything vCluster's syncer (and the plugins it started, whose output it relays) has
    /// logged so far, across restarts of the same vCluster.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.state_dir().join("vcluster.log")).unwrap_or_default()
    }

    /// [`VClusterSyncer::log`] of vCluster `name` in `namespace`, readable while its
    /// [`VClusterSyncer::start`] still waits (vCluster waits for its legacy plugins to register
    /// before it starts its controllers).
    pub fn log_of(cp: &ControlPlane, namespace: &str, name: &str) -> String {
        std::fs::read_to_string(state_dir(cp.dir(), namespace, name).join("vcluster.log"))
            .unwrap_or_default()
    }

    /// The pids of the processes the syncer started that still run (its v2 plugins).
    pub fn children(&self) -> Vec<u32> {
        let Some(pid) = self.pid else {
            return Vec::new();
        };
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|child| {
                std::fs::read_to_string(format!("/proc/{child}/stat"))
                    .ok()
                    .and_then(|stat| {
                        let rest = stat.rsplit_once(") ")?.1.to_string();
                        let mut fields = rest.split_whitespace();
                        let state = fields.next()?;
                        let ppid: u32 = fields.next()?.parse().ok()?;
                        Some(ppid == pid && state != "Z")
                    })
                    .unwrap_or(false)
            })
            .collect()
    }

    /// Waits until the log holds `needle` `count` times or more, and returns the log.
    ///
    /// # Panics
    /// When it does not within `timeout`: the panic shows the log's end.
    pub async fn wait_log(&self, needle: &str, count: usize, timeout: Duration) -> String {
        let start = Instant::now();
        loop {
            let log = self.log();
            if log.matches(needle).count() >= count {
                return log;
            }
            if start.elapsed() > timeout {
                let tail: Vec<&str> = log.lines().rev().take(60).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                panic!(
                    "vCluster's log does not hold {needle:?} {count} time(s) after {timeout:?}; its end:\n{}",
                    tail.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Whether process `pid` runs: it exists and is not a zombie (state `Z` or `X` in
/// `/proc/<pid>/stat`; a zombie has exited).
pub fn process_runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some(state != 'Z' && state != 'X')
        })
        .unwrap_or(false)
}

/// The state folder of vCluster `name` in `namespace` (`scripts/control-plane syncer start`'s).
fn state_dir(cp_dir: &Path, namespace: &str, name: &str) -> PathBuf {
    cp_dir.join(format!("syncer-{namespace}-{name}"))
}

impl Drop for VClusterSyncer {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

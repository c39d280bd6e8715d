//! Argo CD itself, run as local processes for the `gitops_*` tests (the configuration and its
//! quirks are in docs/GITOPS.md): Debian's `redis-server`, a `git daemon` serving a repository
//! the test commits to, a static Helm repository (vCluster's chart packaged by `helm package`,
//! indexed by `helm repo index`, served by python3's `http.server`), and Argo CD's repo server
//! and application controller as `scripts/argocd build` builds them. Everything listens on
//! 127.0.0.1 on free ports.
//!
//! The destination is the cluster of `kubeconfig`: with `ARGOCD_FAKE_IN_CLUSTER=true` and
//! `KUBECONFIG`, Argo CD builds the client of `https://kubernetes.default.svc` from that
//! kubeconfig. The controller uses the same kubeconfig for its own objects (Applications,
//! `argocd-cm`) in namespace [`NAMESPACE`].
//!
//! Each process runs in a process group of its own, logs to `<dir>/<name>.log` and is stopped
//! (SIGTERM to its group, SIGKILL after 10 s) when the [`ArgoCd`] is dropped; a watchdog
//! (`bash`, its own session) does the same once the test binary has exited, however it ended,
//! as a `static` [`ArgoCd`] is never dropped.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};

use crate::control_plane::repo_root;

/// The namespace of Argo CD's own objects (Applications, AppProject `default`, `argocd-cm`).
pub const NAMESPACE: &str = "argocd";

/// The chart version the local Helm repository serves vCluster's chart as (`helm package
/// --version`; the module's own `Chart.yaml` says `0.0.1`, which vCluster's release pipeline
/// replaces the same way): the version `config/argocd/application.yaml` pins.
pub const CHART_VERSION: &str = "0.30.0";

/// The Git repository's name under the daemon's base path (`git://127.0.0.1:<port>/<name>`).
const GIT_REPOSITORY: &str = "platform.git";

/// What [`ArgoCd::start`] needs: paths printed by `scripts/argocd build` (`ARGOCD_*`),
/// `scripts/oracles build` (`HELM`, `VCLUSTER_CHART`) and `scripts/control-plane build`
/// (`KUBECTL`), as `NAME=path` values.
#[derive(Clone, Debug)]
pub struct ArgoCdTools {
    /// `argocd-application-controller` (`ARGOCD_APPLICATION_CONTROLLER`).
    pub controller: PathBuf,
    /// `argocd-repo-server` (`ARGOCD_REPO_SERVER`).
    pub repo_server: PathBuf,
    /// Argo CD's CRD folder as the module ships it (`ARGOCD_CRDS`).
    pub crds: PathBuf,
    /// A folder put first on the repo server's PATH (`ARGOCD_PATH`: `git-verify-wrapper.sh`).
    pub path: PathBuf,
    /// helm v3 (`HELM`): the repo server runs it to render charts, and it packages the chart.
    pub helm: PathBuf,
    /// vCluster's chart folder (`VCLUSTER_CHART`).
    pub chart: PathBuf,
    /// kubectl (`KUBECTL`).
    pub kubectl: PathBuf,
}

impl ArgoCdTools {
    /// The tools from merged `NAME=path` values.
    ///
    /// # Errors
    /// When a name is missing (the error names it and the script that prints it).
    pub fn from_values(values: &BTreeMap<String, String>) -> anyhow::Result<ArgoCdTools> {
        let get = |name: &str, script: &str| {
            values
                .get(name)
                .map(PathBuf::from)
                .with_context(|| format!("no {name}: `scripts/{script} build` prints it"))
        };
        Ok(ArgoCdTools {
            controller: get("ARGOCD_APPLICATION_CONTROLLER", "argocd")?,
            repo_server: get("ARGOCD_REPO_SERVER", "argocd")?,
            crds: get("ARGOCD_CRDS", "argocd")?,
            path: get("ARGOCD_PATH", "argocd")?,
            helm: get("HELM", "oracles")?,
            chart: get("VCLUSTER_CHART", "oracles")?,
            kubectl: get("KUBECTL", "control-plane")?,
        })
    }
}

/// Argo CD's application controller and repo server with their Redis, Git remote and Helm
/// repository, running (see the module's documentation); stopped on drop.
#[derive(Debug)]
pub struct ArgoCd {
    dir: PathBuf,
    kubeconfig: PathBuf,
    tools: ArgoCdTools,
    children: Vec<(String, Child)>,
    git_url: String,
    helm_url: String,
    controller_metrics: u16,
}

/// A free TCP port on 127.0.0.1 (bound, then released).
fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Runs `cmd` to completion; its stdout, or an error with its output.
fn run(mut cmd: Command) -> anyhow::Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `GET http://127.0.0.1:<port><path>` answers 200.
fn http_ok(port: u16, path: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.ends_with(b"200")
}

impl ArgoCd {
    /// Starts everything under `dir` (created; logs `<dir>/<name>.log`) against the cluster
    /// of `kubeconfig`, applies Argo CD's CRDs (server-side) and its settings in [`NAMESPACE`]:
    /// `argocd_cm` (a ConfigMap manifest named `argocd-cm` labelled
    /// `app.kubernetes.io/part-of: argocd`, such as `config/argocd/argocd-cm.yaml`) and the
    /// AppProject `default` (every source, destination and cluster-scoped kind). Both
    /// components poll every 5 s (`ARGOCD_RECONCILIATION_TIMEOUT=5s`, no jitter); the
    /// controller keeps each resource's health in `status.resources`
    /// (`--persist-resource-health`). Returns once
    /// the repo server answers `/healthz` and the controller `/metrics`; `watch_pid` is the
    /// process whose exit stops everything (the test binary).
    ///
    /// # Errors
    /// When a tool fails or a process does not come up (its log's tail is in the error).
    pub fn start(
        dir: &Path,
        kubeconfig: &Path,
        tools: ArgoCdTools,
        argocd_cm: &str,
        watch_pid: u32,
    ) -> anyhow::Result<ArgoCd> {
        let _ = std::fs::remove_dir_all(dir);
        for sub in ["git", "tmp", "helm-repo", "helm-home"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let mut argocd = ArgoCd {
            dir: dir.to_path_buf(),
            kubeconfig: kubeconfig.to_path_buf(),
            tools,
            children: Vec::new(),
            git_url: String::new(),
            helm_url: String::new(),
            controller_metrics: 0,
        };
        argocd.watchdog(watch_pid)?;

        // Redis: Argo CD's cache, no persistence.
        let redis = free_port()?;
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port", &redis.to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir);
        argocd.spawn("redis", cmd)?;
        argocd.wait_alive("redis", Duration::from_secs(10), || {
            let Ok(mut s) = TcpStream::connect(("127.0.0.1", redis)) else {
                return false;
            };
            let mut pong = [0u8; 5];
            s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut pong).is_ok() && &pong == b"+PONG"
        })?;

        // The Git remote: a bare repository with one empty commit on main, served read-only.
        let bare = dir.join("git").join(GIT_REPOSITORY);
        let work = argocd.work_tree();
        run(git(None, &["init", "-q", "--bare", "-b", "main"]).arg_path(&bare))?;
        run(git(None, &["clone", "-q"]).arg_path(&bare).arg_path(&work))?;
        run(git(
            Some(&work),
            &["symbolic-ref", "HEAD", "refs/heads/main"],
        ))?;
        run(git(
            Some(&work),
            &["commit", "-q", "--allow-empty", "-m", "empty"],
        ))?;
        run(git(Some(&work), &["push", "-q", "origin", "main"]))?;
        let git_port = free_port()?;
        let mut cmd = Command::new("git");
        cmd.args([
            "daemon",
            "--reuseaddr",
            "--listen=127.0.0.1",
            "--export-all",
        ])
        .arg(format!("--port={git_port}"))
        .arg(format!("--base-path={}", dir.join("git").display()))
        .arg(dir.join("git"));
        argocd.spawn("git-daemon", cmd)?;
        argocd.git_url = format!("git://127.0.0.1:{git_port}/{GIT_REPOSITORY}");
        let url = argocd.git_url.clone();
        argocd.wait_alive("git-daemon", Duration::from_secs(10), || {
            run(git(None, &["ls-remote", &url, "main"])).is_ok()
        })?;

        // The Helm repository: vCluster's chart as version CHART_VERSION, indexed, served.
        let helm_port = free_port()?;
        argocd.helm_url = format!("http://127.0.0.1:{helm_port}");
        let repo = dir.join("helm-repo");
        let mut cmd = argocd.helm();
        cmd.arg("package")
            .arg(&argocd.tools.chart)
            .args([
                "--version",
                CHART_VERSION,
                "--app-version",
                CHART_VERSION,
                "-d",
            ])
            .arg(&repo);
        run(cmd)?;
        let mut cmd = argocd.helm();
        cmd.args(["repo", "index"])
            .arg(&repo)
            .args(["--url", &argocd.helm_url]);
        run(cmd)?;
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "http.server", &helm_port.to_string()])
            .args(["--bind", "127.0.0.1", "--directory"])
            .arg(&repo);
        argocd.spawn("helm-repo", cmd)?;
        argocd.wait_alive("helm-repo", Duration::from_secs(20), || {
            http_ok(helm_port, "/index.yaml")
        })?;

        // Argo CD's CRDs (server-side: the Application CRD is too large for the client-side
        // annotation), its namespace, argocd-cm and the AppProject `default`.
        let crds = &argocd.tools.crds;
        argocd.kubectl(
            &[
                "apply",
                "--server-side",
                "-f",
                &crds.join("application-crd.yaml").to_string_lossy(),
                "-f",
                &crds.join("appproject-crd.yaml").to_string_lossy(),
            ],
            None,
        )?;
        // (polled: `kubectl wait` fails on a CRD whose status has no conditions yet)
        for crd in ["applications.argoproj.io", "appprojects.argoproj.io"] {
            let deadline = Instant::now() + Duration::from_secs(60);
            while argocd
                .kubectl(
                    &[
                        "get",
                        "crd",
                        crd,
                        "-o",
                        r#"jsonpath={.status.conditions[?(@.type=="Established")].status}"#,
                    ],
                    None,
                )
                .unwrap_or_default()
                != "True"
            {
                ensure!(
                    Instant::now() < deadline,
                    "CRD {crd} not Established in 60 s"
                );
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        argocd.kubectl(
            &["apply", "-f", "-"],
            Some(&format!(
                "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}\n"
            )),
        )?;
        argocd.kubectl(&["-n", NAMESPACE, "apply", "-f", "-"], Some(argocd_cm))?;
        argocd.kubectl(
            &["apply", "-f", "-"],
            Some(&format!(
                "apiVersion: argoproj.io/v1alpha1\nkind: AppProject\nmetadata: {{name: default, \
                 namespace: {NAMESPACE}}}\nspec:\n  sourceRepos: ['*']\n  destinations:\n  - \
                 {{server: '*', namespace: '*'}}\n  clusterResourceWhitelist:\n  - {{group: '*', \
                 kind: '*'}}\n"
            )),
        )?;

        // The repo server: plain gRPC on loopback (docs/GITOPS.md: --client-ca-path emptied
        // for --disable-tls), its checkouts under <dir>/tmp, helm and git on its PATH.
        let (repo_port, repo_metrics) = (free_port()?, free_port()?);
        let mut cmd = argocd.argocd_command(&argocd.tools.repo_server.clone(), redis);
        cmd.args(["--address", "127.0.0.1", "--port", &repo_port.to_string()])
            .args(["--metrics-address", "127.0.0.1"])
            .args(["--metrics-port", &repo_metrics.to_string()])
            .args(["--disable-tls", "--client-ca-path", ""]);
        argocd.spawn("repo-server", cmd)?;
        argocd.wait_alive("repo-server", Duration::from_secs(60), || {
            http_ok(repo_metrics, "/healthz?full=true")
        })?;

        // The application controller, the destination `https://kubernetes.default.svc` being
        // the kubeconfig's cluster (ARGOCD_FAKE_IN_CLUSTER).
        argocd.controller_metrics = free_port()?;
        let mut cmd = argocd.argocd_command(&argocd.tools.controller.clone(), redis);
        cmd.env("ARGOCD_FAKE_IN_CLUSTER", "true")
            .env("KUBECONFIG", kubeconfig)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--namespace", NAMESPACE])
            .args(["--repo-server", &format!("127.0.0.1:{repo_port}")])
            .arg("--repo-server-plaintext")
            .args(["--metrics-port", &argocd.controller_metrics.to_string()])
            .args(["--status-processors", "2", "--operation-processors", "2"])
            // Each resource's health in the Application's `status.resources` (the default
            // before Argo CD 3.0; since, only in Redis's resource tree, which argocd-server
            // serves), so that a test reads Argo CD's health of one resource from the API.
            .arg("--persist-resource-health");
        argocd.spawn("application-controller", cmd)?;
        let metrics = argocd.controller_metrics;
        argocd.wait_alive("application-controller", Duration::from_secs(60), || {
            http_ok(metrics, "/metrics")
        })?;
        Ok(argocd)
    }

    /// The Git remote's URL (`git://127.0.0.1:<port>/platform.git`, branch `main`).
    pub fn git_url(&self) -> &str {
        &self.git_url
    }

    /// The Helm repository's URL (`http://127.0.0.1:<port>`), serving chart `vcluster` at
    /// [`CHART_VERSION`].
    pub fn helm_url(&self) -> &str {
        &self.helm_url
    }

    /// The chart archive the Helm repository serves (`vcluster-<CHART_VERSION>.tgz`, made by
    /// `helm package`): what Argo CD renders, for a test to render the same.
    pub fn chart_archive(&self) -> PathBuf {
        self.dir
            .join("helm-repo")
            .join(format!("vcluster-{CHART_VERSION}.tgz"))
    }

    /// The folder of the logs (`<name>.log`) and state.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `files` (paths relative to the repository's root, and their content) into the
    /// work tree, commits them and pushes to `main`; returns the commit's SHA.
    ///
    /// # Errors
    /// When git fails.
    pub fn commit(&self, files: &[(&str, &str)], message: &str) -> anyhow::Result<String> {
        let work = self.work_tree();
        for (path, content) in files {
            let file = work.join(path);
            std::fs::create_dir_all(file.parent().expect("a file in a folder"))?;
            std::fs::write(&file, content)?;
        }
        run(git(Some(&work), &["add", "-A"]))?;
        run(git(Some(&work), &["commit", "-q", "-m", message]))?;
        run(git(Some(&work), &["push", "-q", "origin", "main"]))?;
        Ok(run(git(Some(&work), &["rev-parse", "HEAD"]))?
            .trim()
            .to_string())
    }

    /// Removes `paths` (relative to the repository's root) from the work tree, commits that and
    /// pushes to `main`; returns the commit's SHA.
    ///
    /// # Errors
    /// When git fails (a path not in the repository included).
    pub fn remove(&self, paths: &[&str], message: &str) -> anyhow::Result<String> {
        let work = self.work_tree();
        for path in paths {
            run(git(Some(&work), &["rm", "-q", path]))?;
        }
        run(git(Some(&work), &["commit", "-q", "-m", message]))?;
        run(git(Some(&work), &["push", "-q", "origin", "main"]))?;
        Ok(run(git(Some(&work), &["rev-parse", "HEAD"]))?
            .trim()
            .to_string())
    }

    /// The last `lines` lines of process `name`'s log (`repo-server`,
    /// `application-controller`, `redis`, `git-daemon`, `helm-repo`), for failure messages.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join(format!("{name}.log")))
            .unwrap_or_else(|e| format!("(no log: {e})"));
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The lines of process `name`'s log containing every one of `needles`.
    pub fn log_lines(&self, name: &str, needles: &[&str]) -> Vec<String> {
        std::fs::read_to_string(self.dir.join(format!("{name}.log")))
            .unwrap_or_default()
            .lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .map(str::to_string)
            .collect()
    }

    /// Application `name` in [`NAMESPACE`] as the API server has it (`kubectl get -o json`).
    ///
    /// # Errors
    /// When kubectl fails (no such Application included) or its output is not JSON.
    pub fn application(&self, name: &str) -> anyhow::Result<serde_json::Value> {
        let text = self.kubectl(
            &["-n", NAMESPACE, "get", "application", name, "-o", "json"],
            None,
        )?;
        serde_json::from_str(&text).with_context(|| format!("Application {name}: {text}"))
    }

    /// kubectl with the kubeconfig Argo CD is given, `stdin` piped in; its stdout.
    ///
    /// # Errors
    /// When kubectl fails (its output is in the error).
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        let mut child = Command::new(&self.tools.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("run kubectl")?;
        let mut input = child.stdin.take().expect("piped");
        input.write_all(stdin.unwrap_or_default().as_bytes())?;
        drop(input);
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed ({}):\n{}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn work_tree(&self) -> PathBuf {
        self.dir.join("work")
    }

    /// helm with its homes under `<dir>/helm-home`.
    fn helm(&self) -> Command {
        let home = self.dir.join("helm-home");
        let mut cmd = Command::new(&self.tools.helm);
        cmd.env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"));
        cmd
    }

    /// An Argo CD component with the environment both need (docs/GITOPS.md): the module's
    /// wrappers and helm first on PATH, 5 s polling without jitter, no GnuPG, checkouts and
    /// the ask-pass socket under `<dir>/tmp`, text logs.
    fn argocd_command(&self, binary: &Path, redis: u16) -> Command {
        let helm_dir = self.tools.helm.parent().expect("helm in a folder");
        let path = format!(
            "{}:{}:{}",
            self.tools.path.display(),
            helm_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let tmp = self.dir.join("tmp");
        let home = self.dir.join("helm-home");
        let mut cmd = Command::new(binary);
        cmd.env("PATH", path)
            .env("ARGOCD_RECONCILIATION_TIMEOUT", "5s")
            .env("ARGOCD_RECONCILIATION_JITTER", "0")
            .env("ARGOCD_GPG_ENABLED", "false")
            .env("TMPDIR", &tmp)
            .env("ARGOCD_ASK_PASS_SOCK", tmp.join("ask-pass.sock"))
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .args(["--redis", &format!("127.0.0.1:{redis}")])
            .args(["--logformat", "text"]);
        cmd
    }

    /// Starts `cmd` as process `name` in a process group of its own, output to
    /// `<dir>/<name>.log`, its pid appended to `<dir>/pids` (the watchdog's list).
    fn spawn(&mut self, name: &str, mut cmd: Command) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("start {name}: {cmd:?}"))?;
        let mut pids = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("pids"))?;
        writeln!(pids, "{}", child.id())?;
        self.children.push((name.to_string(), child));
        Ok(())
    }

    /// Waits for `ready`, failing early with the log's tail when process `name` exits.
    fn wait_alive(
        &mut self,
        name: &str,
        timeout: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if ready() {
                return Ok(());
            }
            let child = &mut self
                .children
                .iter_mut()
                .find(|(n, _)| n == name)
                .expect("spawned")
                .1;
            if let Some(status) = child.try_wait()? {
                bail!("{name} exited ({status}):\n{}", self.log_tail(name, 30));
            }
            if Instant::now() > deadline {
                bail!(
                    "{name} not ready within {timeout:?}:\n{}",
                    self.log_tail(name, 30)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The watchdog: once `watch_pid` has exited, SIGTERM to every process group listed in
    /// `<dir>/pids`, SIGKILL after 10 s.
    fn watchdog(&mut self, watch_pid: u32) -> anyhow::Result<()> {
        let script = r#"while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
pids=$(cat "$2" 2>/dev/null)
for p in $pids; do kill -TERM -- "-$p" 2>/dev/null; done
for _ in $(seq 1 20); do
  alive=0; for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive = 0 ] && exit 0; sleep 0.5
done
for p in $pids; do kill -KILL -- "-$p" 2>/dev/null; done"#;
        let log = std::fs::File::create(self.dir.join("watchdog.log"))?;
        let child = Command::new("bash")
            .args(["-c", script, "watchdog", &watch_pid.to_string()])
            .arg(self.dir.join("pids"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("start the watchdog")?;
        // Not in `children`: dropping the ArgoCd stops the others; the watchdog then exits
        // with the binary.
        drop(child);
        Ok(())
    }
}

impl Drop for ArgoCd {
    fn drop(&mut self) {
        for (_, child) in &self.children {
            let _ = Command::new("kill")
                .args(["-TERM", "--", &format!("-{}", child.id())])
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for (_, child) in &mut self.children {
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if child.try_wait().ok().flatten().is_none() {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.wait();
            }
        }
    }
}

/// `git [-C work] ARGS`, with a fixed author and no user or system configuration.
fn git(work: Option<&Path>, args: &[&str]) -> Command {
    let mut cmd = Command::new("git");
    if let Some(work) = work {
        cmd.arg("-C").arg(work);
    }
    cmd.args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "vcp-tests")
        .env("GIT_AUTHOR_EMAIL", "vcp-tests@localhost")
        .env("GIT_COMMITTER_NAME", "vcp-tests")
        .env("GIT_COMMITTER_EMAIL", "vcp-tests@localhost");
    cmd
}

/// `Command::arg` taking a path, chained (for readability of the git calls).
trait ArgPath {
    fn arg_path(self, path: &Path) -> Command;
}

impl ArgPath for Command {
    fn arg_path(mut self, path: &Path) -> Command {
        self.arg(path);
        self
    }
}

/// The repository's `config/argocd/argocd-cm.yaml` as shipped (its health check for
/// `vcp.dev/VClusterPlugin`; labelled `app.kubernetes.io/part-of: argocd`, which is all the
/// controller needs of `argocd-cm` besides).
///
/// # Errors
/// When the file cannot be read.
pub fn shipped_argocd_cm() -> anyhow::Result<String> {
    let path = repo_root().join("config/argocd/argocd-cm.yaml");
    std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))
}

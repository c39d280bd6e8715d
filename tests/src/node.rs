//! A real one-node cluster for the `cluster` tests: `scripts/node` (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, kubelet, kube-proxy and containerd in a network
//! namespace of their own), where pods actually run.
//!
//! [`Node::shared`] starts the node of a test binary on first use, with `scripts/node up --dir
//! <tmp>/vcp-node-<pid> --watch-pid <pid>`: the watchdog runs `scripts/node down` once the
//! binary has exited, however it ended. Only one node runs per machine (containerd 1.6 and the
//! kubelet hard-code host paths), so `start` first waits, up to 600 s, for the node of an
//! earlier test binary to go.
//!
//! Nothing is pulled: images are built locally and imported into the node's containerd
//! ([`Node::import`]); the product's own image is [`operator_image`].

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use kube::Client;

use crate::control_plane::{config_from, repo_root};
use crate::image::Image;

/// The network namespace `scripts/node` creates (its default `VCP_NODE_NETNS`).
pub const NETNS: &str = "vcp-node";

/// Name prefix of the state folders of [`Node::start`]: `<tmp>/vcp-node-<pid>`.
const STATE_DIR_PREFIX: &str = "vcp-node-";

/// A running node of `scripts/node`, with its state folder (logs `<dir>/<process>.log`, PKI,
/// containerd's root).
#[derive(Debug)]
pub struct Node {
    dir: PathBuf,
    /// Whether this value started the node (and so stops it on drop).
    owned: bool,
}

impl Node {
    /// Starts a node with `scripts/node up` in `<tmp>/vcp-node-<pid>` (building the Kubernetes
    /// binaries first when they are not cached), after the node of an earlier test binary, if
    /// any, has gone. Returns once the node is `Ready` (typically 5–10 s).
    ///
    /// # Errors
    /// When the network namespace stays taken for 600 s, or the script fails (its output, with
    /// the tail of the failing process's log, is in the error).
    pub fn start() -> anyhow::Result<Node> {
        let deadline = Instant::now() + Duration::from_secs(600);
        while Path::new("/run/netns").join(NETNS).exists() {
            if reap_stale_node(&std::env::temp_dir())? {
                continue;
            }
            ensure!(
                Instant::now() < deadline,
                "network namespace {NETNS} still exists after 600 s: another node runs on this \
                 machine (stop it with `scripts/node down --dir <its folder>`)"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        remove_stale_state_dirs(&std::env::temp_dir());
        let dir = std::env::temp_dir().join(format!("{STATE_DIR_PREFIX}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let pid = std::process::id().to_string();
        node_script(&["up", "--watch-pid", &pid], &dir)?;
        Ok(Node { dir, owned: true })
    }

    /// The node `scripts/node up --dir <dir>` started earlier (for a tool run beside it, such
    /// as the demo's image build); dropping it leaves the node running.
    ///
    /// # Errors
    /// When `<dir>` holds no running node (no `env` file).
    pub fn attach(dir: &Path) -> anyhow::Result<Node> {
        ensure!(
            dir.join("env").exists(),
            "no node in {}: run scripts/node up --dir {}",
            dir.display(),
            dir.display()
        );
        Ok(Node {
            dir: dir.to_path_buf(),
            owned: false,
        })
    }

    /// The node of this test binary, started on first use; it stops when the binary exits.
    ///
    /// # Panics
    /// When it cannot be started (the error says why).
    pub fn shared() -> &'static Node {
        static SHARED: OnceLock<Node> = OnceLock::new();
        SHARED.get_or_init(|| Node::start().expect("start the real node (scripts/node up)"))
    }

    /// The node's state folder (`D` of `scripts/node`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The admin kubeconfig (client certificate of `system:masters`), whose server,
    /// `https://10.200.0.10:6443`, the host reaches through the node's veth pair.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("pki/admin.kubeconfig")
    }

    /// A client of the node's API server as its admin.
    ///
    /// # Errors
    /// When the kubeconfig cannot be read.
    pub async fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::try_from(config_from(&self.kubeconfig()).await?)?)
    }

    /// Runs `kubectl ARGS` as the node's admin (`scripts/node kubectl`, inside the network
    /// namespace, so Service ClusterIPs answer too) from the repository root, `stdin` piped in.
    pub fn kubectl_output(&self, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write as _;
        let mut cmd = Command::new(repo_root().join("scripts/node"));
        cmd.arg("kubectl")
            .args(args)
            .env("VCP_NODE_DIR", &self.dir)
            .current_dir(repo_root())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run scripts/node kubectl");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .expect("piped")
                .write_all(input.as_bytes())
                .expect("write kubectl stdin");
        }
        child.wait_with_output().expect("wait for kubectl")
    }

    /// Runs `kubectl ARGS` as the node's admin and returns its stdout.
    ///
    /// # Errors
    /// When kubectl exits non-zero: the command, its status, stdout and stderr.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.kubectl_output(args, None);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "kubectl {} failed ({}):\n{stdout}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(stdout)
    }

    /// For failure messages about a pod that did not start: each node's taints and conditions
    /// (`DiskPressure=True` with a `node.kubernetes.io/disk-pressure` taint when the disk holding
    /// the node's folder is within `scripts/node`'s `evictionHard` threshold, 2 % of that
    /// filesystem), and that filesystem's free space (`df -h`).
    pub fn health_summary(&self) -> String {
        let nodes = self
            .kubectl(&[
                "get",
                "nodes",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}: taints {.spec.taints}; conditions \
                 {range .status.conditions[*]}{.type}={.status} {end}{\"\\n\"}{end}",
            ])
            .unwrap_or_else(|e| e.to_string());
        let df = Command::new("df")
            .arg("-h")
            .arg(&self.dir)
            .output()
            .map_or_else(
                |e| e.to_string(),
                |o| String::from_utf8_lossy(&o.stdout).into_owned(),
            );
        format!("node: {nodes}disk: {df}")
    }

    /// Imports a docker archive into the node's containerd (namespace `k8s.io`, where the
    /// kubelet finds images), as `ctr images import` does.
    ///
    /// # Errors
    /// When `ctr` fails (its output is in the error).
    pub fn import(&self, archive: &Path) -> anyhow::Result<()> {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(self.containerd_socket())
            .args(["-n", "k8s.io", "images", "import"])
            .arg(archive)
            .output()
            .context("run ctr images import")?;
        ensure!(
            out.status.success(),
            "ctr images import {} failed ({}): {}",
            archive.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// The image references the node's containerd holds (namespace `k8s.io`).
    ///
    /// # Errors
    /// When `ctr` fails.
    pub fn images(&self) -> anyhow::Result<Vec<String>> {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(self.containerd_socket())
            .args(["-n", "k8s.io", "images", "ls", "-q"])
            .output()
            .context("run ctr images ls")?;
        ensure!(
            out.status.success(),
            "ctr images ls failed ({})",
            out.status
        );
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// The socket of the node's containerd.
    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("run/containerd/containerd.sock")
    }

    /// The buildah command of the node's image storage (`<dir>/run/buildah`, the storage
    /// `scripts/node up` builds its pause and busybox images in; removed by `down`).
    pub fn buildah(&self) -> Command {
        let root = self.dir.join("run/buildah");
        let mut cmd = Command::new("buildah");
        cmd.arg("--root")
            .arg(root.join("root"))
            .arg("--runroot")
            .arg(root.join("runroot"))
            .args(["--storage-driver", "overlay"]);
        cmd
    }

    /// Runs a buildah command of the node's storage ([`Node::buildah`]) and returns its
    /// trimmed stdout.
    ///
    /// # Errors
    /// When buildah exits non-zero (its stderr is in the error).
    pub fn run_buildah(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.buildah().args(args).output().context("run buildah")?;
        ensure!(
            out.status.success(),
            "buildah {} failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Imports image `reference` of the node's buildah storage into its containerd: `buildah
    /// push` to a docker archive `<dir>/<file_name>`, then [`Node::import`].
    ///
    /// # Errors
    /// When buildah or `ctr` fails.
    pub fn import_built(&self, reference: &str, file_name: &str) -> anyhow::Result<()> {
        let archive = self.dir.join(file_name);
        let _ = std::fs::remove_file(&archive);
        self.run_buildah(&[
            "push",
            "-q",
            reference,
            &format!("docker-archive:{}:{reference}", archive.display()),
        ])?;
        self.import(&archive)
    }

    /// Builds image `reference` in the node's buildah storage, `base` (already in that storage:
    /// never pulled) plus the executable `binary` at `path` (mode 0755), with `entrypoint` (a
    /// JSON array, such as `["/plugin"]`) when given, and imports it ([`Node::import_built`]).
    ///
    /// # Errors
    /// When buildah or `ctr` fails.
    pub fn build_binary_image(
        &self,
        base: &str,
        binary: &str,
        path: &str,
        entrypoint: Option<&str>,
        reference: &str,
    ) -> anyhow::Result<()> {
        let container = self.run_buildah(&["from", "--pull=never", base])?;
        self.run_buildah(&["copy", "--chmod", "0755", &container, binary, path])?;
        if let Some(entrypoint) = entrypoint {
            self.run_buildah(&["config", "--entrypoint", entrypoint, &container])?;
        }
        self.run_buildah(&["commit", "-q", &container, reference])?;
        self.run_buildah(&["rm", &container])?;
        let file = reference.rsplit('/').next().unwrap_or(reference);
        self.import_built(reference, &format!("{}.docker.tar", file.replace(':', "-")))
    }

    /// The tail (last `lines` lines) of one of the node's process logs (`kubelet`,
    /// `kube-apiserver`, `containerd`, ...), for failure messages.
    pub fn log_tail(&self, process: &str, lines: usize) -> String {
        let text =
            std::fs::read_to_string(self.dir.join(format!("{process}.log"))).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.owned {
            let _ = node_script(&["down"], &self.dir);
        }
    }
}

/// Removes the state folders `<tmp>/vcp-node-<pid>` that earlier test binaries left (100–200 MB
/// each: logs, PKI, containerd's root; the watchdog's `scripts/node down` stops their node but
/// keeps the folder, so a failure's logs can be read after the run). A folder is removed only
/// when its process `<pid>` is gone and nothing is mounted under it (`/proc/mounts`): a running
/// node's folder, or one whose `down` did not finish, is left alone. Called once no node runs
/// on the machine, so at most the last run's folder stays between runs.
fn remove_stale_state_dirs(tmp: &Path) {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(STATE_DIR_PREFIX) else {
            continue;
        };
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let path = entry.path();
        let prefix = format!("{}/", path.display());
        let mounted = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .any(|m| m.starts_with(&prefix) || m == path.to_string_lossy());
        if !mounted && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// The node processes `scripts/node` records in a state folder's `pids` whose liveness tells a
/// running node from one whose processes are gone (the name is the process's `comm`).
const NODE_PROCESSES: [&str; 4] = ["containerd", "etcd", "kube-apiserver", "kubelet"];

/// Whether the node of state folder `dir` still runs: a process its `pids` file records under
/// one of [`NODE_PROCESSES`] exists under that name and is no zombie.
fn node_runs(dir: &Path) -> bool {
    let pids = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
    pids.lines().any(|line| {
        let mut words = line.split_whitespace();
        let (Some(pid), Some(name)) = (words.next(), words.next()) else {
            return false;
        };
        let proc_dir = Path::new("/proc").join(pid);
        let comm = std::fs::read_to_string(proc_dir.join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z'));
        NODE_PROCESSES.contains(&name) && comm.trim() == name && !zombie
    })
}

/// Takes down what a node whose processes are all gone left behind: a machine's session that
/// ended with its node running (its processes killed, not stopped) leaves the network namespace
/// [`NETNS`], its mounts and its state folder, and every later node would wait for that
/// namespace for ever. Runs `scripts/node down` for each state folder under `tmp` with a `pids`
/// file and no running node ([`node_runs`]); then, when no folder has a running node and the
/// namespace is still there, deletes it. Returns whether it took anything down; `false` when a
/// node runs (another test binary's: wait for it).
///
/// # Errors
/// When `scripts/node down` or `ip netns del` fails.
fn reap_stale_node(tmp: &Path) -> anyhow::Result<bool> {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return Ok(false);
    };
    let dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(STATE_DIR_PREFIX))
                && p.join("pids").exists()
        })
        .collect();
    if dirs.iter().any(|d| node_runs(d)) {
        return Ok(false);
    }
    for dir in &dirs {
        eprintln!("node: taking down the stale node of {}", dir.display());
        node_script(&["down"], dir)?;
        let _ = std::fs::remove_dir_all(dir);
    }
    if Path::new("/run/netns").join(NETNS).exists() {
        eprintln!("node: deleting the stale network namespace {NETNS}");
        let out = Command::new("ip").args(["netns", "del", NETNS]).output()?;
        ensure!(out.status.success(), "ip netns del {NETNS}: {out:?}");
    }
    Ok(true)
}

/// Runs `scripts/node <args...> --dir <dir>` and waits for it.
///
/// # Errors
/// When the script cannot be started or exits non-zero: `scripts/node <args> failed (<exit
/// status>)` followed by its stdout and stderr.
fn node_script(args: &[&str], dir: &Path) -> anyhow::Result<()> {
    let what = format!("scripts/node {}", args.join(" "));
    let out = Command::new(repo_root().join("scripts/node"))
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null())
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

/// The reference of the product's image, as `config/manager/manager.yaml` names it (the
/// operator's Deployment, whose sidecar image defaults to the same reference).
///
/// # Errors
/// When the manifest names no `image:`.
pub fn operator_image_reference() -> anyhow::Result<String> {
    let text = std::fs::read_to_string(repo_root().join("config/manager/manager.yaml"))
        .context("read config/manager/manager.yaml")?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("image: "))
        .map(|s| s.trim().to_string())
        .context("config/manager/manager.yaml names no image")
}

/// The base of the Dockerfile's final stage (`gcr.io/distroless/cc-debian12:nonroot`), stood
/// in for from this machine's Debian 12 packages, since no registry is reachable: the files of
/// `libc6` and `libgcc-s1` under `/lib*` and `/usr/lib*` (distroless's `cc` image is its
/// `base` plus libgcc), the CA bundle of `ca-certificates`, `/etc/passwd` and `/etc/group`
/// with `root` (0), `nobody` (65534) and `nonroot` (65532, home `/home/nonroot`), `/tmp`
/// (1777); user `65532`, working folder `/home/nonroot`, `PATH` and `SSL_CERT_FILE` as in
/// distroless. Tagged with the real name, so the Dockerfile's `FROM` finds it locally.
///
/// # Errors
/// When `dpkg-query` or buildah fails.
fn build_distroless_stand_in(node: &Node, reference: &str, work: &Path) -> anyhow::Result<()> {
    let root = work.join("distroless-root");
    let _ = std::fs::remove_dir_all(&root);
    for d in ["etc/ssl/certs", "home/nonroot", "tmp", "root"] {
        std::fs::create_dir_all(root.join(d))?;
    }
    for package in ["libc6", "libgcc-s1"] {
        let out = Command::new("dpkg-query")
            .args(["-L", package])
            .output()
            .context("run dpkg-query")?;
        ensure!(out.status.success(), "dpkg-query -L {package} failed");
        for path in String::from_utf8_lossy(&out.stdout).lines() {
            let keep = ["/lib", "/lib64", "/usr/lib"]
                .iter()
                .any(|p| path.starts_with(&format!("{p}/")));
            let source = Path::new(path);
            let Ok(meta) = std::fs::symlink_metadata(source) else {
                continue;
            };
            if !keep || meta.is_dir() || path.starts_with("/usr/lib/locale") {
                continue;
            }
            let dest = root.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(dest.parent().expect("a file has a parent"))?;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(source)?;
                let _ = std::fs::remove_file(&dest);
                std::os::unix::fs::symlink(target, &dest)?;
            } else {
                std::fs::copy(source, &dest)?;
            }
        }
    }
    std::fs::copy(
        "/etc/ssl/certs/ca-certificates.crt",
        root.join("etc/ssl/certs/ca-certificates.crt"),
    )
    .context("copy the CA bundle (Debian's ca-certificates)")?;
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\n\
         nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n\
         nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )?;
    std::fs::write(
        root.join("etc/group"),
        "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n",
    )?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    std::os::unix::fs::chown(root.join("home/nonroot"), Some(65532), Some(65532))?;
    std::fs::set_permissions(
        root.join("home/nonroot"),
        std::fs::Permissions::from_mode(0o700),
    )?;
    let container = node.run_buildah(&["from", "scratch"])?;
    node.run_buildah(&["copy", &container, &root.to_string_lossy(), "/"])?;
    node.run_buildah(&[
        "config",
        "--user",
        "65532",
        "--workingdir",
        "/home/nonroot",
        "--env",
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--env",
        "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
        &container,
    ])?;
    node.run_buildah(&["commit", "-q", &container, reference])?;
    node.run_buildah(&["rm", &container])?;
    Ok(())
}

/// The product's image, built by buildah and imported into `node`'s containerd under the
/// reference of `config/manager/manager.yaml`; returns that reference. Once per node.
///
/// How: the repository's `Dockerfile` is built by buildah with its **final stage verbatim**
/// (from its `FROM gcr.io/distroless/...` line to the end: labels, both `COPY --from=builder`,
/// `USER 65532:65532`, `EXPOSE`, `ENTRYPOINT`). Two things are stood in for, as no registry
/// is reachable:
/// - the final stage's base, by [`build_distroless_stand_in`];
/// - the build stage (`FROM rust:...-slim-bookworm AS builder`), by a `FROM scratch` image
///   holding exactly what that stage leaves in `/out`: the two release binaries of the
///   Dockerfile's own `RUN`, as [`Image::build`] replays it (the same context, `COPY` steps,
///   `ENV` and `cargo build --release --locked` line, in a chroot of the Rust toolchain that
///   image pins; `tests/tests/packaging_dockerfile.rs` checks that replay). The final stage
///   takes nothing else from the build stage, so the image is the one `docker build` makes,
///   but for the base's files.
///
/// # Errors
/// When the replay, buildah, or the import fails.
pub fn operator_image(node: &Node) -> anyhow::Result<String> {
    let reference = operator_image_reference()?;
    let work = node.dir().join("operator-image");
    std::fs::create_dir_all(&work)?;
    let replay = Image::build(&repo_root()).context("replay the Dockerfile's build stage")?;
    let builder = replay
        .dockerfile
        .stage_index("builder")
        .context("the Dockerfile has no stage `builder`")?;
    let out = replay.roots[builder].join("out");
    ensure!(
        out.join("vcluster-plugin-operator").exists(),
        "the replayed build stage left no /out/vcluster-plugin-operator"
    );
    let container = node.run_buildah(&["from", "scratch"])?;
    node.run_buildah(&["copy", &container, &out.to_string_lossy(), "/out"])?;
    node.run_buildah(&[
        "commit",
        "-q",
        &container,
        "localhost/vcp/build-stage-out:replayed",
    ])?;
    node.run_buildah(&["rm", &container])?;

    let text = std::fs::read_to_string(repo_root().join("Dockerfile"))?;
    let lines: Vec<&str> = text.lines().collect();
    let final_from = lines
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .context("the Dockerfile has no FROM")?;
    let base = lines[final_from][5..]
        .split_whitespace()
        .next()
        .expect("FROM names an image")
        .to_string();
    ensure!(
        base.starts_with("gcr.io/distroless/cc-debian12"),
        "the final stage's base is {base}, not the distroless cc image the stand-in replaces"
    );
    build_distroless_stand_in(node, &base, &work)?;
    let containerfile = format!(
        "FROM localhost/vcp/build-stage-out:replayed AS builder\n{}\n",
        lines[final_from..].join("\n")
    );
    std::fs::write(work.join("Containerfile"), containerfile)?;
    node.run_buildah(&[
        "bud",
        "--pull=never",
        "--isolation",
        "chroot",
        "-f",
        &work.join("Containerfile").to_string_lossy(),
        "-t",
        &reference,
        &work.to_string_lossy(),
    ])?;
    node.import_built(&reference, "operator.docker.tar")?;
    Ok(reference)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_folders_of_exited_processes_with_nothing_mounted_are_removed() {
        let tmp = std::env::temp_dir().join(format!("vcp-node-stale-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        // No process has this pid (above the kernel's largest pid_max, 2^22).
        let gone = tmp.join(format!("{STATE_DIR_PREFIX}99999999"));
        let alive = tmp.join(format!("{STATE_DIR_PREFIX}{}", std::process::id()));
        let not_ours = tmp.join(format!("{STATE_DIR_PREFIX}demo"));
        // Gone too, but its `down` left a mount under it (as a kubelet's bind mount would be).
        let mounted = tmp.join(format!("{STATE_DIR_PREFIX}99999998"));
        for dir in [&gone, &alive, &not_ours, &mounted] {
            std::fs::create_dir_all(dir.join("run")).unwrap();
        }
        let source = tmp.join("source");
        std::fs::create_dir_all(&source).unwrap();
        // What is mounted there must not be reached by the removal.
        std::fs::write(source.join("kept"), "").unwrap();
        let target = mounted.join("run");
        let bind = Command::new("mount")
            .arg("--bind")
            .args([&source, &target])
            .status()
            .unwrap();
        assert!(bind.success(), "mount --bind (the tests run as root)");
        remove_stale_state_dirs(&tmp);
        let left = [&gone, &alive, &not_ours, &mounted].map(|d| d.exists());
        let kept = source.join("kept").exists();
        let unmounted = Command::new("umount").arg(&target).status().unwrap();
        std::fs::remove_dir_all(&tmp).unwrap();
        assert!(unmounted.success());
        assert_eq!(left, [false, true, true, true]);
        assert!(kept, "a file under a mount of a stale folder was removed");
    }
}

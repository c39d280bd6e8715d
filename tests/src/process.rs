//! The workspace's binaries as real processes: built by cargo into the test's own target
//! folder ([`workspace_binary`]), and the operator binary run as a process
//! ([`OperatorProcess`]) that a test can SIGKILL, SIGTERM, or let die at its test-only fault
//! point (`VCP_FAULT_ABORT_AFTER_WRITES`, `vcluster_plugin_operator::fault`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::control_plane::repo_root;

/// The workspace's target folder and profile of this test binary
/// (`<target>/<profile>/deps/<test binary>`).
fn target_profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("<target>/<profile>/deps")
        .to_path_buf()
}

/// Builds binary `bin` of workspace package `package` with cargo, with the package's
/// `test-faults` and `reconcile-log` features (test machinery; `cargo test --workspace` turns
/// them on too, through tests/Cargo.toml), in the same target folder and profile as the running test
/// binary, so nothing is rebuilt when `cargo test --workspace` already built it, and returns
/// its path; built once per test binary.
///
/// # Panics
/// When cargo fails (the end of its output, where the error is, is in the panic).
pub fn workspace_binary(package: &str, bin: &str) -> PathBuf {
    build_once(package, "--bin", bin)
}

/// [`workspace_binary`] for example `example` of `package` (`<target>/<profile>/examples/`).
///
/// # Panics
/// When cargo fails.
pub fn workspace_example(package: &str, example: &str) -> PathBuf {
    build_once(package, "--example", example)
}

/// `cargo build -p package <kind> name` with the test features, once per test binary.
fn build_once(package: &str, kind: &str, name: &str) -> PathBuf {
    static BUILT: Mutex<BTreeMap<(String, String, String), PathBuf>> = Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().expect("binaries");
    let key = (package.to_string(), kind.to_string(), name.to_string());
    if let Some(path) = built.get(&key) {
        return path.clone();
    }
    let profile = target_profile_dir();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .current_dir(repo_root())
        .args(["build", "--locked", "-p", package, kind, name])
        // The test machinery release builds leave out, as tests/Cargo.toml enables it (so the
        // features match `cargo test --workspace`'s and nothing is rebuilt): the fault point
        // (`vcp_crds::fault`; faults_operator_kill.rs and faults_runtime_kill.rs drive it) and
        // the reconcile logs; both binary packages have both features. This package's own
        // examples need none: it turns them on in its dependencies already.
        .env("CARGO_TARGET_DIR", profile.parent().expect("target folder"));
    if package != env!("CARGO_PKG_NAME") {
        build.args(["--features", "test-faults,reconcile-log"]);
    }
    if profile.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    let out = build.output().expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build -p {package} {kind} {name} failed:\n{}",
        tail_of_output(&out.stderr)
    );
    let path = if kind == "--example" {
        profile.join("examples").join(name)
    } else {
        profile.join(name)
    };
    built.insert(key, path.clone());
    path
}

/// The last 60 lines of a tool's output, each cut to 400 characters: the linker's command line
/// alone can fill a CI log's excerpt, and its error comes after it.
pub fn tail_of_output(output: &[u8]) -> String {
    let text = String::from_utf8_lossy(output);
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(60);
    lines[from..]
        .iter()
        .map(|line| match line.char_indices().nth(400) {
            Some((cut, _)) => format!("{}… ({} characters)", &line[..cut], line.len()),
            None => (*line).to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// How to start an [`OperatorProcess`].
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    /// `KUBECONFIG` of the process (the API server it talks to, and as whom).
    pub kubeconfig: PathBuf,
    /// `--runtime-image`.
    pub runtime_image: String,
    /// `VCP_FAULT_ABORT_AFTER_WRITES`: abort right after this many writes.
    pub abort_after_writes: Option<u64>,
    /// `VCP_FAULT_STOP_AFTER_WRITES`: stop (SIGSTOP) right after this many writes.
    pub stop_after_writes: Option<u64>,
    /// `--leader-elect` on the Lease `(namespace, name)` with this duration in seconds.
    pub leader_election: Option<(String, String, u64)>,
    /// `--concurrency` (the binary's default when `None`).
    pub concurrency: Option<u16>,
}

/// The operator binary (`vcluster-plugin-operator`) running as a process, as replica `name`
/// (`POD_NAME`: its Lease identity and the end of its `User-Agent`), logging JSON to
/// `<log_dir>/operator-<name>-<n>.log`, serving `/metrics` and `/readyz` on a free port.
/// Killed (SIGKILL) on drop.
#[derive(Debug)]
pub struct OperatorProcess {
    child: Child,
    /// The `/metrics`, `/healthz`, `/readyz` address.
    pub metrics: SocketAddr,
    /// Its log file.
    pub log: PathBuf,
}

impl OperatorProcess {
    /// Starts the operator binary (built by [`workspace_binary`]) as replica `name`.
    ///
    /// # Panics
    /// When it cannot be built or started.
    pub fn start(name: &str, log_dir: &Path, options: &OperatorOptions) -> OperatorProcess {
        let binary = workspace_binary("vcluster-plugin-operator", "vcluster-plugin-operator");
        OperatorProcess::start_binary(&binary, name, log_dir, options)
    }

    /// [`OperatorProcess::start`] of the operator binary at `binary` (the benchmark's release
    /// build without the test features, `scripts/bench operator`). The fault options need a
    /// binary built with `test-faults`.
    ///
    /// # Panics
    /// When it cannot be started.
    pub fn start_binary(
        binary: &Path,
        name: &str,
        log_dir: &Path,
        options: &OperatorOptions,
    ) -> OperatorProcess {
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = log_dir.join(format!("operator-{name}-{n}.log"));
        let mut command = Command::new(binary);
        command
            .args(["--runtime-image", &options.runtime_image])
            .args(["--metrics-bind-address", &metrics.to_string()])
            .env("KUBECONFIG", &options.kubeconfig)
            .env("POD_NAME", name)
            .env("RUST_LOG", "info")
            .env_remove("POD_NAMESPACE")
            .env_remove("VCP_FAULT_ABORT_AFTER_WRITES")
            .env_remove("VCP_FAULT_STOP_AFTER_WRITES")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("operator log file"));
        if let Some(n) = options.abort_after_writes {
            command.env("VCP_FAULT_ABORT_AFTER_WRITES", n.to_string());
        }
        if let Some(n) = options.stop_after_writes {
            command.env("VCP_FAULT_STOP_AFTER_WRITES", n.to_string());
        }
        if let Some((namespace, lease, duration)) = &options.leader_election {
            command
                .arg("--leader-elect")
                .args(["--lease-namespace", namespace])
                .args(["--lease-name", lease])
                .args(["--lease-duration", &duration.to_string()]);
        }
        if let Some(c) = options.concurrency {
            command.args(["--concurrency", &c.to_string()]);
        }
        let child = command.spawn().expect("start vcluster-plugin-operator");
        OperatorProcess {
            child,
            metrics,
            log,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status once it has ended, polling every 50 ms; `None` when `timeout` passes
    /// first.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the process is stopped (state `T` in `/proc/<pid>/stat`: SIGSTOP).
    pub fn is_stopped(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))
            .ok()
            .and_then(|stat| {
                stat.rsplit_once(") ")
                    .map(|(_, rest)| rest.starts_with('T'))
            })
            .unwrap_or(false)
    }

    /// Sends `signal` (such as `KILL`, `TERM`, `STOP`, `CONT`) with `kill(1)`.
    ///
    /// # Panics
    /// When `kill` fails.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.pid());
    }

    /// SIGKILL, then waits for the process to end; returns its status (killed by signal 9).
    pub fn kill(mut self) -> ExitStatus {
        let _ = self.child.kill();
        self.child.wait().expect("wait for the operator")
    }

    /// SIGTERM (a graceful stop), then waits at most `timeout` for the process to end.
    ///
    /// # Panics
    /// When it did not end within `timeout`.
    pub fn terminate(mut self, timeout: Duration) -> ExitStatus {
        self.signal("TERM");
        self.wait_exit(timeout)
            .unwrap_or_else(|| panic!("the operator did not stop within {timeout:?} of SIGTERM"))
    }

    /// A GET of `path` on its HTTP server: status code and body; `None` when it does not
    /// answer (not listening yet, or gone).
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.metrics, path).await
    }

    /// Starts its peak resident set ([`Self::peak_rss_bytes`]) again from its current resident
    /// set: `5` written to `/proc/<pid>/clear_refs` (Linux `proc(5)`: "reset the peak resident
    /// set size"), so that the peak of one phase of a test can be read apart from the others.
    ///
    /// # Panics
    /// When the file cannot be written (the process is gone, or not the caller's to reset).
    pub fn reset_peak_rss(&self) {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid()), "5")
            .unwrap_or_else(|e| panic!("reset the peak resident set of {}: {e}", self.pid()));
    }

    /// Its peak resident set size in bytes so far, or since [`Self::reset_peak_rss`] (`VmHWM` of
    /// `/proc/<pid>/status`); `None` when it cannot be read (the process is gone).
    pub fn peak_rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()?;
        Some(kib * 1024)
    }

    /// Field `field` of its start-up log line (`starting vcluster-plugin-operator`: the
    /// settings it runs with, e.g. `debounce_ms`, `concurrency`), as logged; `None` before the
    /// line is written or when the line has no such field.
    pub fn started_with(&self, field: &str) -> Option<serde_json::Value> {
        let log = std::fs::read_to_string(&self.log).ok()?;
        log.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["fields"]["message"] == "starting vcluster-plugin-operator")
            .and_then(|l| l["fields"].get(field).cloned())
    }

    /// The value of the metric line `name` (exact, with labels) on the operator's `/metrics`;
    /// `None` while it does not answer or without that line.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics").await?;
        metric(&body, name)
    }

    /// Its finished reconciles that did their work, from `/metrics`: `vcp_reconcile_total`
    /// (all results) less `vcp_operator_reconciles_deferred_total` (those requeued because
    /// their vCluster's lock was held), as the operator's own count
    /// (`Telemetry::reconciles`, which its heap trims follow).
    pub async fn reconciles(&self) -> Option<u64> {
        let (_, body) = self.get("/metrics").await?;
        let finished = metric_sum(&body, "vcp_reconcile_total")?;
        let deferred = metric(&body, "vcp_operator_reconciles_deferred_total").unwrap_or(0.0);
        Some((finished - deferred).max(0.0) as u64)
    }
}

/// The value of a metric line `name` (exact, with labels) in a Prometheus text body.
pub fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The sum of every labelled line of the metric `family` (`family{...} value`) in a
/// Prometheus text body: 0 without such a line, `None` when a value does not parse.
pub fn metric_sum(body: &str, family: &str) -> Option<f64> {
    let mut total = 0.0;
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix(family).and_then(|r| r.strip_prefix('{'))
            && let Some((_, value)) = rest.split_once("} ")
        {
            total += value.trim().parse::<f64>().ok()?;
        }
    }
    Some(total)
}

/// The signal that ended a process, if a signal did (6 for SIGABRT, 9 for SIGKILL).
pub fn exit_signal(status: &ExitStatus) -> Option<i32> {
    status.signal()
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal HTTP/1.1 GET: status code and body; `None` when the connection fails.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.ok()?;
    let code = raw.split_whitespace().nth(1)?.parse().ok()?;
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

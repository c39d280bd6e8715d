//! The real cert-manager on the host cluster: [`CertManager::shared`] installs cert-manager's CRDs
//! (from its module's `deploy/crds`, [`crate::real_crds`]) and starts the driver
//! `tests/helm/cmd/cert-manager` (cert-manager's own certificate controllers, its
//! CertificateRequest approver, self-signed and CA issuers, and its Issuer controller, compiled
//! from `github.com/cert-manager/cert-manager` at the version pinned in `tests/helm/go.mod`, built
//! and cached by `scripts/oracles build` as `CERT_MANAGER`) as a process against the host API
//! server of the shared control plane, as the host admin (RBAC is not what these tests are
//! about). One driver per test binary, watching every namespace.
//!
//! Stopping: the driver is recorded in the control plane's `pids` file, so the control plane's
//! `down` (run by its watchdog once the test binary has exited, however it ended) stops it with
//! the API servers. Its log is `cert-manager.log` in the control plane's folder.
//!
//! Also here: the cert-manager kinds as [`ApiResource`]s, a condition's status, and the DNS
//! names of an issued certificate ([`tls_dns_names`], parsed as X.509 by `x509-parser`), and whether
//! one certificate signed another ([`tls_signed_by`], its signature verified with `ring`).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use tokio::sync::OnceCell;
use x509_parser::extensions::GeneralName;

use crate::control_plane::{Cluster, ControlPlane, Identity};
use crate::fixtures::oracle_paths;
use crate::real_crds::{cert_manager_crd_files, install_crd_files};

/// How long [`CertManager::shared`] waits for the driver's informers to sync.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The line the driver prints on standard error once its informers have synced.
const RUNNING_LINE: &str = "cert-manager-driver: running ";

/// The cert-manager driver running against the shared control plane's host API server.
#[derive(Debug)]
pub struct CertManager {
    child: Mutex<Child>,
    /// Its log (standard error: klog lines and the `running` line).
    pub log: PathBuf,
    /// The controllers it runs, as it printed them (cert-manager's controller names).
    pub controllers: Vec<String>,
}

impl CertManager {
    /// The driver of this test binary, started on first use: cert-manager's CRDs installed on
    /// the host, then the driver, returning once its informers have synced.
    ///
    /// # Panics
    /// When the CRDs are refused, the driver cannot be built or started, exits, or has not synced
    /// within 120 s (the end of its log is in the panic).
    pub async fn shared() -> &'static CertManager {
        static SHARED: OnceCell<CertManager> = OnceCell::const_new();
        SHARED.get_or_init(Self::start).await
    }

    async fn start() -> CertManager {
        let cp = ControlPlane::shared();
        let host = cp.client(Cluster::Host, Identity::Admin).await;
        install_crd_files(&host, &cert_manager_crd_files()).await;
        let binary = oracle_paths()["CERT_MANAGER"].clone();
        let log = cp.dir().join("cert-manager.log");
        let child = Command::new(&binary)
            .arg("--kubeconfig")
            .arg(cp.kubeconfig(Cluster::Host, Identity::Admin))
            .args(["--v", "2"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("cert-manager log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        // The control plane's `down` stops every process of its `pids` file (`<pid> <name>`).
        std::fs::OpenOptions::new()
            .append(true)
            .open(cp.dir().join("pids"))
            .and_then(|mut f| writeln!(f, "{} cert-manager", child.id()))
            .expect("record the driver in the control plane's pids file");
        let driver = CertManager {
            child: Mutex::new(child),
            log,
            controllers: Vec::new(),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let text = std::fs::read_to_string(&driver.log).unwrap_or_default();
            if let Some(line) = text.lines().find_map(|l| l.strip_prefix(RUNNING_LINE)) {
                let controllers = line.split(',').map(str::to_string).collect();
                return CertManager {
                    controllers,
                    ..driver
                };
            }
            let exited = driver
                .child
                .lock()
                .expect("child")
                .try_wait()
                .ok()
                .flatten();
            if exited.is_some() || Instant::now() > deadline {
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                panic!(
                    "the cert-manager driver {} ({exited:?}); the end of {}:\n{}",
                    if exited.is_some() {
                        "exited"
                    } else {
                        "did not sync within 120 s"
                    },
                    driver.log.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether the driver process is still running.
    pub fn running(&self) -> bool {
        matches!(self.child.lock().expect("child").try_wait(), Ok(None))
    }
}

/// `cert-manager.io/v1` kind `kind` with its plural (`Issuer` / `issuers`, `Certificate` /
/// `certificates`, `CertificateRequest` / `certificaterequests`).
pub fn cert_manager_resource(kind: &str) -> ApiResource {
    let plural = format!("{}s", kind.to_ascii_lowercase());
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cert-manager.io", "v1", kind),
        &plural,
    )
}

/// The `status` of condition `type_` in `obj`'s `status.conditions` (`"True"`, `"False"`,
/// `"Unknown"`), `None` when it has no such condition.
pub fn condition_status(obj: &DynamicObject, type_: &str) -> Option<String> {
    obj.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str())
        .map(str::to_string)
}

/// The first PEM block of `secret`'s `tls.crt`.
///
/// # Errors
/// When the Secret has no `tls.crt`, or it is not PEM.
fn tls_pem(secret: &Secret) -> anyhow::Result<x509_parser::pem::Pem> {
    let pem_bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get("tls.crt"))
        .ok_or_else(|| anyhow::anyhow!("the Secret has no tls.crt"))?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem_bytes.0)
        .map_err(|e| anyhow::anyhow!("tls.crt is not PEM: {e}"))?;
    Ok(pem)
}

/// Checks that the first certificate of `secret`'s `tls.crt` was signed by the key of the first
/// certificate of `issuer`'s `tls.crt`: its signature verified with that certificate's public
/// key (x509-parser's `verify`, with `ring`), and its issuer name is that certificate's subject.
///
/// # Errors
/// When either `tls.crt` is not a PEM X.509 certificate, the signature does not verify with the
/// issuer's key (or uses an algorithm `ring` does not verify), or the names differ.
pub fn tls_signed_by(secret: &Secret, issuer: &Secret) -> anyhow::Result<()> {
    let (leaf_pem, issuer_pem) = (tls_pem(secret)?, tls_pem(issuer)?);
    let leaf = leaf_pem
        .parse_x509()
        .map_err(|e| anyhow::anyhow!("tls.crt is not X.509: {e}"))?;
    let ca = issuer_pem
        .parse_x509()
        .map_err(|e| anyhow::anyhow!("the issuer's tls.crt is not X.509: {e}"))?;
    leaf.verify_signature(Some(ca.public_key())).map_err(|e| {
        anyhow::anyhow!(
            "the signature of {} does not verify with the key of {}: {e}",
            leaf.subject(),
            ca.subject()
        )
    })?;
    anyhow::ensure!(
        leaf.issuer() == ca.subject(),
        "{} names {} as its issuer, not {}",
        leaf.subject(),
        leaf.issuer(),
        ca.subject()
    );
    Ok(())
}

/// The DNS names (subject alternative names) of the first certificate of `secret`'s `tls.crt`
/// (PEM), parsed as X.509.
///
/// # Errors
/// When the Secret has no `tls.crt`, or it is not a PEM X.509 certificate.
pub fn tls_dns_names(secret: &Secret) -> anyhow::Result<Vec<String>> {
    let pem = tls_pem(secret)?;
    let cert = pem
        .parse_x509()
        .map_err(|e| anyhow::anyhow!("tls.crt is not X.509: {e}"))?;
    let names = cert
        .subject_alternative_name()
        .map_err(|e| anyhow::anyhow!("bad subjectAltName: {e}"))?
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(d) => Some(d.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(names)
}

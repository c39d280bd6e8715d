//! An operator replica in-process on a tokio runtime of its own ([`Replica`]), so that a test
//! can stop it gracefully or kill it (shut its runtime down: no cleanup, no Lease release,
//! like a crashed pod). Each replica sends its own `User-Agent`, so the audit log tells
//! replicas apart.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::oneshot;
use vcluster_plugin_operator::policy::Policy;
use vcluster_plugin_operator::{Config, LeaderElection, Telemetry, run_until};

use crate::control_plane::{Cluster, Identity};

/// CRDs, the operator's RBAC (cluster and leader-election), namespace `vcp-system` on the
/// shared host cluster ([`crate::install_operator_rbac`]), once per test binary; returns an
/// admin client of the host cluster.
pub async fn prepare_host() -> Client {
    static SETUP: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let cp = crate::control_plane::ControlPlane::shared();
    SETUP
        .get_or_init(|| async {
            let admin = cp.client(Cluster::Host, Identity::Admin).await;
            crate::fixtures::install_operator_rbac(&admin).await;
        })
        .await;
    cp.client(Cluster::Host, Identity::Admin).await
}

/// The runtime image a [`Replica`] installs (`--runtime-image`).
pub const REPLICA_RUNTIME_IMAGE: &str = "vcp-test/runtime:e2e";

/// The `User-Agent` of replica `replica` (the audit log records it).
pub fn user_agent(replica: &str) -> String {
    format!("vcluster-plugin-operator/{replica}")
}

/// One operator replica (in-process, as `vcp-operator` with [`user_agent`]) on a tokio runtime
/// of its own, serving /metrics, /healthz, /readyz on a free port. Dropping it shuts its
/// runtime down (like [`Replica::kill`]).
pub struct Replica {
    runtime: Option<tokio::runtime::Runtime>,
    /// The replica's telemetry (reconcile counts, metrics).
    pub telemetry: Arc<Telemetry>,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<Result<(), String>>>,
}

impl Replica {
    /// A replica named `name` (its Lease identity with `election`), default policy.
    pub async fn start(name: &str, election: Option<LeaderElection>) -> Replica {
        Replica::start_with_policy(name, election, Policy::default()).await
    }

    /// A replica with the operator policy `policy` (what `--policy-file` sets).
    pub async fn start_with_policy(
        name: &str,
        election: Option<LeaderElection>,
        policy: Policy,
    ) -> Replica {
        let mut kc = crate::control_plane::ControlPlane::shared()
            .config(Cluster::Host, Identity::Operator)
            .await
            .expect("operator kubeconfig");
        kc.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_str(&user_agent(name)).unwrap(),
        ));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("replica runtime");
        let telemetry = Arc::new(Telemetry::new());
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (done_tx, done_rx) = oneshot::channel();
        let (addr_tx, addr_rx) = oneshot::channel();
        let t = telemetry.clone();
        let instance = name.to_string();
        runtime.spawn(async move {
            let client = Client::try_from(kc).expect("operator client");
            let listener = vcluster_plugin_operator::http::bind("127.0.0.1:0".parse().unwrap())
                .await
                .expect("bind");
            let _ = addr_tx.send(listener.local_addr().unwrap());
            tokio::spawn(vcluster_plugin_operator::http::serve(
                listener,
                t.clone(),
                std::future::pending(),
            ));
            let mut config = Config::new(client);
            config.runtime_image = REPLICA_RUNTIME_IMAGE.into();
            config.telemetry = t;
            config.leader_election = election;
            config.instance = Some(instance);
            config.policy = policy;
            // `VCP_DEBOUNCE_MS` in the test's environment, as the operator's CLI reads it: the
            // replicas then run with that debounce instead of the default.
            if let Some(ms) = std::env::var("VCP_DEBOUNCE_MS")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
            {
                config.debounce = Duration::from_millis(ms);
            }
            let res = run_until(config, async {
                let _ = stop_rx.await;
            })
            .await;
            let _ = done_tx.send(res.map_err(|e| e.to_string()));
        });
        let addr = addr_rx.await.expect("replica started");
        Replica {
            runtime: Some(runtime),
            telemetry,
            addr,
            stop: Some(stop_tx),
            done: Some(done_rx),
        }
    }

    /// Graceful stop (as on SIGTERM): `run_until` must return `Ok`.
    ///
    /// # Panics
    /// When the operator does not end with `Ok`.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let res = self.done.take().unwrap().await.expect("operator ended");
        assert_eq!(res, Ok(()), "graceful stop");
        self.runtime.take().unwrap().shutdown_background();
    }

    /// Dies on the spot: nothing more runs, nothing is released.
    pub fn kill(mut self) {
        self.runtime.take().unwrap().shutdown_background();
    }

    /// GET `path` on the replica's HTTP server: status code and body.
    ///
    /// # Panics
    /// When the server cannot be reached.
    pub async fn get(&self, path: &str) -> (u16, String) {
        crate::process::http_get(self.addr, path)
            .await
            .unwrap_or_else(|| panic!("GET {path} from the replica at {}", self.addr))
    }

    /// The reconciles the replica has finished so far.
    pub fn reconciles(&self) -> u64 {
        self.telemetry.reconciles()
    }

    /// Waits until the replica has finished at least `n` reconciles.
    ///
    /// # Panics
    /// When that takes longer than a minute.
    pub async fn wait_reconciles(&self, n: u64) {
        let t = self.telemetry.clone();
        crate::wait::wait_for(Duration::from_secs(60), || {
            let t = t.clone();
            async move { (t.reconciles() >= n).then_some(()) }
        })
        .await;
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

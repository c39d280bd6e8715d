//! How to run the operator ([`Config`]) and its defaults, with the settings of leader election
//! ([`LeaderElection`], run by [`crate::leader`]); re-exported at the crate root and in
//! [`crate::leader`].

use std::sync::Arc;
use std::time::Duration;

use crate::policy::Policy;
use crate::telemetry::Telemetry;

/// The embedded runtime's image at this crate's version:
/// `ghcr.io/vcp-dev/vcluster-plugin-operator:<version>` (one image holds both binaries).
pub fn default_runtime_image() -> String {
    format!(
        "ghcr.io/vcp-dev/vcluster-plugin-operator:{}",
        env!("CARGO_PKG_VERSION")
    )
}

/// How to run the operator.
#[derive(Clone)]
pub struct Config {
    /// Client with the operator's identity (RBAC: `config/rbac/`).
    pub client: kube::Client,
    /// Image of the embedded-runtime sidecar; default [`default_runtime_image`].
    pub runtime_image: String,
    /// Reconciles running at once (0: unbounded); default [`DEFAULT_CONCURRENCY`].
    pub concurrency: u16,
    /// How long the controller waits after a plugin's last trigger before reconciling it
    /// (0: no debounce); default [`DEBOUNCE`], 0.
    pub debounce: std::time::Duration,
    /// `reportingInstance` of the Events (such as the pod name); default: none.
    pub instance: Option<String>,
    /// Which RBAC rules a plugin may grant; default [`Policy::default`].
    pub policy: Policy,
    /// Leader election: only the holder of the Lease reconciles; default: none (this replica
    /// always reconciles).
    pub leader_election: Option<LeaderElection>,
    /// Client the Lease is read and renewed with; default: none, [`Config::client`] is used.
    /// The binary gives it its own connections, as controller-runtime gives leader election a
    /// client of its own: a Lease read that times out while the API server is unreachable
    /// then closes none of the connections the controller's requests use (a cancelled HTTP/1.1
    /// request closes its connection), and the controller's requests never wait on a Lease
    /// request's connection.
    pub lease_client: Option<kube::Client>,
    /// Metrics and readiness, shared with [`http::serve`](crate::http::serve); default: fresh.
    pub telemetry: Arc<Telemetry>,
}

impl Config {
    /// The defaults, with `client`.
    pub fn new(client: kube::Client) -> Self {
        Config {
            client,
            runtime_image: default_runtime_image(),
            concurrency: DEFAULT_CONCURRENCY,
            debounce: DEBOUNCE,
            instance: None,
            policy: Policy::default(),
            leader_election: None,
            lease_client: None,
            telemetry: Arc::new(Telemetry::new()),
        }
    }
}

/// Delay before a failed sweep ([`crate::sweep`]) is retried. A failed reconcile waits a
/// delay of its own plugin instead, growing with each consecutive failure ([`crate::retry`]).
pub const RETRY: Duration = Duration::from_secs(5);

/// [`DEBOUNCE`] in milliseconds (the default of `--debounce-ms`): 0.
pub const DEBOUNCE_MS: u64 = 0;

/// How long the controller waits after the last trigger of a plugin before reconciling it
/// (trailing-edge debounce, `kube::runtime::controller::Config::debounce`); the default of
/// [`Config::debounce`] (`--debounce-ms`): none. A debounce lets the watch events of one
/// reconcile's own writes coalesce into at most one more reconcile; without it a new plugin is
/// `Ready` about 200 ms sooner (reaction p50 102 ms against 301 ms at 200 ms) with the same bulk
/// time and writes (docs/BENCHMARKS.md, "a quiet machine, the shipped build, fewer round
/// trips, no debounce"). The default was 200 ms
/// while two races showed only at 0: the new leader's start-up sweep judging orphans against a
/// stale copy of the plugins' cache (fixed in `crate::sweep`: the cache is read after each
/// list), and the leader-partition test's write in flight, lost when a Lease read held the
/// controller's one idle connection (fixed: the Lease has a client of its own,
/// [`Config::lease_client`]).
pub const DEBOUNCE: Duration = Duration::from_millis(DEBOUNCE_MS);

/// Reconciles running at once by default (`--concurrency`, env `VCP_CONCURRENCY`): 16.
///
/// A reconcile mostly waits (on the judge's dry runs, its workload's lock and the writes, one
/// after the other), so the operator was latency-bound at 4: 1,000 vClusters with 2 plugins
/// each took 1.99× the floor of the same writes at 4 (docs/BENCHMARKS.md, "Operator"), and 16
/// was faster than 8 for the operator (30.7 s against 29.5 s and 28.6 s against 34.3 s in two
/// pairs of runs). Against the fastest floor of three concurrencies the ratio is
/// 1.41 at 1,000 vClusters (one quiet run) and medians of 1.48 with no debounce (the default)
/// and 1.52 at `--debounce-ms 200` at 200 vClusters (three quiet runs of the shipped build
/// each): the target of at most 1.5 times the floor is met as a median with no debounce only, where
/// both the operator and the floor keep the two cores busy and the operator's dry runs and
/// reads are its extra work.
pub const DEFAULT_CONCURRENCY: u16 = 16;

/// Default name of the Lease.
pub const DEFAULT_LEASE_NAME: &str = "vcluster-plugin-operator";
/// Default namespace of the Lease when `POD_NAMESPACE` is unset.
pub const DEFAULT_LEASE_NAMESPACE: &str = "vcp-system";
/// Default lease duration, seconds.
pub const DEFAULT_LEASE_DURATION_SECONDS: u64 = 15;

/// Which Lease to compete for, and as whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElection {
    /// Name of the Lease (`--lease-name`).
    pub lease_name: String,
    /// Namespace of the Lease (`--lease-namespace`; the operator needs get/create/patch on
    /// Leases there, see `config/rbac/leader_election_role.yaml`).
    pub namespace: String,
    /// This replica's identity in the Lease's `holderIdentity` (the pod name); unique per
    /// replica.
    pub identity: String,
    /// Seconds a Lease stays valid after its last renewal (`--lease-duration`, at least 2).
    pub duration_seconds: u64,
}

impl LeaderElection {
    /// The defaults for `identity`: Lease [`DEFAULT_LEASE_NAME`] in [`DEFAULT_LEASE_NAMESPACE`],
    /// [`DEFAULT_LEASE_DURATION_SECONDS`].
    pub fn new(identity: impl Into<String>) -> Self {
        LeaderElection {
            lease_name: DEFAULT_LEASE_NAME.into(),
            namespace: DEFAULT_LEASE_NAMESPACE.into(),
            identity: identity.into(),
            duration_seconds: DEFAULT_LEASE_DURATION_SECONDS,
        }
    }

    /// Seconds before expiry at which the holder renews.
    pub fn grace_seconds(&self) -> u64 {
        (self.duration_seconds / 3).max(1)
    }
}

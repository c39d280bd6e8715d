//! Command-line flags for running the operator in a cluster: leader election and the
//! `/metrics`, `/healthz`, `/readyz` server. The binary flattens [`OperationsArgs`] into its
//! run command; [`OperationsArgs::leader_election`] turns them into the [`crate::Config`]
//! field.

use std::net::SocketAddr;

use crate::leader::{
    DEFAULT_LEASE_DURATION_SECONDS, DEFAULT_LEASE_NAME, DEFAULT_LEASE_NAMESPACE, LeaderElection,
};

/// Flags of the operator's run path for operations (leader election, metrics, probes).
#[derive(Clone, Debug, clap::Args)]
pub struct OperationsArgs {
    /// Compete for a Lease and reconcile only while holding it (several replicas).
    #[arg(long)]
    pub leader_elect: bool,

    /// Name of the leader-election Lease.
    #[arg(long, default_value = DEFAULT_LEASE_NAME)]
    pub lease_name: String,

    /// Namespace of the leader-election Lease (the pod's own namespace in a cluster).
    #[arg(long, env = "POD_NAMESPACE", default_value = DEFAULT_LEASE_NAMESPACE)]
    pub lease_namespace: String,

    /// Seconds a Lease stays valid after its last renewal; a replica that dies is replaced
    /// after at most this long.
    #[arg(long, default_value_t = DEFAULT_LEASE_DURATION_SECONDS)]
    pub lease_duration: u64,

    /// Address of the HTTP server for /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_bind_address: SocketAddr,
}

impl OperationsArgs {
    /// The leader election these flags ask for (`None` without `--leader-elect`); the identity
    /// is `POD_NAME`, else `<hostname>-<pid>`.
    pub fn leader_election(&self) -> Option<LeaderElection> {
        if !self.leader_elect {
            return None;
        }
        let identity = std::env::var("POD_NAME").ok().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "vcluster-plugin-operator".into());
            format!("{host}-{}", std::process::id())
        });
        Some(LeaderElection {
            lease_name: self.lease_name.clone(),
            namespace: self.lease_namespace.clone(),
            identity,
            duration_seconds: self.lease_duration,
        })
    }
}

//! Leader election on a `coordination.k8s.io/v1` Lease (DESIGN.md, "Operator contract"), with
//! [`kube_lease_manager`]: of all replicas started with the same Lease, only the holder runs the
//! controller (and so reads caches and writes anything besides the Lease).
//!
//! - a replica waits until it holds the Lease, then starts the controller;
//! - the holder renews the Lease `duration / 3` seconds (at least 1) before it expires;
//! - a replica that loses the Lease stops its controller at once (reconciles in flight are
//!   dropped, not finished: another replica may already lead) and waits to lead again;
//! - on shutdown the controller stops gracefully, then the Lease is released so another replica
//!   takes over without waiting for it to expire. A replica that dies without releasing it is
//!   replaced once the Lease has expired (within `duration`).

use std::future::Future;
use std::sync::Arc;

use futures::FutureExt;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::Config;
pub use crate::config::{
    DEFAULT_LEASE_DURATION_SECONDS, DEFAULT_LEASE_NAME, DEFAULT_LEASE_NAMESPACE, LeaderElection,
};
use crate::controller;
use crate::error::{Error, Result};
use crate::telemetry::Telemetry;

/// Runs the controller whenever this replica holds the Lease, until `shutdown` completes.
///
/// # Errors
/// [`Error::LeaseDuration`] for a duration under 2 s; [`Error::Lease`] when the Lease cannot be
/// read or created (RBAC: get/create/patch on `leases` in its namespace) or the election
/// task fails.
pub async fn run_elected(
    config: Config,
    election: LeaderElection,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    if election.duration_seconds < 2 {
        return Err(Error::LeaseDuration(election.duration_seconds));
    }
    let lease = format!("{}/{}", election.namespace, election.lease_name);
    let manager = LeaseManagerBuilder::new(config.client.clone(), &election.lease_name)
        .with_namespace(&election.namespace)
        .with_identity(&election.identity)
        .with_field_manager(format!("{}-lease", vcp_crds::OPERATOR_FIELD_MANAGER))
        .with_grace(election.grace_seconds())
        .with_duration(election.duration_seconds)
        .build()
        .await
        .map_err(|source| Error::Lease {
            lease: lease.clone(),
            source,
        })?;
    let (mut leading, task) = manager.watch().await;
    let telemetry: Arc<Telemetry> = config.telemetry.clone();
    telemetry.set_leading(*leading.borrow());
    info!(%lease, identity = %election.identity, "joined the leader election");

    let shutdown = shutdown.shared();
    loop {
        // Wait to lead.
        tokio::select! {
            _ = shutdown.clone() => break,
            became = wait_for_state(&mut leading, true) => if !became {
                break;
            },
        }
        info!(%lease, identity = %election.identity, "leading: starting the controller");
        telemetry.set_leading(true);
        let mut watch_lost = leading.clone();
        let stopped_by_shutdown = tokio::select! {
            res = controller::run_until(config.clone(), shutdown.clone()) => {
                res?;
                true
            }
            _ = wait_for_state(&mut watch_lost, false) => false,
        };
        telemetry.set_leading(false);
        if stopped_by_shutdown {
            break;
        }
        warn!(%lease, identity = %election.identity, "lost the Lease: stopped reconciling");
    }

    // Closing the channel makes the election task release the Lease, if held, and end.
    drop(leading);
    match task.await {
        Ok(Ok(_)) => {
            info!(%lease, "left the leader election");
            Ok(())
        }
        Ok(Err(source)) => Err(Error::Lease { lease, source }),
        Err(join) => {
            warn!(%lease, error = %join, "the leader-election task ended abnormally");
            Ok(())
        }
    }
}

/// Waits until the channel holds `state`; `false` when the election task ended first.
async fn wait_for_state(rx: &mut watch::Receiver<bool>, state: bool) -> bool {
    rx.wait_for(|v| *v == state).await.is_ok()
}

//! Leader election on a `coordination.k8s.io/v1` Lease (one replica acts at a time), with
//! [`kube_lease_manager`]: of all replicas started with the same Lease, only the holder runs the
//! controller (and so reads caches and writes anything besides the Lease).
//!
//! - a replica waits until it holds the Lease, then starts the controller;
//! - the holder renews the Lease `duration / 3` seconds (at least 1) before it expires;
//! - a replica that loses the Lease stops its controller at once (reconciles in flight are
//!   dropped, not finished: another replica may already lead) and waits to lead again;
//! - a replica only leads while it can *confirm* its hold ([`confirm_hold`]): it reads the Lease
//!   every `grace / 4` (100 ms to 1 s) and stops its controller as soon as the Lease names
//!   another holder (a stolen Lease: within one read, not at its next renewal), or when its own
//!   last renewal it has read is older than `duration - grace / 2` (its renew deadline: cut off
//!   from the API server, it cannot renew, and stops *before* the Lease expires and another
//!   replica may take it). kube-lease-manager alone does neither: it learns of another holder
//!   only at its next renewal, and while the API server cannot be reached it keeps reporting
//!   the Lease as held (it retries, and says nothing), so the controller of a partitioned
//!   leader kept running and wrote again as soon as the partition healed, beside the new leader
//!   (`tests/tests/faults_operator_lease.rs`). It leads again once both agree;
//! - on shutdown the controller stops gracefully, then the Lease is released so another replica
//!   takes over without waiting for it to expire. A replica that dies without releasing it is
//!   replaced once the Lease has expired (within `duration`).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
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
    let lease_client = config
        .lease_client
        .clone()
        .unwrap_or_else(|| config.client.clone());
    let manager = LeaseManagerBuilder::new(lease_client.clone(), &election.lease_name)
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

    let (hold_tx, mut hold) = watch::channel(false);
    let confirm = tokio::spawn(confirm_hold(
        Api::namespaced(lease_client, &election.namespace),
        election.clone(),
        hold_tx,
    ));

    let shutdown = shutdown.shared();
    loop {
        // Wait to lead: the election says so, and the Lease read back confirms it.
        tokio::select! {
            _ = shutdown.clone() => break,
            became = wait_for_both(&mut leading, &mut hold) => if !became {
                break;
            },
        }
        info!(%lease, identity = %election.identity, "leading: starting the controller");
        telemetry.set_leading(true);
        let (mut watch_lost, mut hold_lost) = (leading.clone(), hold.clone());
        let stopped_by_shutdown = tokio::select! {
            res = controller::run_until(config.clone(), shutdown.clone()) => {
                res?;
                true
            }
            _ = wait_for_state(&mut watch_lost, false) => false,
            _ = wait_for_state(&mut hold_lost, false) => false,
        };
        telemetry.set_leading(false);
        if stopped_by_shutdown {
            break;
        }
        warn!(%lease, identity = %election.identity, "lost the Lease (or cannot confirm it before its renew deadline): stopped reconciling");
    }
    confirm.abort();

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

/// Waits until both channels hold `true`; `false` when either sender is gone.
async fn wait_for_both(a: &mut watch::Receiver<bool>, b: &mut watch::Receiver<bool>) -> bool {
    loop {
        if *a.borrow_and_update() && *b.borrow_and_update() {
            return true;
        }
        let changed = tokio::select! {
            r = a.changed() => r,
            r = b.changed() => r,
        };
        if changed.is_err() {
            return false;
        }
    }
}

/// How often [`confirm_hold`] reads the Lease: a quarter of the grace, 100 ms to 1 s (so a
/// renewal, made `grace` before expiry, is seen well before the renew deadline).
pub fn confirm_interval(election: &LeaderElection) -> Duration {
    (Duration::from_secs(election.grace_seconds()) / 4)
        .clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// The renew deadline: how long after its last renewal a holder still counts as holding the
/// Lease, `duration - grace / 2` (the renewal is due at `duration - grace`; the Lease expires
/// at `duration`, when another replica may take it).
pub fn renew_deadline(election: &LeaderElection) -> Duration {
    Duration::from_secs(election.duration_seconds)
        .saturating_sub(Duration::from_secs(election.grace_seconds()) / 2)
}

/// Until when `lease` confirms that `identity` holds it: `renewTime + renew deadline` when its
/// holder is `identity` and it has a renew time; `None` otherwise (another holder, or none).
/// The renew time was written by this replica's own clock, so no skew enters.
pub fn held_until(lease: &Lease, identity: &str, deadline: Duration) -> Option<SystemTime> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed: SystemTime = spec.renew_time.as_ref()?.0.into();
    renewed.checked_add(deadline)
}

/// Reads the Lease every [`confirm_interval`] (each read bounded by that interval) and sends
/// whether this replica's hold is confirmed: the last Lease read names it as holder and the
/// renew deadline of its last renewal read ([`held_until`]) has not passed. A failed read
/// changes nothing but time: the deadline then passes unless a later read confirms a renewal.
/// Runs until aborted or the receivers are gone.
async fn confirm_hold(api: Api<Lease>, election: LeaderElection, tx: watch::Sender<bool>) {
    let every = confirm_interval(&election);
    let deadline = renew_deadline(&election);
    let mut until: Option<SystemTime> = None;
    let mut failing = false;
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match tokio::time::timeout(every, api.get_opt(&election.lease_name)).await {
            Ok(Ok(read)) => {
                until = read
                    .as_ref()
                    .and_then(|l| held_until(l, &election.identity, deadline));
                if failing {
                    let holder = read
                        .and_then(|l| l.spec?.holder_identity)
                        .unwrap_or_default();
                    info!(lease = %election.lease_name, %holder, "the Lease is readable again");
                    failing = false;
                }
            }
            Ok(Err(e)) => {
                if !failing {
                    warn!(lease = %election.lease_name, error = %e, "cannot read the Lease");
                }
                failing = true;
            }
            Err(_) => {
                if !failing {
                    warn!(lease = %election.lease_name, "no answer to a read of the Lease within {every:?}");
                }
                failing = true;
            }
        }
        let confirmed = until.is_some_and(|t| SystemTime::now() < t);
        tx.send_if_modified(|held| std::mem::replace(held, confirmed) != confirmed);
        if tx.is_closed() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: Option<&str>, renewed_secs: Option<i64>) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: renewed_secs
                    .map(|s| MicroTime(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())),
                lease_duration_seconds: Some(15),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn the_renew_deadline_lies_between_the_renewal_and_the_expiry() {
        // kube-lease-manager renews `grace` before expiry; the Lease expires at `duration`.
        let e = LeaderElection::new("a");
        assert_eq!(e.duration_seconds, 15);
        assert_eq!(e.grace_seconds(), 5);
        assert_eq!(renew_deadline(&e), Duration::from_millis(12_500));
        assert_eq!(confirm_interval(&e), Duration::from_secs(1));
        let short = LeaderElection {
            duration_seconds: 4,
            ..LeaderElection::new("a")
        };
        assert_eq!(renew_deadline(&short), Duration::from_millis(3_500));
        assert_eq!(confirm_interval(&short), Duration::from_millis(250));
    }

    #[test]
    fn only_a_lease_naming_this_replica_confirms_its_hold() {
        let d = Duration::from_secs(10);
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        assert_eq!(
            held_until(&lease(Some("a"), Some(100)), "a", d),
            Some(at(110))
        );
        assert_eq!(held_until(&lease(Some("thief"), Some(100)), "a", d), None);
        assert_eq!(held_until(&lease(None, None), "a", d), None);
        assert_eq!(held_until(&lease(Some("a"), None), "a", d), None);
        assert_eq!(held_until(&Lease::default(), "a", d), None);
    }
}

//! A synced type that disappears from the virtual cluster (the README, "When a synced type
//! disappears").
//!
//! Deleting a CRD deletes every object of it: the virtual watch then reports each virtual
//! object deleted, which the lifecycle table ([`crate::controller`]) would
//! turn into a delete of every host copy. The runtime never mass-deletes host copies because a
//! type vanished: before it deletes a host copy whose virtual object is missing, it asks the
//! virtual API server whether the type is still there ([`TypeGuard::presence`]: its CRD
//! exists and is not being deleted, and discovery serves the resource). When it is not:
//!
//! - the host copy is kept and *held*; the type is reported unavailable (`RuntimeHealthy=False,
//!   reason=TypeUnavailable`), and its watch is retried with a capped exponential delay
//!   ([`crate::retry`]);
//! - when a virtual object of the same name appears again (the type and its objects were
//!   re-created), its held host copy is adopted: updated in place to the new object (its
//!   `vcluster.loft.sh/object-uid` annotation included), never deleted and re-created, so the
//!   host object keeps its uid;
//! - a held host copy whose virtual object does not come back is kept for [`HOLD_GRACE`] after
//!   the type is served again (time to re-create the objects), and deleted as usual by the
//!   first reconcile after that (at the latest the next resync).
//!
//! Holds live in memory: a runtime started while the type is gone never lists it, so it deletes
//! nothing; one started after the type came back applies the lifecycle table as usual.
//! A CRD that cannot be read (RBAC: vCluster's own kubeconfig, which the runtime uses in the
//! virtual cluster, is admin there) is judged by discovery alone.
//!
//! [`Holds`] is the bookkeeping (pure); [`TypeGuard`] adds the two reads.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use crate::driver::ObjectKey;
use crate::error::Error;
use crate::stats::TypeStats;

/// How long a held host copy is kept after its type is served again, waiting for its virtual
/// object to be re-created.
pub const HOLD_GRACE: Duration = Duration::from_secs(300);

/// Whether the virtual type is there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Presence {
    /// Served, and its CRD (if any) is not being deleted.
    Served,
    /// Gone or going, with the reason for humans.
    Gone(String),
}

/// Host copies kept because their type vanished (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Holds {
    held: HashSet<ObjectKey>,
    /// When the type was first seen served again after the last hold.
    back_since: Option<Instant>,
}

impl Holds {
    /// The type is gone: `key`'s host copy is kept.
    pub(crate) fn hold(&mut self, key: &ObjectKey) {
        self.held.insert(key.clone());
        self.back_since = None;
    }

    /// The type is served at `now`: whether `key`'s host copy, whose virtual object is missing,
    /// may be deleted (not held, or held for [`HOLD_GRACE`]-long `grace` since the type is
    /// back; then it is no longer held).
    pub(crate) fn may_delete(&mut self, key: &ObjectKey, now: Instant, grace: Duration) -> bool {
        if !self.held.contains(key) {
            return true;
        }
        let since = *self.back_since.get_or_insert(now);
        if now.saturating_duration_since(since) < grace {
            return false;
        }
        self.held.remove(key);
        true
    }

    /// The virtual object of `key` exists again: `true` when its host copy was held (adopt it
    /// instead of replacing it); it is no longer held.
    pub(crate) fn adopt(&mut self, key: &ObjectKey) -> bool {
        self.held.remove(key)
    }

    /// Number of held host copies.
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }
}

/// Asks the virtual API server whether a synced type is there, and keeps the [`Holds`].
pub(crate) struct TypeGuard {
    client: Client,
    group: String,
    version: String,
    plural: String,
    grace: Duration,
    holds: Mutex<Holds>,
    /// Whether this guard set the type's error in the statistics (cleared once served again).
    reported: AtomicBool,
}

impl TypeGuard {
    /// A guard of the virtual type `group/version` `plural`, read with `client`.
    pub(crate) fn new(client: Client, group: &str, version: &str, plural: &str) -> Self {
        Self {
            client,
            group: group.to_string(),
            version: version.to_string(),
            plural: plural.to_string(),
            grace: HOLD_GRACE,
            holds: Mutex::new(Holds::default()),
            reported: AtomicBool::new(false),
        }
    }

    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether the type is there: its CRD `<plural>.<group>` (when readable) is not being
    /// deleted, and discovery of its group version lists it.
    ///
    /// # Errors
    /// A read failed for another reason than "not found" / "forbidden" (the caller retries).
    pub(crate) async fn presence(&self) -> Result<Presence, Error> {
        let kube_error = |action: &str, source: kube::Error| Error::Kube {
            action: action.to_string(),
            source: Box::new(source),
        };
        let crd_name = format!("{}.{}", self.plural, self.group);
        if self.group.contains('.') {
            let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
            match crds.get_opt(&crd_name).await {
                Ok(Some(crd)) if crd.metadata.deletion_timestamp.is_some() => {
                    return Ok(Presence::Gone(format!(
                        "the CustomResourceDefinition {} in the virtual cluster is being deleted; \
                         host copies are kept",
                        crd.name_any()
                    )));
                }
                Ok(Some(_) | None) => {}
                Err(kube::Error::Api(status)) if status.code == 403 => {}
                Err(source) => {
                    return Err(kube_error(
                        &format!("get virtual CustomResourceDefinition {crd_name}"),
                        source,
                    ));
                }
            }
        }
        let api_version = self.api_version();
        let listed = if self.group.is_empty() {
            self.client.list_core_api_resources(&self.version).await
        } else {
            self.client.list_api_group_resources(&api_version).await
        };
        let gone = || {
            Presence::Gone(format!(
                "{} {api_version} is not served by the virtual API server; host copies are kept",
                self.plural
            ))
        };
        match listed {
            Ok(list) if list.resources.iter().any(|r| r.name == self.plural) => {
                Ok(Presence::Served)
            }
            // not listed, or the group version is not served at all (404)
            Ok(_) | Err(kube::Error::Api(_)) => Ok(gone()),
            Err(source) => Err(kube_error(
                &format!("discover {api_version} on the virtual API server"),
                source,
            )),
        }
    }

    /// Whether the host copy of `key`, whose virtual object is missing, may be deleted now
    /// (module docs); a kept copy is held and the type reported unavailable in `stats`.
    ///
    /// # Errors
    /// The type's presence cannot be read now (retried by the caller's backoff).
    pub(crate) async fn may_delete(
        &self,
        key: &ObjectKey,
        stats: &TypeStats,
    ) -> Result<bool, Error> {
        let presence = self.presence().await?;
        let Ok(mut holds) = self.holds.lock() else {
            return Ok(false);
        };
        match presence {
            Presence::Gone(reason) => {
                if holds.len() == 0 {
                    warn!(kind = %stats.kind(), %reason, "synced type vanished, keeping its host copies");
                }
                holds.hold(key);
                stats.set_type_error(Some(reason));
                self.reported.store(true, Ordering::Relaxed);
                Ok(false)
            }
            Presence::Served => {
                self.served_again(stats);
                Ok(holds.may_delete(key, Instant::now(), self.grace))
            }
        }
    }

    /// Whether the host copy of `key` was held (adopt it rather than replace it).
    pub(crate) fn adopt(&self, key: &ObjectKey, stats: &TypeStats) -> bool {
        let adopted = self.holds.lock().is_ok_and(|mut h| h.adopt(key));
        if adopted {
            self.served_again(stats);
            info!(object = %key, "adopting the host copy kept while the type was gone");
        }
        adopted
    }

    /// The type is served: the error this guard reported is cleared (a failing watch reports
    /// its own).
    fn served_again(&self, stats: &TypeStats) {
        if self.reported.swap(false, Ordering::Relaxed) {
            stats.set_type_error(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            namespace: "team".into(),
            name: name.into(),
        }
    }

    #[test]
    fn an_unheld_copy_may_be_deleted() {
        let mut holds = Holds::default();
        assert!(holds.may_delete(&key("a"), Instant::now(), HOLD_GRACE));
        assert!(!holds.adopt(&key("a")));
    }

    #[test]
    fn a_held_copy_is_kept_for_the_grace_period_after_the_type_is_back() {
        let mut holds = Holds::default();
        let t0 = Instant::now();
        holds.hold(&key("a"));
        holds.hold(&key("b"));
        let grace = Duration::from_secs(60);
        // the type is back at t0 + 10 s: the clock starts then, for every held copy
        assert!(!holds.may_delete(&key("a"), t0 + Duration::from_secs(10), grace));
        assert!(!holds.may_delete(&key("b"), t0 + Duration::from_secs(69), grace));
        assert!(holds.may_delete(&key("a"), t0 + Duration::from_secs(70), grace));
        assert_eq!(holds.len(), 1);
        // deleted once: no longer held
        assert!(holds.may_delete(&key("a"), t0 + Duration::from_secs(71), grace));
        // gone again: the clock restarts at the next return
        holds.hold(&key("c"));
        assert!(!holds.may_delete(&key("b"), t0 + Duration::from_secs(200), grace));
        assert!(holds.may_delete(&key("b"), t0 + Duration::from_secs(260), grace));
    }

    #[test]
    fn a_returning_object_adopts_its_held_copy_once() {
        let mut holds = Holds::default();
        holds.hold(&key("a"));
        assert!(holds.adopt(&key("a")));
        assert!(!holds.adopt(&key("a")));
        assert_eq!(holds.len(), 0);
    }
}

//! The runtime's own writes to host objects, so that their watch events (the echo of a write)
//! do not cause another reconcile.
//!
//! Each create or patch the runtime sends returns the object's new `resourceVersion`; the host
//! watch delivers the same object at that version, before or after the response. That event tells
//! the runtime nothing it does not learn from the response, yet it used to cost one more reconcile
//! per synced object (decompress and parse both cached objects, translate, compare). The idea is
//! client-go's "expectations", kept per host name:
//!
//! - [`OwnWrites::begin`] before a write is sent; a host watch event of that name while the
//!   write is in flight is held ([`OwnWrites::is_echo`] says `true`, the event's object still
//!   goes into the cache);
//! - [`OwnWrites::finish`] when the write returned: every event held meanwhile was at the
//!   version the API server returned → nothing more to do; an event at another version (a
//!   change by someone else right after the write) → the key must be looked at again, which
//!   the reconcile that wrote learns from [`OwnWrites::take_recheck`]; no event yet → the
//!   version is remembered, and the event that comes later at exactly that version is skipped
//!   by [`OwnWrites::is_echo`] (the record is consumed by the first event of the name either
//!   way, so any later change is reconciled as before);
//! - [`OwnWrites::behind`] at the start of each reconcile drops a remembered version the cache
//!   already holds (its event was lost to a re-listing, which reconciles every key anyway); while
//!   the cache has not yet seen the write (no event of the name since the write returned), it
//!   says so, and the reconcile waits for that event instead of sending a write guarded by a
//!   `resourceVersion` it knows is stale (a sure 409 Conflict). The event then reconciles the
//!   key even when it is the echo; after [`ECHO_WAIT`] without it, the record is dropped and the
//!   reconcile goes on as before (a 409 is retried), so no key waits for ever;
//! - a host watch event of a deleted object drops its record ([`OwnWrites::forget`]).
//!
//! Deletes are not recorded: their events lead to an empty reconcile only. Writes of one host
//! name are made by the reconcile of one virtual key, never by two workers at once
//! ([`crate::queue`]).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::Resource;

/// How long a reconcile waits for the host watch to deliver the runtime's last write of its
/// host object ([`OwnWrites::behind`]) before it goes on with the cached copy anyway. The echo
/// normally arrives within milliseconds; a watch that is re-listing delivers it later, and a
/// re-list reconciles every key.
pub(crate) const ECHO_WAIT: Duration = Duration::from_secs(5);

/// What is known of the runtime's last write to one host name.
#[derive(Debug, PartialEq, Eq)]
enum Write {
    /// Sent, no response yet; the versions of the host events seen meanwhile.
    InFlight(Vec<Option<String>>),
    /// Returned at `version` at `at`; no event of the name seen since. `awaited`: a reconcile
    /// found the cache behind this write and waits for its event ([`OwnWrites::behind`]), so
    /// that event is reconciled even when it is the echo.
    Done {
        version: String,
        at: Instant,
        awaited: bool,
    },
    /// Returned, and an event at another version arrived while it was in flight.
    Recheck,
}

/// A write in flight ([`OwnWrites::begin`]).
pub(crate) struct InFlight<'a> {
    writes: &'a OwnWrites,
    name: &'a str,
    finished: bool,
}

impl InFlight<'_> {
    /// The write returned at `version` (`None`: it failed).
    pub(crate) fn finish(mut self, version: Option<&str>) {
        self.finished = true;
        self.writes.finish(self.name, version);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.writes.finish(self.name, None);
        }
    }
}

/// Host name → the runtime's last write to it, until its echo is seen.
#[derive(Debug, Default)]
pub(crate) struct OwnWrites(Mutex<HashMap<String, Write>>);

impl OwnWrites {
    /// A write of host object `name` is about to be sent; end it with [`InFlight::finish`]. A
    /// write whose future is dropped before (the reconcile cancelled) ends as failed, so no
    /// event of `name` is held for ever.
    pub(crate) fn begin<'a>(&'a self, name: &'a str) -> InFlight<'a> {
        if let Ok(mut writes) = self.0.lock() {
            writes.insert(name.to_string(), Write::InFlight(Vec::new()));
        }
        InFlight {
            writes: self,
            name,
            finished: false,
        }
    }

    /// Sends `request`, a create or patch of host object `name`, as a tracked write:
    /// [`Self::begin`] before it, [`InFlight::finish`] with the `resourceVersion` of the object
    /// it returns (or as failed) after it. `request` must not have been sent yet (kube's
    /// requests are sent when first polled).
    pub(crate) async fn track<K: Resource>(
        &self,
        name: &str,
        request: impl Future<Output = Result<K, kube::Error>>,
    ) -> Result<K, kube::Error> {
        let write = self.begin(name);
        let result = request.await;
        write.finish(
            result
                .as_ref()
                .ok()
                .and_then(|obj| obj.meta().resource_version.as_deref()),
        );
        result
    }

    /// The write of `name` returned at `version` (`None`: it failed; the failed reconcile is
    /// retried and reads the cache again, so nothing is kept).
    fn finish(&self, name: &str, version: Option<&str>) {
        let Ok(mut writes) = self.0.lock() else {
            return;
        };
        let seen = match writes.remove(name) {
            Some(Write::InFlight(seen)) => seen,
            _ => Vec::new(),
        };
        let Some(version) = version else {
            return;
        };
        if seen.is_empty() {
            writes.insert(
                name.to_string(),
                Write::Done {
                    version: version.to_string(),
                    at: Instant::now(),
                    awaited: false,
                },
            );
        } else if seen.iter().any(|v| v.as_deref() != Some(version)) {
            writes.insert(name.to_string(), Write::Recheck);
        }
    }

    /// Whether a host watch event of `name` at `version` needs no reconcile: it is the echo of
    /// the runtime's last write (exactly the returned version) and no reconcile waits for it,
    /// or it arrived while a write was in flight (then [`Self::finish`] decides). Consumes
    /// the record of a returned write either way.
    pub(crate) fn is_echo(&self, name: &str, version: Option<&str>) -> bool {
        let Ok(mut writes) = self.0.lock() else {
            return false;
        };
        match writes.get_mut(name) {
            Some(Write::InFlight(seen)) => {
                seen.push(version.map(str::to_string));
                true
            }
            Some(Write::Done {
                version: done,
                awaited,
                ..
            }) => {
                let echo = !*awaited && version == Some(done.as_str());
                writes.remove(name);
                echo
            }
            Some(Write::Recheck) | None => false,
        }
    }

    /// Whether an event other than the echo arrived while the last write of `name` was in
    /// flight (the key must be reconciled again); consumes that mark.
    pub(crate) fn take_recheck(&self, name: &str) -> bool {
        let Ok(mut writes) = self.0.lock() else {
            return false;
        };
        if writes.get(name) == Some(&Write::Recheck) {
            writes.remove(name);
            return true;
        }
        false
    }

    /// Whether the host cache, holding `name` at `cached_version` (`None`: not at all), has not
    /// yet seen the runtime's last write of it: the write returned less than [`ECHO_WAIT`] ago
    /// and no event of the name arrived since. Then the record is marked awaited, so that the
    /// event, echo or not, reconciles the key. Otherwise a returned write's record is dropped
    /// (the cache holds its version, or it waited long enough), so records never outlive their
    /// object's next reconcile but one.
    pub(crate) fn behind(&self, name: &str, cached_version: Option<&str>) -> bool {
        let Ok(mut writes) = self.0.lock() else {
            return false;
        };
        let Some(Write::Done {
            version,
            at,
            awaited,
        }) = writes.get_mut(name)
        else {
            return false;
        };
        if cached_version == Some(version.as_str()) || at.elapsed() >= ECHO_WAIT {
            writes.remove(name);
            return false;
        }
        *awaited = true;
        true
    }

    /// The host object `name` was deleted: a returned write's record or a recheck mark goes
    /// with it (a write still in flight keeps its record; it ends with its response).
    pub(crate) fn forget(&self, name: &str) {
        let Ok(mut writes) = self.0.lock() else {
            return;
        };
        if !matches!(writes.get(name), Some(Write::InFlight(_)) | None) {
            writes.remove(name);
        }
    }

    /// Records kept (of any state).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().map(|w| w.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "audi-x-default-x-vc";

    #[test]
    fn the_echo_after_the_response_is_skipped_once() {
        let writes = OwnWrites::default();
        writes.begin(NAME).finish(Some("42"));
        assert!(!writes.is_echo("bmw-x-default-x-vc", Some("42")));
        assert!(writes.is_echo(NAME, Some("42")));
        // consumed: the next event at any version is reconciled
        assert!(!writes.is_echo(NAME, Some("42")));
        assert!(!writes.take_recheck(NAME));
        assert_eq!(writes.len(), 0);
    }

    #[test]
    fn another_version_after_the_response_is_reconciled() {
        let writes = OwnWrites::default();
        writes.begin(NAME).finish(Some("42"));
        // someone else's change overtook the echo in the watch: reconciled, record consumed
        assert!(!writes.is_echo(NAME, Some("43")));
        assert!(!writes.is_echo(NAME, Some("42")));
        assert_eq!(writes.len(), 0);
    }

    #[test]
    fn the_echo_before_the_response_is_held_and_settled_by_the_response() {
        let writes = OwnWrites::default();
        let write = writes.begin(NAME);
        assert!(writes.is_echo(NAME, Some("42")));
        write.finish(Some("42"));
        assert!(!writes.take_recheck(NAME));
        assert_eq!(writes.len(), 0);
        assert!(!writes.is_echo(NAME, Some("43")));
    }

    #[test]
    fn another_change_while_in_flight_asks_for_a_recheck() {
        let writes = OwnWrites::default();
        let write = writes.begin(NAME);
        assert!(writes.is_echo(NAME, Some("42")));
        assert!(writes.is_echo(NAME, Some("43"))); // held too: the writer decides
        write.finish(Some("42"));
        assert!(writes.take_recheck(NAME));
        assert!(!writes.take_recheck(NAME));
        assert_eq!(writes.len(), 0);
    }

    #[test]
    fn a_failed_write_keeps_nothing() {
        let writes = OwnWrites::default();
        let write = writes.begin(NAME);
        assert!(writes.is_echo(NAME, Some("42"))); // someone else's object: the write got 409
        write.finish(None);
        assert_eq!(writes.len(), 0);
        assert!(!writes.is_echo(NAME, Some("42")));
    }

    #[test]
    fn a_cancelled_write_holds_no_later_event() {
        let writes = OwnWrites::default();
        drop(writes.begin(NAME));
        assert_eq!(writes.len(), 0);
        assert!(!writes.is_echo(NAME, Some("42")));
    }

    #[test]
    fn no_version_is_never_an_echo() {
        let writes = OwnWrites::default();
        writes.begin(NAME).finish(Some("7"));
        assert!(!writes.is_echo(NAME, None));
    }

    #[test]
    fn a_version_the_cache_holds_already_is_settled() {
        let writes = OwnWrites::default();
        writes.begin(NAME).finish(Some("7"));
        assert!(!writes.behind(NAME, Some("7")));
        assert_eq!(writes.len(), 0);
        assert!(!writes.behind(NAME, Some("6")));
    }

    #[test]
    fn a_cache_without_the_write_is_behind_until_an_event_of_the_name() {
        let writes = OwnWrites::default();
        writes.begin(NAME).finish(Some("7"));
        // the cache still holds the version the write was guarded by, or no object at all
        assert!(writes.behind(NAME, Some("6")));
        assert!(writes.behind(NAME, None));
        assert!(!writes.behind("bmw-x-default-x-vc", Some("6")));
        // the echo arrives: a reconcile waits for it, so it is not skipped
        assert!(!writes.is_echo(NAME, Some("7")));
        assert!(!writes.behind(NAME, Some("7")));
        assert_eq!(writes.len(), 0);
    }

    #[test]
    fn an_echo_nobody_waits_for_is_still_skipped() {
        let writes = OwnWrites::default();
        writes.begin(NAME).finish(Some("7"));
        assert!(writes.is_echo(NAME, Some("7")));
        assert!(!writes.behind(NAME, Some("7")));
    }

    #[test]
    fn a_cache_behind_for_longer_than_the_echo_wait_is_given_up() {
        let writes = OwnWrites::default();
        writes.begin(NAME).finish(Some("7"));
        if let Ok(mut map) = writes.0.lock()
            && let Some(Write::Done { at, .. }) = map.get_mut(NAME)
        {
            *at -= ECHO_WAIT;
        }
        assert!(!writes.behind(NAME, Some("6")));
        assert_eq!(writes.len(), 0);
    }

    #[test]
    fn a_deleted_object_drops_its_record_but_not_a_write_in_flight() {
        let writes = OwnWrites::default();
        writes.begin(NAME).finish(Some("7"));
        writes.forget(NAME);
        assert_eq!(writes.len(), 0);
        assert!(!writes.behind(NAME, None));
        let write = writes.begin(NAME);
        writes.forget(NAME);
        assert_eq!(writes.len(), 1);
        write.finish(Some("8"));
        assert!(writes.behind(NAME, None));
    }
}

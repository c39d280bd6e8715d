//! The connection cap of [`serve`](super::serve): at most `max` connections open, and a
//! connection accepted over the cap makes room by closing the oldest one that has not sent its
//! whole request head yet (module docs of [`super`], "Bounds").
//!
//! Why the oldest *waiting* one: a probe or a scrape sends its head as soon as it connects and
//! is served within milliseconds, so it waits only briefly; the connections that wait long are
//! the ones that send slowly or nothing at all. Closing those first keeps a flood of them from
//! locking out the kubelet's probes, which a plain cap (refuse when full) would not.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::Stats;

/// One open connection in the table.
struct Entry {
    /// Its request head is complete and it is being served: never evicted.
    serving: bool,
    /// Notified when the connection is evicted.
    evict: Arc<Notify>,
}

/// The open connections, oldest first (ids grow with each accept).
#[derive(Default)]
struct Table {
    next: u64,
    open: BTreeMap<u64, Entry>,
}

/// The connection cap of one server.
pub(super) struct Slots {
    table: Arc<Mutex<Table>>,
    max: usize,
    stats: Stats,
}

/// The outcome of [`Slots::admit`].
pub(super) enum Admission {
    /// The connection may be served; dropping the slot frees it.
    Admitted(Slot),
    /// Every open connection is being served: close the new one.
    Refused,
}

/// A connection's place under the cap; freed when dropped.
pub(super) struct Slot {
    id: u64,
    evict: Arc<Notify>,
    table: Arc<Mutex<Table>>,
    stats: Stats,
}

fn locked(table: &Mutex<Table>) -> MutexGuard<'_, Table> {
    // A panic while the lock was held leaves a table that is still consistent (each step is
    // one map operation), so a poisoned lock is used as it is.
    table.lock().unwrap_or_else(|e| e.into_inner())
}

impl Slots {
    /// A cap of `max` connections (at least 1), counted in `stats`.
    pub(super) fn new(max: usize, stats: Stats) -> Self {
        Slots {
            table: Arc::default(),
            max: max.max(1),
            stats,
        }
    }

    /// A slot for a connection just accepted: free, or made by evicting the oldest connection
    /// still waiting for its head (counted in `evicted`); [`Admission::Refused`] (counted in
    /// `refused`) when every open connection is being served.
    pub(super) fn admit(&self) -> Admission {
        let mut table = locked(&self.table);
        if table.open.len() >= self.max {
            let oldest_waiting = table
                .open
                .iter()
                .find(|(_, e)| !e.serving)
                .map(|(id, _)| *id);
            match oldest_waiting.and_then(|id| table.open.remove(&id)) {
                Some(victim) => {
                    victim.evict.notify_one();
                    self.stats.evicted.inc();
                }
                None => {
                    self.stats.refused.inc();
                    return Admission::Refused;
                }
            }
        }
        let id = table.next;
        table.next += 1;
        let evict = Arc::new(Notify::new());
        table.open.insert(
            id,
            Entry {
                serving: false,
                evict: evict.clone(),
            },
        );
        self.stats.open.set(gauge_value(table.open.len()));
        Admission::Admitted(Slot {
            id,
            evict,
            table: self.table.clone(),
            stats: self.stats.clone(),
        })
    }

    /// Connections open now.
    #[cfg(test)]
    pub(super) fn open(&self) -> usize {
        locked(&self.table).open.len()
    }
}

impl Slot {
    /// The connection's head is complete: it is being served and is no longer evicted.
    pub(super) fn serving(&self) {
        if let Some(e) = locked(&self.table).open.get_mut(&self.id) {
            e.serving = true;
        }
    }

    /// Completes when the connection is evicted (the serving task then drops it).
    pub(super) fn evicted(&self) -> impl Future<Output = ()> + Send + 'static {
        let evict = self.evict.clone();
        async move { evict.notified().await }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = locked(&self.table);
        table.open.remove(&self.id);
        self.stats.open.set(gauge_value(table.open.len()));
    }
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(slots: &Slots) -> Slot {
        match slots.admit() {
            Admission::Admitted(s) => s,
            Admission::Refused => panic!("refused"),
        }
    }

    #[test]
    fn over_the_cap_the_oldest_waiting_connection_makes_room() {
        let stats = Stats::default();
        let slots = Slots::new(3, stats.clone());
        let first = admitted(&slots);
        let second = admitted(&slots);
        let third = admitted(&slots);
        first.serving();
        assert_eq!(slots.open(), 3);
        // The fourth evicts the oldest *waiting* one: the second (the first is being served).
        let fourth = admitted(&slots);
        assert_eq!(slots.open(), 3);
        assert_eq!(stats.evicted.get(), 1);
        assert_eq!(stats.open.get(), 3);
        let evicted_second = second.evicted();
        let evicted_third = third.evicted();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(1), evicted_second)
                .await
                .expect("the second connection is told to close");
            assert!(
                tokio::time::timeout(std::time::Duration::from_millis(50), evicted_third)
                    .await
                    .is_err(),
                "the third (newer) connection stays"
            );
        });
        drop(second);
        assert_eq!(slots.open(), 3, "an evicted slot was already freed");
        drop((first, third, fourth));
        assert_eq!(slots.open(), 0);
        assert_eq!(stats.open.get(), 0);
    }

    #[test]
    fn when_every_connection_is_served_the_new_one_is_refused() {
        let stats = Stats::default();
        let slots = Slots::new(2, stats.clone());
        let a = admitted(&slots);
        let b = admitted(&slots);
        a.serving();
        b.serving();
        assert!(matches!(slots.admit(), Admission::Refused));
        assert_eq!(stats.refused.get(), 1);
        assert_eq!(stats.evicted.get(), 0);
        drop(a);
        let _c = admitted(&slots);
        assert_eq!(slots.open(), 2);
    }
}

//! The connection cap of [`serve`](super::serve): at most `max` connections open, and a
//! connection accepted over the cap makes room by closing one that has not sent its whole
//! request head yet: the oldest waiting one of the peer (source IP) that holds the most waiting
//! connections (module docs of [`super`], "Bounds").
//!
//! Why a *waiting* one: a probe or a scrape sends its head as soon as it connects and is served
//! within milliseconds, so it waits only briefly; the connections that wait long are the ones
//! that send slowly or nothing at all. Closing those first keeps a flood of them from locking out
//! the kubelet's probes, which a plain cap (refuse when full) would not.
//!
//! Why the *busiest peer's*: a flood from one pod opens connections faster than a busy node
//! polls a probe's freshly accepted connection, so "the oldest waiting one" alone can be the
//! probe's, closed before its head is read (seen under load: the API server's proxy answered
//! `server closed idle connection`). The flood's own connections outnumber a probe's, so they
//! are closed first; only clients behind one address (NAT) share one another's fate.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::Stats;

/// One open connection in the table.
struct Entry {
    /// The address the connection came from.
    peer: IpAddr,
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

    /// A slot for a connection just accepted from `peer`: free, or made by evicting a
    /// connection still waiting for its head ([`victim`], counted in `evicted`);
    /// [`Admission::Refused`] (counted in `refused`) when every open connection is being served.
    pub(super) fn admit(&self, peer: IpAddr) -> Admission {
        let mut table = locked(&self.table);
        if table.open.len() >= self.max {
            match victim(&table.open).and_then(|id| table.open.remove(&id)) {
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
                peer: peer.to_canonical(),
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

/// The connection to close to make room: among those still waiting for their heads, the oldest
/// of the peer that has the most of them (a tie goes to the peer whose oldest waiting connection
/// is older). `None` when every open connection is being served.
fn victim(open: &BTreeMap<u64, Entry>) -> Option<u64> {
    // per peer: (waiting connections, its oldest waiting connection's id)
    let mut per_peer: HashMap<IpAddr, (usize, u64)> = HashMap::new();
    for (id, e) in open.iter().filter(|(_, e)| !e.serving) {
        per_peer
            .entry(e.peer)
            .and_modify(|(n, _)| *n += 1)
            .or_insert((1, *id));
    }
    per_peer
        .into_values()
        .max_by(|(n_a, oldest_a), (n_b, oldest_b)| n_a.cmp(n_b).then(oldest_b.cmp(oldest_a)))
        .map(|(_, oldest)| oldest)
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOOD: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 66));
    const KUBELET: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));

    fn admitted(slots: &Slots) -> Slot {
        admitted_from(slots, FLOOD)
    }

    fn admitted_from(slots: &Slots, peer: IpAddr) -> Slot {
        match slots.admit(peer) {
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
        assert!(
            is_evicted(&second),
            "the second connection is told to close"
        );
        assert!(!is_evicted(&third), "the third (newer) connection stays");
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
        assert!(matches!(slots.admit(FLOOD), Admission::Refused));
        assert_eq!(stats.refused.get(), 1);
        assert_eq!(stats.evicted.get(), 0);
        drop(a);
        let _c = admitted(&slots);
        assert_eq!(slots.open(), 2);
    }

    /// Whether `slot` has been told to close (within 50 ms).
    fn is_evicted(slot: &Slot) -> bool {
        let evicted = slot.evicted();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_millis(50), evicted)
                .await
                .is_ok()
        })
    }

    #[test]
    fn a_flood_from_one_peer_pushes_out_its_own_and_not_a_probe_waiting_for_its_head() {
        let stats = Stats::default();
        let slots = Slots::new(4, stats.clone());
        let mut flood: Vec<Slot> = (0..3).map(|_| admitted(&slots)).collect();
        // the probe's connection is accepted but its head is not read yet
        let probe = admitted_from(&slots, KUBELET);
        // 20 more from the flood: each closes the flood's oldest waiting connection
        for _ in 0..20 {
            flood.push(admitted(&slots));
        }
        assert_eq!(stats.evicted.get(), 20);
        assert!(!is_evicted(&probe), "the probe's connection was closed");
        assert_eq!(
            flood.iter().filter(|s| is_evicted(s)).count(),
            20,
            "the flood's oldest were closed"
        );
        assert!(!is_evicted(flood.last().unwrap()));
        // The IPv4-mapped IPv6 form of an address is the same peer.
        let mapped = match KUBELET {
            IpAddr::V4(v4) => IpAddr::V6(v4.to_ipv6_mapped()),
            IpAddr::V6(_) => unreachable!(),
        };
        drop(flood);
        let slots = Slots::new(3, Stats::default());
        let a = admitted_from(&slots, FLOOD);
        let b = admitted_from(&slots, KUBELET);
        let c = admitted_from(&slots, mapped);
        // b and c are one peer holding two (as two peers of one each, the oldest, a, would go)
        let _d = admitted_from(&slots, FLOOD);
        assert!(is_evicted(&b), "the peer holding two loses its oldest");
        assert!(!is_evicted(&a) && !is_evicted(&c));
    }

    #[test]
    fn between_peers_holding_as_many_the_oldest_waiting_connection_goes() {
        let slots = Slots::new(2, Stats::default());
        let a = admitted_from(&slots, KUBELET);
        let b = admitted_from(&slots, FLOOD);
        let _c = admitted_from(&slots, FLOOD);
        assert!(is_evicted(&a), "one each: the oldest, a, goes");
        assert!(!is_evicted(&b));
    }
}

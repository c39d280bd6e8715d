//! A deduplicating work queue of object keys with per-key retry backoff, safe for several
//! concurrent workers: a key is never handed to two workers at once (a key pushed while it is
//! being processed is handed out again once [`WorkReceiver::done`] is called for it), as in
//! client-go's workqueue. A key that failed is held for its backoff: pushes of it (watch events,
//! resyncs) are absorbed until the backoff expires, so a failing key is retried at the backoff's
//! pace however many events arrive.
//!
//! Two lanes: a key marked slow ([`WorkQueue::set_slow`]: its last reconcile took
//! [`SLOW_RECONCILE`] or more, such as an object whose expressions run into their bound) is
//! handed only to the workers of the slow lane ([`WorkReceiver::next_slow`]), so that expensive
//! objects wait behind each other and not in front of the cheap ones (ten heavy objects once
//! held up a type's creates and deletes).

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use tokio::sync::mpsc;

/// Shortest delay before a failed key is retried.
const MIN_BACKOFF: Duration = Duration::from_millis(200);
/// Longest delay before a failed key is retried.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A reconcile that takes this long or longer puts its key in the slow lane until a reconcile
/// of it takes less (half an object's expression budget, `patches::OBJECT_BUDGET_FACTOR` ×
/// 100 ms; an ordinary reconcile takes a few milliseconds to tens of them).
pub(crate) const SLOW_RECONCILE: Duration = Duration::from_millis(500);

/// The per-key retry delays: [`MIN_BACKOFF`] doubling up to [`MAX_BACKOFF`], no jitter, never
/// giving up (the same crate and shape as the watch retries of [`crate::retry`]).
fn backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(MIN_BACKOFF)
        .with_max_delay(MAX_BACKOFF)
        .with_factor(2.0)
        .without_max_times()
}

/// The sending side: cheap to clone, pushes are deduplicated while a key is queued.
///
/// A queued key is held once, as an `Arc` shared by the set of queued keys and the channel
/// (a full resync queues every synced object at once: 50,000 keys at the bench's largest
/// size, each a namespace and a name).
pub(crate) struct WorkQueue<K> {
    tx: Lanes<K>,
    state: Arc<Mutex<State<K>>>,
}

/// The senders of the two lanes.
struct Lanes<K> {
    fast: mpsc::UnboundedSender<Arc<K>>,
    slow: mpsc::UnboundedSender<Arc<K>>,
}

impl<K> Clone for Lanes<K> {
    fn clone(&self) -> Self {
        Self {
            fast: self.fast.clone(),
            slow: self.slow.clone(),
        }
    }
}

impl<K> Lanes<K> {
    fn send(&self, key: Arc<K>, slow: bool) {
        let _ = if slow { &self.slow } else { &self.fast }.send(key);
    }

    fn is_closed(&self) -> bool {
        self.fast.is_closed()
    }
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            state: self.state.clone(),
        }
    }
}

struct State<K> {
    /// Keys waiting to be handed out (or to be handed out again once done).
    queued: HashSet<Arc<K>>,
    /// Keys a worker holds right now.
    processing: HashSet<Arc<K>>,
    /// The backoff of each failing key (its next delay), until it is forgotten.
    failures: HashMap<K, ExponentialBackoff>,
    /// Keys in backoff, and when it ends: pushed only by the delayed retry until then.
    held_until: HashMap<K, Instant>,
    /// Keys of the slow lane ([`WorkQueue::set_slow`]).
    slow: HashSet<K>,
}

/// The receiving side, shared by the workers.
pub(crate) struct WorkReceiver<K> {
    rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<Arc<K>>>,
    slow_rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<Arc<K>>>,
    tx: Lanes<K>,
    state: Arc<Mutex<State<K>>>,
}

/// A new queue.
pub(crate) fn work_queue<K: Eq + Hash + Clone>() -> (WorkQueue<K>, WorkReceiver<K>) {
    let (fast, rx) = mpsc::unbounded_channel();
    let (slow, slow_rx) = mpsc::unbounded_channel();
    let tx = Lanes { fast, slow };
    let state = Arc::new(Mutex::new(State {
        queued: HashSet::new(),
        processing: HashSet::new(),
        failures: HashMap::new(),
        held_until: HashMap::new(),
        slow: HashSet::new(),
    }));
    (
        WorkQueue {
            tx: tx.clone(),
            state: state.clone(),
        },
        WorkReceiver {
            rx: tokio::sync::Mutex::new(rx),
            slow_rx: tokio::sync::Mutex::new(slow_rx),
            tx,
            state,
        },
    )
}

impl<K: Eq + Hash + Clone + Send + Sync + 'static> WorkQueue<K> {
    /// Queues `key` unless it is already queued or held in its retry backoff (the retry
    /// queues it when the backoff ends); a key being processed is queued again when its
    /// worker is done.
    pub(crate) fn push(&self, key: K) {
        let send = self
            .state
            .lock()
            .map(|mut s| {
                if s.held_until
                    .get(&key)
                    .is_some_and(|end| *end > Instant::now())
                {
                    return None;
                }
                s.held_until.remove(&key);
                if s.queued.contains(&key) {
                    return None;
                }
                let slow = s.slow.contains(&key);
                let key = Arc::new(key);
                s.queued.insert(key.clone());
                (!s.processing.contains(&*key)).then_some((key, slow))
            })
            .ok()
            .flatten();
        if let Some((key, slow)) = send {
            self.tx.send(key, slow);
        }
    }

    /// Puts `key` in the slow lane (`true`) or back in the fast one, from its next hand-out
    /// on.
    pub(crate) fn set_slow(&self, key: &K, slow: bool) {
        if let Ok(mut s) = self.state.lock() {
            if slow {
                s.slow.insert(key.clone());
            } else {
                s.slow.remove(key);
            }
        }
    }

    /// Records a failure of `key` and queues it again after an exponential backoff
    /// (200 ms doubling up to 30 s). Until then the key is held: a push made meanwhile,
    /// including one made while the failed attempt ran, does not hand it out earlier.
    pub(crate) fn retry(&self, key: K) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        let delay = s
            .failures
            .entry(key.clone())
            .or_insert_with(|| backoff().build())
            .next()
            .unwrap_or(MAX_BACKOFF);
        s.queued.remove(&key);
        s.held_until.insert(key.clone(), Instant::now() + delay);
        drop(s);
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Ok(mut s) = queue.state.lock() {
                s.held_until.remove(&key);
            }
            if !queue.tx.is_closed() {
                queue.push(key);
            }
        });
    }

    /// Queues `key` after `delay`.
    pub(crate) fn push_after(&self, key: K, delay: Duration) {
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if !queue.tx.is_closed() {
                queue.push(key);
            }
        });
    }

    /// Forgets the failures of `key` (it succeeded).
    pub(crate) fn forget(&self, key: &K) {
        if let Ok(mut s) = self.state.lock() {
            s.failures.remove(key);
            s.held_until.remove(key);
        }
    }
}

impl<K: Eq + Hash + Clone> WorkReceiver<K> {
    /// The next key of the fast lane, which the caller then holds until [`Self::done`]; `None`
    /// when every sender is gone.
    pub(crate) async fn next(&self) -> Option<K> {
        let key = self.rx.lock().await.recv().await?;
        Some(self.take(key))
    }

    /// The next key of the slow lane ([`WorkQueue::set_slow`]), as [`Self::next`].
    pub(crate) async fn next_slow(&self) -> Option<K> {
        let key = self.slow_rx.lock().await.recv().await?;
        Some(self.take(key))
    }

    fn take(&self, key: Arc<K>) -> K {
        if let Ok(mut s) = self.state.lock() {
            s.queued.remove(&*key);
            s.processing.insert(key.clone());
        }
        (*key).clone()
    }

    /// The worker is done with `key`; when it was pushed meanwhile it is handed out again.
    pub(crate) fn done(&self, key: &K) {
        let again = self.state.lock().ok().and_then(|mut s| {
            s.processing.remove(key);
            let slow = s.slow.contains(key);
            s.queued.get(key).cloned().map(|key| (key, slow))
        });
        if let Some((key, slow)) = again {
            self.tx.send(key, slow);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pushes_are_deduplicated_while_queued() {
        let (queue, receiver) = work_queue::<&'static str>();
        queue.push("a");
        queue.push("b");
        queue.push("a");
        assert_eq!(receiver.next().await, Some("a"));
        receiver.done(&"a");
        // once taken, the key can be queued again
        queue.push("a");
        assert_eq!(receiver.next().await, Some("b"));
        receiver.done(&"b");
        assert_eq!(receiver.next().await, Some("a"));
        receiver.done(&"a");
        drop(queue);
        // the receiver keeps a sender for re-queues, so check emptiness instead of the end
        assert!(receiver.rx.lock().await.is_empty());
    }

    #[tokio::test]
    async fn a_key_in_progress_is_not_handed_out_twice() {
        let (queue, receiver) = work_queue::<&'static str>();
        queue.push("k");
        assert_eq!(receiver.next().await, Some("k"));
        // pushed while a worker holds it: not handed out until done
        queue.push("k");
        queue.push("k");
        queue.push("other");
        assert_eq!(receiver.next().await, Some("other"));
        assert!(receiver.rx.lock().await.is_empty());
        receiver.done(&"k");
        assert_eq!(receiver.next().await, Some("k"));
        receiver.done(&"k");
        assert!(receiver.rx.lock().await.is_empty());
    }

    #[tokio::test]
    async fn a_slow_key_goes_to_the_slow_lane_only_until_it_is_fast_again() {
        let (queue, receiver) = work_queue::<&'static str>();
        queue.set_slow(&"heavy", true);
        queue.push("heavy");
        queue.push("light");
        // the fast lane does not see the slow key
        assert_eq!(receiver.next().await, Some("light"));
        receiver.done(&"light");
        assert!(receiver.rx.lock().await.is_empty());
        assert_eq!(receiver.next_slow().await, Some("heavy"));
        // pushed while processed, and fast again: handed out again in the fast lane
        queue.push("heavy");
        queue.set_slow(&"heavy", false);
        receiver.done(&"heavy");
        assert_eq!(receiver.next().await, Some("heavy"));
        receiver.done(&"heavy");
        assert!(receiver.slow_rx.lock().await.is_empty());
    }

    #[test]
    fn retry_delays_double_from_200_ms_up_to_30_s() {
        let delays: Vec<u128> = backoff().build().take(10).map(|d| d.as_millis()).collect();
        assert_eq!(
            delays,
            [200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]
        );
    }

    #[tokio::test]
    async fn retries_back_off_and_forget_resets() {
        let (queue, receiver) = work_queue::<&'static str>();
        let start = tokio::time::Instant::now();
        queue.retry("k");
        assert_eq!(receiver.next().await, Some("k"));
        receiver.done(&"k");
        assert!(start.elapsed() >= MIN_BACKOFF);
        let second = tokio::time::Instant::now();
        queue.retry("k");
        assert_eq!(receiver.next().await, Some("k"));
        receiver.done(&"k");
        assert!(
            second.elapsed() >= MIN_BACKOFF * 2,
            "{:?}",
            second.elapsed()
        );
        // a push during the backoff (a watch event) does not cut it short, not even one made
        // while the failed attempt ran
        queue.push("k");
        assert_eq!(receiver.next().await, Some("k"));
        queue.push("k");
        queue.retry("k");
        receiver.done(&"k");
        let held = tokio::time::Instant::now();
        queue.push("k");
        assert_eq!(receiver.next().await, Some("k"));
        receiver.done(&"k");
        assert!(held.elapsed() >= MIN_BACKOFF * 3, "{:?}", held.elapsed());
        queue.forget(&"k");
        let third = tokio::time::Instant::now();
        queue.retry("k");
        assert_eq!(receiver.next().await, Some("k"));
        assert!(third.elapsed() < MIN_BACKOFF * 2);
    }
}

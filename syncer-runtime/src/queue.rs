//! A deduplicating work queue of object keys with per-key retry backoff.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

/// Shortest delay before a failed key is retried.
const MIN_BACKOFF: Duration = Duration::from_millis(200);
/// Longest delay before a failed key is retried.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The sending side: cheap to clone, pushes are deduplicated while a key is queued.
pub(crate) struct WorkQueue<K> {
    tx: mpsc::UnboundedSender<K>,
    state: Arc<Mutex<State<K>>>,
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
    queued: HashSet<K>,
    failures: HashMap<K, u32>,
}

/// The receiving side, owned by the worker.
pub(crate) struct WorkReceiver<K> {
    rx: mpsc::UnboundedReceiver<K>,
    state: Arc<Mutex<State<K>>>,
}

/// A new queue.
pub(crate) fn work_queue<K: Eq + Hash + Clone>() -> (WorkQueue<K>, WorkReceiver<K>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let state = Arc::new(Mutex::new(State {
        queued: HashSet::new(),
        failures: HashMap::new(),
    }));
    (
        WorkQueue {
            tx,
            state: state.clone(),
        },
        WorkReceiver { rx, state },
    )
}

impl<K: Eq + Hash + Clone + Send + 'static> WorkQueue<K> {
    /// Queues `key` unless it is already queued.
    pub(crate) fn push(&self, key: K) {
        let fresh = self
            .state
            .lock()
            .map(|mut s| s.queued.insert(key.clone()))
            .unwrap_or(false);
        if fresh {
            let _ = self.tx.send(key);
        }
    }

    /// Records a failure of `key` and queues it again after an exponential backoff
    /// (200 ms doubling up to 30 s).
    pub(crate) fn retry(&self, key: K) {
        let attempts = self
            .state
            .lock()
            .map(|mut s| {
                let n = s.failures.entry(key.clone()).or_insert(0);
                *n = n.saturating_add(1);
                *n
            })
            .unwrap_or(1);
        let delay = MIN_BACKOFF
            .saturating_mul(2u32.saturating_pow(attempts.saturating_sub(1).min(16)))
            .min(MAX_BACKOFF);
        self.push_after(key, delay);
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
        }
    }
}

impl<K: Eq + Hash + Clone> WorkReceiver<K> {
    /// The next key; `None` when every sender is gone.
    pub(crate) async fn next(&mut self) -> Option<K> {
        let key = self.rx.recv().await?;
        if let Ok(mut s) = self.state.lock() {
            s.queued.remove(&key);
        }
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pushes_are_deduplicated_while_queued() {
        let (queue, mut receiver) = work_queue::<&'static str>();
        queue.push("a");
        queue.push("b");
        queue.push("a");
        assert_eq!(receiver.next().await, Some("a"));
        // once taken, the key can be queued again
        queue.push("a");
        assert_eq!(receiver.next().await, Some("b"));
        assert_eq!(receiver.next().await, Some("a"));
        drop(queue);
        assert_eq!(receiver.next().await, None);
    }

    #[tokio::test]
    async fn retries_back_off_and_forget_resets() {
        let (queue, mut receiver) = work_queue::<&'static str>();
        let start = tokio::time::Instant::now();
        queue.retry("k");
        assert_eq!(receiver.next().await, Some("k"));
        assert!(start.elapsed() >= MIN_BACKOFF);
        let second = tokio::time::Instant::now();
        queue.retry("k");
        assert_eq!(receiver.next().await, Some("k"));
        assert!(
            second.elapsed() >= MIN_BACKOFF * 2,
            "{:?}",
            second.elapsed()
        );
        queue.forget(&"k");
        let third = tokio::time::Instant::now();
        queue.retry("k");
        assert_eq!(receiver.next().await, Some("k"));
        assert!(third.elapsed() < MIN_BACKOFF * 2);
    }
}

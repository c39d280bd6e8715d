//! `/metrics` rendered at most once per interval, shared by the requests that waited for it
//! (module docs of [`super`], "Bounds").
//!
//! A scrape's answer must say what the process counted by the time the scrape was asked for:
//! an answer is therefore never a copy rendered before its request arrived. Requests that
//! arrive while a render is due share the next one, so a flood of `GET /metrics` costs at most
//! one render per interval however many connections send it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use super::{Answer, Stats};

/// The render pacing of one server.
pub(super) struct Paced {
    interval: Duration,
    max_waiters: usize,
    waiting: AtomicUsize,
    /// When the last render started, and its answer.
    last: Mutex<Option<(Instant, Answer)>>,
    stats: Stats,
}

/// Takes one back from the count of waiting requests when dropped (a request whose connection
/// closed while it waited is not counted any longer).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Paced {
    /// At most one render per `interval`; at most `max_waiters` requests (at least 1) waiting.
    pub(super) fn new(interval: Duration, max_waiters: usize, stats: Stats) -> Self {
        Paced {
            interval,
            max_waiters: max_waiters.max(1),
            waiting: AtomicUsize::new(0),
            last: Mutex::new(None),
            stats,
        }
    }

    /// The answer of a render that started after this call: the last one if it did, else a new
    /// one made by `render` once `interval` has passed since the last started. `429` at once
    /// when `max_waiters` requests wait already.
    pub(super) async fn render(&self, render: impl FnOnce() -> Answer) -> Answer {
        let arrived = Instant::now();
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.max_waiters {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            self.stats.throttled.inc();
            return Answer::too_many_requests();
        }
        let _waiting = Waiting(&self.waiting);
        // tokio's Mutex is fair: requests take it in the order they came.
        let mut last = self.last.lock().await;
        if let Some((started, answer)) = &*last {
            // Strictly after: a render that started at the very instant the request arrived
            // may not have seen what the process counted by then.
            if *started > arrived {
                return answer.clone();
            }
            tokio::time::sleep_until(*started + self.interval).await;
        }
        let started = Instant::now();
        let answer = render();
        self.stats.renders.inc();
        *last = Some((started, answer.clone()));
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;

    /// A render that answers the value of `state` when it runs.
    fn render_of(state: &Arc<AtomicU64>) -> impl FnOnce() -> Answer + use<> {
        let state = state.clone();
        move || Answer::ok("text/plain", state.load(Ordering::SeqCst).to_string())
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_is_rendered_after_its_request_and_renders_are_spaced() {
        let stats = Stats::default();
        let paced = Paced::new(Duration::from_millis(100), 8, stats.clone());
        let state = Arc::new(AtomicU64::new(0));
        let began = Instant::now();
        for i in 1..=5u64 {
            state.store(i, Ordering::SeqCst);
            let answer = paced.render(render_of(&state)).await;
            // what the process counted before the request was asked for is in the answer
            assert_eq!(answer.body, i.to_string());
        }
        assert_eq!(stats.renders.get(), 5);
        // five renders, each at least 100 ms after the one before
        assert!(
            began.elapsed() >= Duration::from_millis(400),
            "{:?}",
            began.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn requests_that_wait_together_share_one_render() {
        let stats = Stats::default();
        let paced = Arc::new(Paced::new(Duration::from_millis(100), 16, stats.clone()));
        let state = Arc::new(AtomicU64::new(1));
        // a first render: the next is due 100 ms later
        paced.render(render_of(&state)).await;
        state.store(2, Ordering::SeqCst);
        let waiters: Vec<_> = (0..10)
            .map(|_| {
                let paced = paced.clone();
                let render = render_of(&state);
                tokio::spawn(async move { paced.render(render).await })
            })
            .collect();
        for w in waiters {
            assert_eq!(w.await.unwrap().body, "2");
        }
        assert_eq!(
            stats.renders.get(),
            2,
            "ten waiting requests shared one render"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn over_the_waiters_budget_a_request_is_answered_429_at_once() {
        let stats = Stats::default();
        let paced = Arc::new(Paced::new(Duration::from_secs(1), 2, stats.clone()));
        let state = Arc::new(AtomicU64::new(1));
        paced.render(render_of(&state)).await;
        // two requests now wait for the next render, due a second later
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let paced = paced.clone();
                let render = render_of(&state);
                tokio::spawn(async move { paced.render(render).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let third = paced.render(render_of(&state)).await;
        assert_eq!(third.status, super::super::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(stats.throttled.get(), 1);
        for w in waiters {
            assert_eq!(w.await.unwrap().status, super::super::StatusCode::OK);
        }
        // the waiters left: one more is served again
        let again = paced.render(render_of(&state)).await;
        assert_eq!(again.status, super::super::StatusCode::OK);
    }
}

//! The expression evaluations of one runtime that are running now, and those of them that
//! run past their time bound (pure: a clock reading is passed in; no I/O).
//!
//! An evaluation is stopped by the interrupt handler within microseconds of its deadline
//! ([`super::expression`]), except inside one native call, which runs to its end whatever the
//! bound: each such evaluation keeps an OS thread of the blocking pool busy, and its evaluation
//! slot ([`super::EVALUATION_SLOTS`], [`Evaluations::slot`]), and a spec edit, which restarts the syncers, starts new
//! evaluations while the old ones still run (the fourth attacker's threads piled up, and the
//! plugin stayed `RuntimeHealthy=True` with no Event). So:
//!
//! - an evaluation still running after [`OVERRUN_FACTOR`] times its time bound is
//!   *overrunning* ([`Evaluations::overrunning`]): the runtime reports it in `RuntimeHealthy`
//!   (reason `PatchFailed`, [`crate::status::with_overrunning`]) and once as a `Warning` Event
//!   ([`Evaluations::announce`]);
//! - while [`MAX_OVERRUNNING`] evaluations of the runtime are overrunning, every new one is
//!   refused at once ([`Evaluations::admit`], [`Evaluations::start`]) with a [`Refusal`], before
//!   any thread is taken: its object fails its patch (`PatchFailed`, retried with backoff) as
//!   for any other failing expression.
//!
//! One [`Evaluations`] is shared by every synced type and every generation of the plugin's
//! spec of a runtime ([`crate::Config::evaluations`]), so the bound holds across spec edits.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;

/// How many evaluations of one runtime may be overrunning at once (2): each holds a thread
/// (and a core, inside a busy native call) until its call returns; past this, new evaluations
/// are refused instead of taking a thread more.
pub const MAX_OVERRUNNING: usize = 2;

/// How many times its time bound an evaluation runs before it counts as overrunning (2):
/// the interrupt handler stops a script within microseconds of its deadline, so one still
/// running at twice its bound is inside one native call.
pub const OVERRUN_FACTOR: u32 = 2;

/// What is known of one running evaluation.
#[derive(Clone, Debug)]
struct Running {
    /// `<apiVersion> <kind> <namespace>/<name>: patch "<path>" (<what>) at <location>`.
    what: String,
    /// The object evaluated (the Event's related object).
    related: Option<ObjectReference>,
    started: Instant,
    bound: Duration,
    announced: bool,
}

impl Running {
    fn overrunning(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.started) > self.bound * OVERRUN_FACTOR
    }
}

/// An evaluation running past its time bound.
#[derive(Clone, Debug, PartialEq)]
pub struct Overrun {
    /// `<apiVersion> <kind> <namespace>/<name>: patch "<path>" (<what>) at <location>`.
    pub what: String,
    /// The object evaluated, if it has a name.
    pub related: Option<ObjectReference>,
    /// How long it has run so far.
    pub elapsed: Duration,
    /// Its time bound.
    pub bound: Duration,
}

impl Overrun {
    /// One line for the condition and the Event: what runs, how long, and what follows.
    pub fn message(&self) -> String {
        format!(
            "{}: the expression has run {:.1} s, past its time bound of {:?}, inside one native \
             call the bound cannot interrupt; the object is not synced and a thread stays busy \
             until the call returns (once {MAX_OVERRUNNING} evaluations are this late, new ones \
             are refused)",
            self.what,
            self.elapsed.as_secs_f64(),
            self.bound
        )
    }
}

/// Why an evaluation was not started: [`MAX_OVERRUNNING`] (or the configured number of)
/// evaluations of the runtime are overrunning.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "refused without running: {overrunning} evaluation(s) of this runtime's expressions are \
     still running past their time bound inside one native call (new ones are refused once \
     {limit} are), for example {example}; retried with backoff once they end"
)]
pub struct Refusal {
    /// How many are overrunning.
    pub overrunning: usize,
    /// The most that may be.
    pub limit: usize,
    /// What the longest-running one evaluates.
    pub example: String,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    running: BTreeMap<u64, Running>,
}

/// The running evaluations of one runtime (see the module docs); shared through an [`Arc`].
#[derive(Debug)]
pub struct Evaluations {
    limit: usize,
    state: Mutex<State>,
    /// The runtime's evaluation slots ([`super::EVALUATION_SLOTS`]).
    slots: Arc<tokio::sync::Semaphore>,
}

impl Default for Evaluations {
    fn default() -> Self {
        Self::new(MAX_OVERRUNNING)
    }
}

/// A running evaluation, registered by [`Evaluations::start`]; dropping it ends it.
#[derive(Debug)]
pub struct Ticket {
    evaluations: Arc<Evaluations>,
    id: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.evaluations.lock().running.remove(&self.id);
    }
}

impl Evaluations {
    /// No evaluation running; new ones are refused while `limit` (at least 1) are overrunning.
    pub fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            state: Mutex::default(),
            slots: Arc::new(tokio::sync::Semaphore::new(super::EVALUATION_SLOTS)),
        }
    }

    /// One of the runtime's [`super::EVALUATION_SLOTS`], waited for without holding a thread;
    /// dropping it gives it back.
    pub async fn slot(&self) -> tokio::sync::OwnedSemaphorePermit {
        // never closed, so never refused
        self.slots
            .clone()
            .acquire_owned()
            .await
            .unwrap_or_else(|_| unreachable!("the evaluation slots are never closed"))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // the state stays consistent whatever panicked while holding it
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Ok` when a new evaluation may start at `now`.
    ///
    /// # Errors
    /// [`Refusal`] while the most allowed are overrunning.
    pub fn admit(&self, now: Instant) -> Result<(), Refusal> {
        Self::admit_in(&self.lock(), self.limit, now)
    }

    fn admit_in(state: &State, limit: usize, now: Instant) -> Result<(), Refusal> {
        let overrunning: Vec<&Running> = state
            .running
            .values()
            .filter(|r| r.overrunning(now))
            .collect();
        if overrunning.len() < limit {
            return Ok(());
        }
        let longest = overrunning.iter().min_by_key(|r| r.started);
        Err(Refusal {
            overrunning: overrunning.len(),
            limit,
            example: longest.map(|r| r.what.clone()).unwrap_or_default(),
        })
    }

    /// Registers an evaluation of `what` about `related` with time bound `bound`, started at
    /// `now`, unless it is refused; it runs until the [`Ticket`] is dropped.
    ///
    /// # Errors
    /// [`Refusal`] while the most allowed are overrunning.
    pub fn start(
        self: &Arc<Self>,
        what: impl FnOnce() -> (String, Option<ObjectReference>),
        bound: Duration,
        now: Instant,
    ) -> Result<Ticket, Refusal> {
        let mut state = self.lock();
        Self::admit_in(&state, self.limit, now)?;
        let (what, related) = what();
        let id = state.next;
        state.next += 1;
        state.running.insert(
            id,
            Running {
                what,
                related,
                started: now,
                bound,
                announced: false,
            },
        );
        Ok(Ticket {
            evaluations: self.clone(),
            id,
        })
    }

    /// Evaluations running now (counted for tests and logs).
    pub fn running(&self) -> usize {
        self.lock().running.len()
    }

    /// The evaluations overrunning at `now`, the longest-running first.
    pub fn overrunning(&self, now: Instant) -> Vec<Overrun> {
        let state = self.lock();
        let mut out: Vec<(Instant, Overrun)> = state
            .running
            .values()
            .filter(|r| r.overrunning(now))
            .map(|r| (r.started, overrun(r, now)))
            .collect();
        out.sort_by_key(|(started, _)| *started);
        out.into_iter().map(|(_, o)| o).collect()
    }

    /// The evaluations overrunning at `now` that no earlier call returned (each is announced
    /// once, as one `Warning` Event).
    pub fn announce(&self, now: Instant) -> Vec<Overrun> {
        let mut state = self.lock();
        state
            .running
            .values_mut()
            .filter(|r| !r.announced && r.overrunning(now))
            .map(|r| {
                r.announced = true;
                overrun(r, now)
            })
            .collect()
    }
}

fn overrun(r: &Running, now: Instant) -> Overrun {
    Overrun {
        what: r.what.clone(),
        related: r.related.clone(),
        elapsed: now.saturating_duration_since(r.started),
        bound: r.bound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn what(name: &str) -> impl FnOnce() -> (String, Option<ObjectReference>) {
        let name = name.to_string();
        move || {
            (
                format!("v1 Widget ns/{name}: patch \"spec.x\" (expression) at spec.x"),
                None,
            )
        }
    }

    #[test]
    fn overrunning_evaluations_are_counted_announced_once_and_refuse_new_ones() {
        let evaluations = Arc::new(Evaluations::new(2));
        let t0 = Instant::now();
        let bound = Duration::from_millis(100);
        let a = evaluations.start(what("a"), bound, t0).unwrap();
        let b = evaluations
            .start(what("b"), bound, t0 + Duration::from_millis(50))
            .unwrap();
        assert_eq!(evaluations.running(), 2);
        // within twice their bound they are not overrunning
        let at = t0 + Duration::from_millis(200);
        assert!(evaluations.overrunning(at).is_empty());
        assert!(evaluations.admit(at).is_ok());
        // later: both are, the longest-running first; each is announced once
        let at = t0 + Duration::from_millis(300);
        let over = evaluations.overrunning(at);
        assert_eq!(over.len(), 2);
        assert!(over[0].what.contains("ns/a"), "{over:?}");
        assert_eq!(over[0].elapsed, Duration::from_millis(300));
        assert!(
            over[0]
                .message()
                .contains("has run 0.3 s, past its time bound of 100ms"),
            "{}",
            over[0].message()
        );
        assert_eq!(evaluations.announce(at).len(), 2);
        assert!(evaluations.announce(at).is_empty());
        // two overrunning: a third is refused without being registered
        let refusal = evaluations.start(what("c"), bound, at).unwrap_err();
        assert_eq!((refusal.overrunning, refusal.limit), (2, 2));
        assert!(refusal.example.contains("ns/a"), "{refusal}");
        assert!(
            refusal.to_string().starts_with(
                "refused without running: 2 evaluation(s) of this runtime's expressions are still running past their time bound"
            ),
            "{refusal}"
        );
        assert_eq!(evaluations.running(), 2);
        // one ends: new ones start again
        drop(a);
        assert_eq!(evaluations.running(), 1);
        let c = evaluations.start(what("c"), bound, at).unwrap();
        assert_eq!(evaluations.running(), 2);
        drop((b, c));
        assert_eq!(evaluations.running(), 0);
        assert!(evaluations.overrunning(at).is_empty());
    }
}

//! How long the runtime waits before it tries again something that is not there: a watch that
//! failed (its type's CRD deleted, RBAC, an API server away) and a synced type that is not
//! served yet.
//!
//! Exponential: [`RETRY_MIN`] doubling up to a cap ([`DEFAULT_RETRY_MAX`] unless configured),
//! without jitter, built with `backon`'s `ExponentialBuilder`. Only a real delivery resets it
//! ([`Retry::reset`]): kube-runtime's `default_backoff()` resets on every item of the stream,
//! and a watcher whose list keeps failing emits an `Init` event before each attempt, so it
//! retried a vanished type every ~0.8 s forever.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The first delay after a failure.
pub const RETRY_MIN: Duration = Duration::from_millis(500);
/// The longest delay between two attempts, unless configured otherwise.
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(30);

/// The delays of one thing being retried: [`RETRY_MIN`], doubling, at most `max`.
pub(crate) struct Retry {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
}

impl Retry {
    /// Delays from [`RETRY_MIN`] up to `max` (at least [`RETRY_MIN`]).
    pub(crate) fn new(max: Duration) -> Self {
        let builder = ExponentialBuilder::default()
            .with_min_delay(RETRY_MIN)
            .with_max_delay(max.max(RETRY_MIN))
            .with_factor(2.0)
            .without_max_times();
        Self {
            builder,
            delays: builder.build(),
        }
    }

    /// The delay before the next attempt.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.delays.next().unwrap_or(RETRY_MIN)
    }

    /// Starts over at [`RETRY_MIN`] (after a success).
    pub(crate) fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_reset() {
        let mut retry = Retry::new(Duration::from_secs(3));
        let delays: Vec<u128> = (0..6).map(|_| retry.next_delay().as_millis()).collect();
        assert_eq!(delays, [500, 1000, 2000, 3000, 3000, 3000]);
        retry.reset();
        assert_eq!(retry.next_delay(), Duration::from_millis(500));
        let mut default = Retry::new(DEFAULT_RETRY_MAX);
        let last = (0..20).map(|_| default.next_delay()).last();
        assert_eq!(last, Some(Duration::from_secs(30)));
        // a cap below the first delay is the first delay
        assert_eq!(Retry::new(Duration::ZERO).next_delay(), RETRY_MIN);
    }
}

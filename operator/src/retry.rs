//! How long the controller waits before it reconciles again a plugin whose reconcile failed
//! ([`crate::controller::error_policy`]): per plugin, exponential, with jitter, built with
//! `backon`'s `ExponentialBuilder` like the runtime's retries (`vcp_syncer_runtime::retry`).
//!
//! The n-th consecutive failure of one plugin (n = 0 for the first) waits
//! `d = min(`[`RETRY_MIN`]` · 2^n, `[`RETRY_MAX`]`)` plus a random jitter in `[0, d)`: 0.5–1 s
//! after the first failure, 1–2 s, 2–4 s, ..., and 30–60 s from the seventh on. Jitter keeps the
//! plugins that failed together (an API server away) from retrying together. A successful
//! reconcile resets the plugin's delays ([`Retries::succeeded`]). A watch event of the plugin
//! or of an object it owns reconciles it at once whatever the delay (kube-runtime's
//! scheduler keeps the earliest).
//!
//! The state is one entry per plugin that failed last time, removed on its next success, when
//! the plugin is deleted ([`Retries::forget`]) and, after a re-list of the plugins (deletes
//! during a watch outage come as no event), for every plugin no longer listed
//! ([`Retries::retain`]): it never holds more entries than there are plugins.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use kube::runtime::reflector::ObjectRef;
use vcp_crds::VClusterPlugin;

/// The delay before the first retry of a failed reconcile, before jitter.
pub const RETRY_MIN: Duration = Duration::from_millis(500);
/// The longest delay between two retries of one plugin, before jitter (which adds at most as
/// much again).
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// The delays of the next retries of each plugin whose last reconcile failed.
#[derive(Default)]
pub struct Retries {
    delays: Mutex<HashMap<ObjectRef<VClusterPlugin>, ExponentialBackoff>>,
}

impl Retries {
    /// Records a failed reconcile of `plugin` and returns the delay before its retry: the
    /// next of its delays ([`RETRY_MIN`] doubling up to [`RETRY_MAX`], plus jitter).
    pub fn failed(&self, plugin: &ObjectRef<VClusterPlugin>) -> Duration {
        let mut delays = self.delays.lock().unwrap_or_else(|e| e.into_inner());
        delays
            .entry(plugin.clone())
            .or_insert_with(|| builder().build())
            .next()
            .unwrap_or(RETRY_MAX)
    }

    /// Records a successful reconcile of `plugin`: its next failure waits [`RETRY_MIN`] again.
    pub fn succeeded(&self, plugin: &ObjectRef<VClusterPlugin>) {
        self.forget(plugin);
    }

    /// Drops the state of `plugin` (deleted).
    pub fn forget(&self, plugin: &ObjectRef<VClusterPlugin>) {
        let mut delays = self.delays.lock().unwrap_or_else(|e| e.into_inner());
        delays.remove(plugin);
    }

    /// Keeps the state of the plugins for which `exists` holds only (after a re-list).
    pub fn retain(&self, exists: impl Fn(&ObjectRef<VClusterPlugin>) -> bool) {
        let mut delays = self.delays.lock().unwrap_or_else(|e| e.into_inner());
        delays.retain(|plugin, _| exists(plugin));
    }

    /// How many plugins have state (those whose last reconcile failed).
    pub fn len(&self) -> usize {
        self.delays.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no plugin has state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The delays of one plugin: [`RETRY_MIN`], doubling, at most [`RETRY_MAX`], each plus a
/// jitter in `[0, delay)`, never exhausted.
fn builder() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(RETRY_MIN)
        .with_max_delay(RETRY_MAX)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin(name: &str) -> ObjectRef<VClusterPlugin> {
        ObjectRef::new(name).within("team-a")
    }

    /// The delay without jitter of the n-th consecutive failure, from the documented rule
    /// (not from backon): min(500 ms · 2^n, 30 s).
    fn base_ms(n: u32) -> u64 {
        (500u64 << n.min(20)).min(30_000)
    }

    /// Asserts that `delay` is the n-th failure's: in [base, 2·base).
    fn assert_nth(delay: Duration, n: u32) {
        let ms = delay.as_secs_f64() * 1000.0;
        let base = base_ms(n) as f64;
        assert!(
            ms >= base && ms < 2.0 * base,
            "failure {n}: {ms} ms not in [{base}, {})",
            2.0 * base
        );
    }

    #[test]
    fn delays_double_with_jitter_up_to_the_cap() {
        let retries = Retries::default();
        let a = plugin("a");
        for n in 0..12 {
            assert_nth(retries.failed(&a), n);
        }
        // the cap: 30 s before jitter, under 60 s with it
        assert_eq!(base_ms(6), 30_000);
        assert_eq!(base_ms(5), 16_000);
    }

    #[test]
    fn jitter_spreads_plugins_that_fail_together() {
        let retries = Retries::default();
        let delays: Vec<Duration> = (0..20)
            .map(|i| retries.failed(&plugin(&format!("p{i}"))))
            .collect();
        for d in &delays {
            assert_nth(*d, 0);
        }
        let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
        assert!(distinct.len() > 1, "20 first delays all equal: {delays:?}");
    }

    #[test]
    fn success_resets_and_state_is_per_plugin() {
        let retries = Retries::default();
        let (a, b) = (plugin("a"), plugin("b"));
        for n in 0..4 {
            assert_nth(retries.failed(&a), n);
        }
        // b's first failure is a first failure, whatever a did
        assert_nth(retries.failed(&b), 0);
        retries.succeeded(&a);
        assert_nth(retries.failed(&a), 0);
        assert_nth(retries.failed(&b), 1);
        assert_eq!(retries.len(), 2);
    }

    #[test]
    fn state_goes_with_the_plugin() {
        let retries = Retries::default();
        let (a, b, c) = (plugin("a"), plugin("b"), plugin("c"));
        retries.failed(&a);
        retries.failed(&b);
        retries.failed(&c);
        assert_eq!(retries.len(), 3);
        retries.forget(&a);
        assert_eq!(retries.len(), 2);
        // a re-list that no longer shows b
        retries.retain(|p| p.name != "b");
        assert_eq!(retries.len(), 1);
        retries.succeeded(&c);
        assert!(retries.is_empty());
        // forgetting what is not there is harmless
        retries.forget(&a);
        assert!(retries.is_empty());
    }
}

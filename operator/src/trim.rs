//! Giving the heap's freed memory back to the kernel once a burst of reconciles is over.
//!
//! The operator runs on the system allocator (glibc's `malloc`). A burst of reconciles (a
//! thousand plugins created or deleted together) allocates watch events, JSON bodies and
//! dry-run results on every tokio worker thread; glibc keeps the pages those frees leave in
//! its per-thread arenas for reuse and returns only what sits at the top of an arena. So the
//! resident set stayed at the burst's high-water mark although the program held no more than
//! before: the churn test (`tests/tests/memory_churn.rs`, issue 24) saw it 12.5 % up after
//! 10,000 plugins came and went while the live heap had grown by 1 MiB. (mimalloc, the
//! runtime's allocator, kept 20 % on the same test.)
//!
//! [`after_bursts`] watches the count of finished reconciles: once it has moved and then stood
//! still for [`IDLE`], it calls glibc's `malloc_trim(0)` once, which returns every free page of
//! every arena (`madvise(MADV_DONTNEED)`, not only the arenas' tops; glibc ≥ 2.8). It costs a
//! walk of the arenas (milliseconds) once per burst, never while reconciles run. Each trim
//! counts in `vcp_operator_heap_trims_total`. On targets without glibc it only counts.

use std::sync::Arc;
use std::time::Duration;

use crate::telemetry::Telemetry;

/// How long the count of finished reconciles must stand still after it moved before the heap
/// is trimmed.
pub const IDLE: Duration = Duration::from_secs(2);

/// Returns the free pages of glibc's arenas to the kernel (`malloc_trim(0)`); whether memory
/// was released, as glibc reports it. `false`, and nothing done, without glibc.
pub fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` has no preconditions; it takes glibc's arena locks itself.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Runs until dropped (aborted): every `idle` (the operator passes [`IDLE`]), when
/// `telemetry`'s count of finished reconciles moved since the last look and has not moved
/// during the last interval, [`trim`]s once and counts it ([`Telemetry::trimmed`]).
pub async fn after_bursts(telemetry: Arc<Telemetry>, idle: Duration) {
    let mut tick = tokio::time::interval(idle);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen = telemetry.reconciles();
    let mut burst = false;
    loop {
        tick.tick().await;
        let now = telemetry.reconciles();
        if now != seen {
            seen = now;
            burst = true;
        } else if burst {
            burst = false;
            let released = trim();
            telemetry.trimmed();
            tracing::debug!(released, "heap trimmed after a burst of reconciles");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trim_returns_freed_pages() {
        // 64 MiB in 64 KiB blocks, below glibc's mmap threshold (128 KiB), so they come from
        // the arena; every other block freed leaves holes that only a trim gives back.
        let mut blocks: Vec<Vec<u8>> = (0..1024).map(|_| vec![1u8; 64 << 10]).collect();
        let mut kept = Vec::new();
        for (i, b) in blocks.drain(..).enumerate() {
            if i % 2 == 0 {
                kept.push(b);
            }
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        assert!(
            trim(),
            "glibc released nothing after 32 MiB of holes were freed"
        );
        drop(kept);
    }

    #[tokio::test]
    async fn trims_once_after_the_count_stood_still() {
        let idle = Duration::from_millis(500);
        let telemetry = Arc::new(Telemetry::new());
        let task = tokio::spawn(after_bursts(telemetry.clone(), idle));
        // the interval's first tick is at once, then every `idle`: look half-way between ticks
        tokio::time::sleep(idle * 3 + idle / 2).await;
        assert_eq!(telemetry.trims(), 0, "no reconcile yet: no trim");
        telemetry.observe_reconcile(Duration::from_millis(1), None);
        tokio::time::sleep(idle).await;
        assert_eq!(telemetry.trims(), 0, "the count just moved: still busy");
        tokio::time::sleep(idle).await;
        assert_eq!(
            telemetry.trims(),
            1,
            "the count stood still for one interval"
        );
        tokio::time::sleep(idle * 5).await;
        assert_eq!(telemetry.trims(), 1, "one trim per burst");
        task.abort();
    }
}

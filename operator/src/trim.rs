//! Giving the heap's freed memory back to the kernel once a burst of reconciles is over.
//!
//! The operator runs on the system allocator (glibc's `malloc`). A burst of reconciles (a
//! thousand plugins created or deleted together) allocates watch events, JSON bodies and
//! dry-run results on every tokio worker thread; glibc keeps the pages those frees leave in
//! its per-thread arenas for reuse and returns only what sits at the top of an arena. So the
//! resident set stayed at the burst's high-water mark although the program held no more than
//! before: the churn test (`tests/tests/memory_churn.rs`) saw it 12.5 % up after
//! 10,000 plugins came and went while the live heap had grown by 1 MiB. (mimalloc, the
//! runtime's allocator, kept 20 % on the same test.)
//!
//! [`after_bursts`] watches the count of finished reconciles ([`vcp_crds::bursts`] holds the
//! rule, shared with the runtime): once it has moved and then stood still for [`IDLE`], it
//! calls glibc's `malloc_trim(0)` once, which returns every free page of
//! every arena (`madvise(MADV_DONTNEED)`, not only the arenas' tops; glibc ≥ 2.8); during a long
//! busy stretch that never leaves the count still that long, it also trims every
//! [`BUSY_INTERVALS`] intervals. A trim walks the arenas (milliseconds) on a blocking thread.
//! Each trim counts in `vcp_operator_heap_trims_total`, and
//! `vcp_operator_heap_trimmed_at_reconciles` gives the count of finished reconciles the last
//! one followed. On targets without glibc it only counts.

use std::sync::Arc;
use std::time::Duration;

use vcp_crds::bursts::{Bursts, Release};

use crate::telemetry::Telemetry;

/// How long the count of finished reconciles must stand still after it moved before the heap
/// is trimmed.
pub const IDLE: Duration = Duration::from_secs(2);

/// Intervals of [`IDLE`] after which the heap is trimmed even while reconciles keep finishing
/// (15: every 30 s of a long busy stretch, such as a slow trickle of reconciles on a loaded
/// machine that never leaves the count still for 2 s).
pub const BUSY_INTERVALS: u32 = 15;

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

/// The size from which glibc's `malloc` gives a block a mapping of its own (`mmap`), returned
/// to the kernel as soon as it is freed, instead of carving it from an arena: 128 KiB,
/// glibc's initial value.
pub const MMAP_THRESHOLD: usize = 128 * 1024;

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD`] (`mallopt(M_MMAP_THRESHOLD)`); whether
/// glibc took it. `false`, and nothing done, without glibc.
///
/// Why: glibc raises the threshold to the size of every mapped block freed
/// (up to 32 MiB), so once the first large answer body was freed, every later body of a
/// plugin (up to the API server's 1.5 MiB request limit, and the buffers doubling up to it
/// while it is read) was carved from the arenas, between the small blocks of parsed JSON
/// trees, and the pages it left stayed resident until the next [`trim`]. With the threshold
/// fixed, the operator's resident set after a tenant's flood of refused plugins
/// (`tests/tests/operator_memory.rs`, its heap trimmed) was 37-38 MiB instead of 42-45.
pub fn fix_mmap_threshold() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let threshold = libc::c_int::try_from(MMAP_THRESHOLD).unwrap_or(libc::c_int::MAX);
        // SAFETY: `mallopt` has no preconditions; it takes glibc's arena locks itself.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, threshold) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Intervals of [`IDLE`] without a finished reconcile after a burst's trim before the heap is
/// trimmed once more (60: 2 minutes). What a burst leaves is freed later too: the client's
/// pooled connections to the API server, each with its read and write buffers, close only
/// after hyper's pool idle timeout (90 s); the CI run of `b39268f` measured the operator 69
/// tasks and 3.1 MiB of live heap above its level before the churn test's rounds, a few
/// seconds after the last one.
pub const SETTLE_INTERVALS: u32 = 60;

/// Runs until dropped (aborted): every `idle` (the operator passes [`IDLE`]), looks at
/// `telemetry`'s count of finished reconciles and follows [`vcp_crds::bursts`]'s rule, with
/// `busy` ([`BUSY_INTERVALS`]) and `settle` ([`SETTLE_INTERVALS`]): on a burst's release it
/// [`trim`]s once and counts it ([`Telemetry::trimmed`]), on the settled release it trims once
/// more ([`Telemetry::settled`]).
pub async fn after_bursts(telemetry: Arc<Telemetry>, idle: Duration, busy: u32, settle: u32) {
    let mut tick = tokio::time::interval(idle);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut bursts = Bursts::new(telemetry.reconciles(), busy, settle);
    loop {
        tick.tick().await;
        let now = telemetry.reconciles();
        let Some(release) = bursts.look(now) else {
            continue;
        };
        let released = tokio::task::spawn_blocking(trim).await.unwrap_or(false);
        match release {
            Release::Burst => {
                telemetry.trimmed(now);
                tracing::debug!(released, "heap trimmed after a burst of reconciles");
            }
            Release::Settled => {
                telemetry.settled(now);
                tracing::debug!(released, "heap trimmed once more, settled after a burst");
            }
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

    #[tokio::test(start_paused = true)]
    async fn trims_once_after_the_count_stood_still() {
        let idle = Duration::from_secs(2);
        let telemetry = Arc::new(Telemetry::new());
        let task = tokio::spawn(after_bursts(telemetry.clone(), idle, 1000, 1000));
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

    #[tokio::test(start_paused = true)]
    async fn trims_during_a_long_busy_stretch_too() {
        let idle = Duration::from_secs(2);
        let telemetry = Arc::new(Telemetry::new());
        let task = tokio::spawn(after_bursts(telemetry.clone(), idle, 3, 1000));
        // a reconcile every 500 ms: the count moves in every interval, never stands still
        let busy = {
            let telemetry = telemetry.clone();
            tokio::spawn(async move {
                loop {
                    telemetry.observe_reconcile(Duration::from_millis(1), None);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            })
        };
        // ticks at 0, 2, ..., 18 s: the count moved in each of those after 0, so one trim on
        // the 3rd, 6th and 9th moving tick
        tokio::time::sleep(idle * 9 + idle / 2).await;
        busy.abort();
        assert_eq!(telemetry.trims(), 3);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn trims_once_more_when_settled() {
        let idle = Duration::from_secs(2);
        let telemetry = Arc::new(Telemetry::new());
        let task = tokio::spawn(after_bursts(telemetry.clone(), idle, 1000, 5));
        tokio::time::sleep(idle / 2).await;
        telemetry.observe_reconcile(Duration::from_millis(1), None);
        // moved at the tick of 2 s, trimmed at 4 s, settled 5 still intervals later (14 s)
        tokio::time::sleep(idle * 6).await;
        assert_eq!((telemetry.trims(), telemetry.settles()), (1, 0));
        tokio::time::sleep(idle * 2).await;
        assert_eq!((telemetry.trims(), telemetry.settles()), (1, 1));
        // a reconcile during the wait starts over: no settle trim until it is still again
        telemetry.observe_reconcile(Duration::from_millis(1), None);
        tokio::time::sleep(idle * 4).await;
        telemetry.observe_reconcile(Duration::from_millis(1), None);
        tokio::time::sleep(idle * 4).await;
        assert_eq!(telemetry.settles(), 1);
        tokio::time::sleep(idle * 20).await;
        assert_eq!((telemetry.trims(), telemetry.settles()), (3, 2));
        task.abort();
    }
}

//! Giving the heap's freed pages back to the kernel once a burst of reconciles is over, and
//! keeping them out of transparent huge pages.
//!
//! The runtime binary runs on mimalloc (`src/main.rs`). mimalloc gives freed pages back to
//! the kernel (`madvise(MADV_DONTNEED)`) only when they have stood free for its purge delay
//! (1 s in mimalloc 3.3, option `purge_delay`) *and* the allocator is called again on a path
//! that looks at pending purges; pages still owned by a thread's heap wait until that thread
//! collects. A process that goes idle right after a burst (2,000 Cars synced and deleted
//! together) is not called again, so it keeps the burst's freed pages; mimalloc kept 20 %
//! where it was tried for the operator (`operator/src/trim.rs`).
//!
//! Transparent huge pages are off for the whole process ([`disable_huge_pages`], called from
//! an ELF initializer before the binary's first allocation): mimalloc asks for them on its
//! arenas (`madvise(MADV_HUGEPAGE)` on each 1 GiB reservation, its option `allow_thp`), so on
//! a kernel whose THP mode is `madvise` (this machine's) or `always` (the kernel's built-in
//! default), a fault or the kernel's `khugepaged` (which collapses a 2 MiB range with as few as
//! one page in use, `max_ptes_none` 511 by default) makes 2 MiB of a few live kilobytes
//! resident, at times the process does not choose. The churn test
//! (`tests/tests/memory_churn.rs`) measured the runtime's anonymous memory at 17.5 MiB, 10 MiB
//! of it in huge pages, for a live heap of 2.3 MiB; with THP off, 5.7 MiB and none
//! (`docs/BENCHMARKS.md`, "the runtime's huge pages"). Such collapses are the likely
//! cause of the one red run of that test (+29.5 %, in steps of 5 and 2 MiB).
//!
//! [`after_bursts`] follows the operator's rule ([`vcp_crds::bursts`]): once the count of
//! finished reconciles has moved and then stood still for [`IDLE`] (or kept moving for
//! [`BUSY_INTERVALS`] intervals), and once more [`SETTLE_INTERVALS`] still intervals later, it
//! calls [`collect`]: mimalloc's `mi_collect(true)`, which frees the calling thread's empty
//! pages and purges every pending page of every arena at once (process-wide). It runs as a
//! task on the async workers, where the syncers allocate (the binary has one worker thread);
//! a collect takes milliseconds. Each counts in `vcp_runtime_heap_collects_total`, and
//! `vcp_runtime_heap_collected_at_reconciles` gives the count of finished reconciles the last
//! one followed ([`crate::metrics`]).

use std::sync::Arc;
use std::time::Duration;

use vcp_crds::bursts::{Bursts, Release};

use crate::metrics::Metrics;

/// How long the count of finished reconciles must stand still after it moved before the heap
/// is collected (as the operator's `trim::IDLE`).
pub const IDLE: Duration = Duration::from_secs(2);

/// Intervals of [`IDLE`] after which the heap is collected even while reconciles keep
/// finishing (15: every 30 s of a long busy stretch, as the operator's).
pub const BUSY_INTERVALS: u32 = 15;

/// Still intervals of [`IDLE`] after a burst's collect before the heap is collected once more
/// (60: 2 minutes, after hyper's 90 s pool idle timeout closed the burst's connections), as
/// the operator's.
pub const SETTLE_INTERVALS: u32 = 60;

/// Turns transparent huge pages off for this process and the processes it starts
/// (`prctl(PR_SET_THP_DISABLE, 1)`, Linux ≥ 3.15; module docs for why); whether the kernel
/// took it. `false`, and nothing done, on other systems. Call it before the first threads
/// start: the flag covers every mapping of the process from then on, including the arenas
/// mimalloc already reserved, but not huge pages already made.
pub fn disable_huge_pages() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `prctl(PR_SET_THP_DISABLE)` takes plain integers and changes only the
        // calling process's memory policy.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// mimalloc's `mi_collect(true)` on the calling thread: its heap's free pages and every
/// arena's pending purges given back to the kernel. In a process whose allocator is not
/// mimalloc (a library user's), it finds mimalloc uninitialized on the thread and does
/// nothing.
pub fn collect() {
    // SAFETY: `mi_collect` has no preconditions; it works on the calling thread's heap and
    // takes the arenas' locks itself.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// Runs until dropped (aborted): every `idle`, looks at `metrics`' count of finished
/// reconciles (every type's, [`Metrics::reconciles_total`]) and follows
/// [`vcp_crds::bursts`]'s rule with `busy` and `settle` (the binary passes [`IDLE`],
/// [`BUSY_INTERVALS`] and [`SETTLE_INTERVALS`]); on each release it [`collect`]s on the thread
/// that polls it and counts it, with the count it followed ([`Metrics::collected`]).
pub async fn after_bursts(metrics: Arc<Metrics>, idle: Duration, busy: u32, settle: u32) {
    let mut tick = tokio::time::interval(idle);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut bursts = Bursts::new(metrics.reconciles_total(), busy, settle);
    loop {
        tick.tick().await;
        let now = metrics.reconciles_total();
        let Some(release) = bursts.look(now) else {
            continue;
        };
        collect();
        metrics.collected(now);
        tracing::debug!(
            settled = release == Release::Settled,
            reconciles = now,
            "heap collected after a burst of reconciles"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn collects_once_after_a_burst_and_once_when_it_settled() {
        let idle = Duration::from_secs(2);
        let metrics = Arc::new(Metrics::default());
        let counters = metrics.of_type("example.loft.sh/v1", "Car");
        let task = tokio::spawn(after_bursts(metrics.clone(), idle, 1000, 3));
        // the interval's first tick is at once, then every `idle`: look half-way between ticks
        tokio::time::sleep(idle * 3 + idle / 2).await;
        assert_eq!(metrics.collects(), 0, "no reconcile yet: no collect");
        counters.count_reconcile();
        tokio::time::sleep(idle).await;
        assert_eq!(metrics.collects(), 0, "the count just moved: still busy");
        tokio::time::sleep(idle).await;
        assert_eq!(metrics.collects(), 1, "the count stood still one interval");
        tokio::time::sleep(idle * 2).await;
        assert_eq!(
            metrics.collects(),
            1,
            "two still intervals of the three to settle"
        );
        tokio::time::sleep(idle).await;
        assert_eq!(metrics.collects(), 2, "settled: once more");
        tokio::time::sleep(idle * 10).await;
        assert_eq!(metrics.collects(), 2, "nothing moved since");
        task.abort();
    }

    /// The resident set of this process (`/proc/self/statm`'s second field), in bytes.
    fn rss() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
        let pages: usize = statm
            .split(' ')
            .nth(1)
            .and_then(|p| p.parse().ok())
            .expect("resident pages");
        // SAFETY: `sysconf` has no preconditions.
        pages * usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).expect("page size")
    }

    #[test]
    fn a_collect_gives_freed_pages_back() {
        // The unit tests' process runs on the system allocator; mimalloc is linked all the
        // same: fill 32 MiB of it, free it all, then collect.
        let before = rss();
        let blocks: Vec<*mut libc::c_void> = (0..512)
            // SAFETY: `mi_malloc` of a non-zero size; each block is freed below.
            .map(|_| unsafe { libmimalloc_sys::mi_malloc(64 << 10) })
            .collect();
        for &b in &blocks {
            assert!(!b.is_null());
            // SAFETY: writing within the 64 KiB just allocated, so its pages are resident.
            unsafe { std::ptr::write_bytes(b.cast::<u8>(), 1, 64 << 10) };
        }
        for b in blocks {
            // SAFETY: each block from `mi_malloc` above, freed once.
            unsafe { libmimalloc_sys::mi_free(b) };
        }
        let freed = rss();
        collect();
        let collected = rss();
        eprintln!(
            "resident set: {before} bytes before, {freed} after the frees, {collected} after the collect"
        );
        assert!(
            freed >= before + (16 << 20),
            "mimalloc gave most of the 32 MiB back at the frees already ({before} -> {freed} bytes): the test shows nothing"
        );
        assert!(
            collected + (16 << 20) <= freed,
            "the collect gave back less than 16 MiB of the 32 MiB freed: {freed} -> {collected} bytes"
        );
    }
}

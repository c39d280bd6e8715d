//! When a process gives its heap's freed pages back to the kernel: once a burst of work is
//! over, not during it, and once more after the burst has settled.
//!
//! Both binaries allocate and free in bursts (a thousand objects created or deleted together)
//! and their allocators keep what a burst freed (glibc in its arenas, mimalloc until a purge
//! that runs only when the allocator is called again), so an idle process stays at the burst's
//! high-water mark. Each binary looks at its count of finished reconciles once per interval
//! and asks [`Bursts::look`] whether to give memory back now: the operator with glibc's
//! `malloc_trim` (`operator/src/trim.rs`), the runtime with mimalloc's `mi_collect`
//! (`syncer-runtime/src/heap.rs`). This module is the rule alone (no clock, no allocator), so
//! both follow the same one.
//!
//! The rule, per look (one per interval, 2 s in both binaries):
//! - the count moved since the last release and stood still during the last interval: release
//!   ([`Release::Burst`]);
//! - the count moved in each of the last `busy` intervals (a long busy stretch that never
//!   stands still): release ([`Release::Burst`]), and start counting again;
//! - `settle` still intervals after a burst's release: release once more
//!   ([`Release::Settled`]): what a burst leaves is also freed later (pooled connections close
//!   after hyper's 90 s idle timeout, with their buffers). A move before that cancels it (the
//!   next burst's release comes instead).

/// What [`Bursts::look`] asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Give memory back: a burst just ended, or a busy stretch went on for `busy` intervals.
    Burst,
    /// Give memory back once more: `settle` still intervals followed a burst's release.
    Settled,
}

/// The state of the rule (module docs) between two looks.
#[derive(Clone, Debug)]
pub struct Bursts {
    busy: u32,
    settle: u32,
    /// The count at the last look.
    seen: u64,
    /// Intervals in a row in which the count moved (`None`: it has not moved since the last
    /// release).
    moving: Option<u32>,
    /// Still intervals since the last burst's release (`None`: no release to settle).
    settling: Option<u32>,
}

impl Bursts {
    /// The rule for a process whose count of finished reconciles is `count` now, releasing
    /// during a busy stretch every `busy` moving intervals and once more after `settle` still
    /// intervals (both at least 1).
    pub fn new(count: u64, busy: u32, settle: u32) -> Self {
        Bursts {
            busy: busy.max(1),
            settle: settle.max(1),
            seen: count,
            moving: None,
            settling: None,
        }
    }

    /// One interval's look at the count of finished reconciles, `count`: what to give back
    /// now, if anything.
    pub fn look(&mut self, count: u64) -> Option<Release> {
        let moved = count != self.seen;
        self.seen = count;
        if moved {
            self.settling = None;
        } else if let Some(n) = self.settling {
            if n + 1 >= self.settle {
                self.settling = None;
                return Some(Release::Settled);
            }
            self.settling = Some(n + 1);
        }
        let due = match (moved, self.moving) {
            (true, n) => {
                let n = n.unwrap_or(0) + 1;
                self.moving = Some(n);
                n >= self.busy
            }
            (false, Some(_)) => true,
            (false, None) => false,
        };
        if !due {
            return None;
        }
        self.moving = None;
        self.settling = Some(0);
        Some(Release::Burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The releases of `looks` successive looks at the counts `counts`.
    fn releases(bursts: &mut Bursts, counts: &[u64]) -> Vec<Option<Release>> {
        counts.iter().map(|c| bursts.look(*c)).collect()
    }

    #[test]
    fn nothing_before_the_count_moves() {
        let mut b = Bursts::new(7, 3, 5);
        assert_eq!(releases(&mut b, &[7; 20]), vec![None; 20]);
    }

    #[test]
    fn one_release_once_the_count_stands_still() {
        let mut b = Bursts::new(0, 100, 100);
        assert_eq!(
            releases(&mut b, &[5, 9, 9, 9, 9]),
            vec![None, None, Some(Release::Burst), None, None]
        );
    }

    #[test]
    fn a_busy_stretch_releases_every_busy_intervals() {
        let mut b = Bursts::new(0, 3, 100);
        let counts: Vec<u64> = (1..=9).collect();
        assert_eq!(
            releases(&mut b, &counts),
            vec![
                None,
                None,
                Some(Release::Burst),
                None,
                None,
                Some(Release::Burst),
                None,
                None,
                Some(Release::Burst)
            ]
        );
    }

    #[test]
    fn once_more_after_settle_still_intervals() {
        let mut b = Bursts::new(0, 100, 3);
        assert_eq!(
            releases(&mut b, &[1, 1, 1, 1, 1, 1, 1, 1]),
            vec![
                None,
                Some(Release::Burst),
                None,
                None,
                Some(Release::Settled),
                None,
                None,
                None
            ]
        );
    }

    #[test]
    fn a_move_while_settling_gives_the_next_bursts_release_instead() {
        let mut b = Bursts::new(0, 100, 3);
        assert_eq!(
            releases(&mut b, &[1, 1, 1, 2, 2, 2, 2, 2, 2]),
            vec![
                None,
                Some(Release::Burst),
                None,
                None,
                Some(Release::Burst),
                None,
                None,
                Some(Release::Settled),
                None
            ]
        );
    }
}

//! Test machinery (feature `reconcile-log` only, never in release): the bytes the process's
//! heap holds live, counted by a global allocator that wraps the system allocator.
//!
//! The resident set of a process says what the allocator kept from the kernel, which after a
//! burst of frees can stay high (glibc keeps freed chunks in its arenas); the live bytes say
//! what the program itself still holds. Both together tell retained objects (live bytes grow)
//! from an allocator that does not give memory back (only the resident set grows), as the
//! churn test (`tests/tests/memory_churn.rs`) needs. The binary installs [`Counting`] as its
//! `#[global_allocator]` with the feature; [`live_bytes`] is served on the test endpoint
//! `/state` ([`crate::http`]).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

/// Bytes allocated and not yet freed through [`Counting`] (the requested sizes, without the
/// allocator's own overhead).
static LIVE: AtomicI64 = AtomicI64::new(0);

/// The system allocator, counting the bytes it hands out and takes back in [`live_bytes`].
#[derive(Debug, Default)]
pub struct Counting;

fn add(bytes: usize) {
    LIVE.fetch_add(i64::try_from(bytes).unwrap_or(i64::MAX), Ordering::Relaxed);
}

fn sub(bytes: usize) {
    LIVE.fetch_sub(i64::try_from(bytes).unwrap_or(i64::MAX), Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds `GlobalAlloc`'s
// contract; the counter is only bookkeeping beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes
        // through this type).
        unsafe { System.dealloc(ptr, layout) };
        sub(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `dealloc`, and `new_size` as the caller gave it.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            sub(layout.size());
            add(new_size);
        }
        p
    }
}

/// Bytes the program holds on the heap right now (allocated through [`Counting`] and not yet
/// freed); 0 in a process that does not install [`Counting`].
pub fn live_bytes() -> i64 {
    LIVE.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_is_allocated_and_freed() {
        // The unit tests' process does not install `Counting`: drive it directly.
        let a = Counting;
        let layout = Layout::from_size_align(4096, 8).expect("layout");
        let before = live_bytes();
        // SAFETY: a valid non-zero layout; freed below with the same layout.
        let p = unsafe { a.alloc(layout) };
        assert!(!p.is_null());
        assert_eq!(live_bytes() - before, 4096);
        // SAFETY: `p` from `a.alloc(layout)`.
        let p = unsafe { a.realloc(p, layout, 10_000) };
        assert!(!p.is_null());
        assert_eq!(live_bytes() - before, 10_000);
        let grown = Layout::from_size_align(10_000, 8).expect("layout");
        // SAFETY: `p` from the realloc to 10,000 bytes.
        unsafe { a.dealloc(p, grown) };
        assert_eq!(live_bytes() - before, 0);
    }
}

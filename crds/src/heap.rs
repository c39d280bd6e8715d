//! Test machinery (feature `heap-count` only, which the operator's and the runtime's
//! `reconcile-log` features turn on, never a release build): the bytes a process's heap holds
//! live, counted by a global allocator that wraps the process's own allocator.
//!
//! The resident set of a process says what the allocator kept from the kernel, which after a
//! burst of frees can stay high (glibc keeps freed chunks in its arenas, mimalloc its freed
//! pages until a purge); the live bytes say what the program itself still holds. Both together
//! tell retained objects (live bytes grow) from an allocator that does not give memory back
//! (only the resident set grows), as the churn test (`tests/tests/memory_churn.rs`) needs. A
//! binary installs [`Counting`] around its allocator as its `#[global_allocator]` with the
//! feature (the operator around glibc's, `Counting(std::alloc::System)`; the runtime around
//! mimalloc, `Counting(mimalloc::MiMalloc)`), and serves [`live_bytes`] on its test endpoint
//! `/state`.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicI64, Ordering};

/// Bytes allocated and not yet freed through [`Counting`] (the requested sizes, without the
/// allocator's own overhead).
static LIVE: AtomicI64 = AtomicI64::new(0);

/// The allocator `A`, counting the bytes it hands out and takes back in [`live_bytes`].
#[derive(Debug, Default)]
pub struct Counting<A>(pub A);

fn add(bytes: usize) {
    LIVE.fetch_add(i64::try_from(bytes).unwrap_or(i64::MAX), Ordering::Relaxed);
}

fn sub(bytes: usize) {
    LIVE.fetch_sub(i64::try_from(bytes).unwrap_or(i64::MAX), Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to `A`, which upholds `GlobalAlloc`'s contract;
// the counter is only bookkeeping beside it.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            add(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `A` with `layout` (every allocation goes through
        // this type).
        unsafe { self.0.dealloc(ptr, layout) };
        sub(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `dealloc`, and `new_size` as the caller gave it.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
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
    use std::alloc::System;

    #[test]
    fn counts_what_is_allocated_and_freed() {
        // The unit tests' process does not install `Counting`: drive it directly.
        let a = Counting(System);
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

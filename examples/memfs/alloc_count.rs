//! A counting allocator for memfs's unit tests: how many bytes of memory
//! the allocations of this thread hold, as glibc's malloc sizes them, so
//! that the tests can check that each charge of `capacity.rs` bounds what
//! its record really costs.
//!
//! Every call is forwarded to the system allocator unchanged. Counting is
//! per thread (tests run in parallel), in const-initialised thread locals,
//! which do not allocate.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static HELD: Cell<i64> = const { Cell::new(0) };
}

/// What malloc takes for a request of `layout`: the request plus the
/// 8-byte chunk header, rounded up to 16, at least 32 bytes; an alignment
/// above 16 may cost up to the alignment again.
fn footprint(layout: Layout) -> i64 {
    let base = (layout.size() + 8).next_multiple_of(16).max(32);
    let extra = if layout.align() > 16 { layout.align() } else { 0 };
    (base + extra) as i64
}

fn note(delta: i64) {
    // `try_with`: nothing to count while the thread is being torn down.
    let _ = HELD.try_with(|h| h.set(h.get() + delta));
}

/// Bytes held by this thread's live allocations (may be negative after
/// freeing memory allocated elsewhere).
pub fn held() -> i64 {
    HELD.with(Cell::get)
}

struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; the
// bookkeeping only touches a const-initialised thread local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(footprint(layout));
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(footprint(layout));
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Layout::from_size_align cannot fail: `new_size` was valid for
            // the caller with this alignment.
            if let Ok(new) = Layout::from_size_align(new_size, layout.align()) {
                note(footprint(new) - footprint(layout));
            }
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-footprint(layout));
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

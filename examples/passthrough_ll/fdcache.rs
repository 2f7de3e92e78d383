//! The bounded cache of inode descriptors in file-handle mode.
//!
//! An inode known by its file handle keeps its `O_PATH` descriptor in its
//! own slot (see `inodes::HandleAnchor`); a hit takes only that inode's
//! mutex. This module decides which slots may keep a descriptor: each slot
//! holding one is on exactly one ring of [`FdCache`] (the ring its key
//! hashes to), and a ring never holds more than its share of the capacity.
//! Putting a slot on a full ring evicts another first, in CLOCK order: the
//! oldest entry goes unless it was used since it last came round (then it
//! gets a second chance). Only misses touch a ring, and the rings are
//! sharded, so no lock is shared by every request.
//!
//! An evicted descriptor closes when the last request using it is done (the
//! slots hand out `Arc`s), so the descriptors open are at most the capacity
//! plus those pinned by open files plus those in use by requests. [`fit`]
//! sizes the capacity within the daemon's open-file limit.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Number of rings (a power of two).
pub const RINGS: usize = 16;

/// Default capacity (`-o fd_cache=`) where the open-file limit allows it.
pub const DEFAULT_CAPACITY: usize = 4096;

/// Descriptors the daemon holds besides the session's, the cache's and
/// those of open files: stdio, the source root, the log and statistics
/// files, and those requests in flight hold beyond the cache.
pub const OWN_DESCRIPTORS: u64 = 64;

/// The capacity under an open-file limit of `limit` descriptors of which
/// `reserved` are kept for everything but the cache and open files.
///
/// `asked` (`-o fd_cache=`) is taken if the descriptors it may hold fit in
/// what is left, and refused otherwise. By default the cache takes half of
/// what is left (the other half stays for open files and directories), at
/// most [`DEFAULT_CAPACITY`], and at least one descriptor per ring.
pub fn fit(limit: u64, reserved: u64, asked: Option<usize>) -> Result<usize, String> {
    let left = limit.saturating_sub(reserved);
    let default = usize::try_from(left / 2)
        .unwrap_or(usize::MAX)
        .min(DEFAULT_CAPACITY)
        / RINGS
        * RINGS;
    let default = default.max(RINGS);
    let Some(n) = asked else {
        return Ok(default);
    };
    let holds = n.div_ceil(RINGS) * RINGS;
    if holds as u64 > left {
        return Err(format!(
            "fd_cache={n} does not fit the open file limit of {limit} descriptors: the daemon keeps \
             {reserved} of them for its threads and its own files, which leaves {left} for cached \
             descriptors and open files (a cache holds a multiple of {RINGS}); leave fd_cache= out \
             to size the cache from the limit ({default} here), or raise the limit (ulimit -Hn)"
        ));
    }
    Ok(n)
}

/// What the cache needs of an entry (an inode holding a descriptor).
pub trait Cached {
    /// Clears the entry's reference bit; whether it was set (used since the
    /// cache last looked).
    fn take_referenced(&self) -> bool;
    /// The entry is off its ring: it must drop its descriptor (unless
    /// something else keeps it).
    fn evict_fd(&self);
}

/// The rings of cached descriptors.
pub struct FdCache<T: Cached> {
    rings: Box<[Mutex<VecDeque<Weak<T>>>]>,
    per_ring: usize,
}

impl<T: Cached> FdCache<T> {
    /// A cache holding at most `capacity` descriptors (rounded up to a
    /// multiple of the number of rings).
    pub fn new(capacity: usize) -> Self {
        let per_ring = capacity.div_ceil(RINGS).max(1);
        Self {
            rings: (0..RINGS)
                .map(|_| Mutex::new(VecDeque::with_capacity(per_ring)))
                .collect(),
            per_ring,
        }
    }

    /// The most descriptors it holds.
    pub fn capacity(&self) -> usize {
        self.per_ring * RINGS
    }

    fn ring(&self, i: usize) -> MutexGuard<'_, VecDeque<Weak<T>>> {
        self.rings[i % RINGS].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that `inode`'s slot now holds a descriptor (the caller has
    /// marked it on a ring), evicting others from ring `ring` to make room.
    pub fn admit(&self, ring: usize, inode: Weak<T>) {
        let mut victims: Vec<Arc<T>> = Vec::new();
        let mut r = self.ring(ring);
        // Every entry gets at most one second chance per admission.
        let mut chances = r.len();
        while r.len() >= self.per_ring {
            let Some(w) = r.pop_front() else { break };
            let Some(i) = w.upgrade() else {
                // Forgotten: its descriptor closed with it.
                continue;
            };
            if chances > 0 && i.take_referenced() {
                chances -= 1;
                r.push_back(w);
                continue;
            }
            victims.push(i);
        }
        r.push_back(inode);
        drop(r);
        // Outside the ring's lock: closing may take a while, and dropping
        // the last reference to an inode frees it.
        for v in victims {
            v.evict_fd();
        }
    }

    /// Entries on the rings (live or not; tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn len(&self) -> usize {
        (0..RINGS).map(|i| self.ring(i).len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Default)]
    struct Entry {
        referenced: AtomicBool,
        evicted: AtomicBool,
    }

    impl Cached for Entry {
        fn take_referenced(&self) -> bool {
            self.referenced.swap(false, Ordering::Relaxed)
        }

        fn evict_fd(&self) {
            self.evicted.store(true, Ordering::Relaxed);
        }
    }

    #[test]
    fn the_capacity_fits_the_open_file_limit() {
        // Plenty of descriptors: the default, and any cache that fits.
        assert_eq!(fit(1 << 20, 200, None), Ok(DEFAULT_CAPACITY));
        assert_eq!(fit(1 << 20, 200, Some(100_000)), Ok(100_000));
        // 1024: half of what the reserve leaves, in whole rings.
        assert_eq!(fit(1024, 200, None), Ok(412 / RINGS * RINGS));
        assert_eq!(fit(1024, 200, Some(800)), Ok(800));
        let e = fit(1024, 200, Some(100_000)).unwrap_err();
        assert!(e.contains("fd_cache=100000") && e.contains("1024"), "{e}");
        // A cache holds whole rings: 817 would hold 832 > 824.
        assert!(fit(1024, 200, Some(817)).is_err());
        // A limit below the reserve still gets a ring's worth, no more.
        assert_eq!(fit(100, 200, None), Ok(RINGS));
        assert!(fit(100, 200, Some(1)).is_err());
    }

    #[test]
    fn rings_evict_in_clock_order_with_a_second_chance() {
        // Two entries per ring.
        let c = FdCache::new(2 * RINGS);
        assert_eq!(c.capacity(), 2 * RINGS);
        let e: Vec<Arc<Entry>> = (0..4).map(|_| Arc::new(Entry::default())).collect();
        c.admit(3, Arc::downgrade(&e[0]));
        c.admit(3, Arc::downgrade(&e[1]));
        // Another ring is not touched by ring 3's admissions.
        c.admit(4, Arc::downgrade(&e[3]));
        // e[0] was used: e[1] goes instead.
        e[0].referenced.store(true, Ordering::Relaxed);
        c.admit(3, Arc::downgrade(&e[2]));
        assert!(!e[0].evicted.load(Ordering::Relaxed));
        assert!(e[1].evicted.load(Ordering::Relaxed));
        assert!(!e[3].evicted.load(Ordering::Relaxed));
        assert_eq!(c.len(), 3);
        // A dropped entry frees its place without an eviction.
        let gone = Arc::downgrade(&e[2]);
        drop(e);
        assert!(gone.upgrade().is_none());
        let f = Arc::new(Entry::default());
        c.admit(3, Arc::downgrade(&f));
        assert!(!f.evicted.load(Ordering::Relaxed));
        assert!(c.len() <= 2 * RINGS);
    }
}

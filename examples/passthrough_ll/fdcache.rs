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
//! plus those pinned by open files plus those in use by requests.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Number of rings (a power of two).
const RINGS: usize = 16;

/// Default capacity (`-o fd_cache=`).
pub const DEFAULT_CAPACITY: usize = 4096;

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

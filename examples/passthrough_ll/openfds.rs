//! The descriptor budget of open files: which open files may keep their
//! descriptor, and what each user may pin.
//!
//! An open regular file keeps its source descriptor only while it is among
//! the recently used ones: those sit on the sharded CLOCK rings of an
//! [`FdCache`] (the same rings as the inode descriptors of `fdcache.rs`,
//! sized apart), and a file pushed off a ring closes its descriptor; its
//! next request opens the file again from its node with the flags of its
//! open (`PassthroughFs::ready`). A file whose open file description holds
//! what a new open would not have (a `flock` lock, a deposit with a keeper),
//! or that a new open could not reach or should not make (a directory
//! stream, a device or FIFO, `O_DIRECT` with its twin, no name left) is
//! *pinned*: it keeps its descriptor and is charged to the user who opened
//! it. Each user may pin at most [`OpenBudget::share`] files, and all users
//! together at most [`OpenBudget::pool`]; past their share a user's opens
//! (and `flock`s) of such files fail with `EMFILE` (`ENOLCK`), never
//! another user's. The descriptor of a POSIX lock owner (`-o posix_lock`,
//! one per owner and inode) is charged the same way, to the user whose
//! lock request made it (`ENOLCK` past the share).
//!
//! Only opens, evictions, pins and releases touch the rings and the
//! charges; a request on a file that has its descriptor takes that file's
//! own mutex, nothing shared.

use crate::fdcache::{Cached, FdCache, RINGS};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Shards of the per-user charges (by uid).
const CHARGE_SHARDS: usize = 16;

/// How many users together can each pin their full share: the pool is
/// split this many ways.
pub const SHARES: usize = 8;

/// Descriptors one open file may hold at once: its own, and its node's
/// `O_PATH` descriptor, which stays open while the file's is (see
/// `InodeData::pin`).
pub const PER_FILE: usize = 2;

/// Descriptors for open files when the open-file limit is not known.
pub const DEFAULT_DESCRIPTORS: usize = 16384;

/// The rings of open files holding a descriptor, and the pinned ones'
/// charges by user.
pub struct OpenBudget<T: Cached> {
    ring: FdCache<T>,
    charges: Box<[Mutex<HashMap<u32, usize>>]>,
    pinned: AtomicUsize,
    pool: usize,
    share: usize,
}

impl<T: Cached> OpenBudget<T> {
    /// A budget of `descriptors` for open files: half of them for the
    /// files that keep theirs while used (in whole rings, at least one file
    /// per ring), the rest for pinned files, [`PER_FILE`] per file either
    /// way; a user's share is an eighth ([`SHARES`]) of the pinned ones.
    pub fn new(descriptors: usize) -> Self {
        let (idle, pool, share) = Self::sizes(descriptors);
        Self::with(idle, pool, share)
    }

    /// What [`Self::new`] makes of `descriptors`: the files that keep
    /// their descriptor while used, the pinned ones of all users, those
    /// of one user.
    pub fn sizes(descriptors: usize) -> (usize, usize, usize) {
        let files = descriptors / PER_FILE;
        // Whole rings (a ring holds as many as the others).
        let idle = (files / 2 / RINGS * RINGS).max(RINGS);
        let pool = (files - files / 2).max(SHARES);
        (idle, pool, (pool / SHARES).max(1))
    }

    /// `idle` files keeping their descriptor while used, `pool` pinned
    /// ones, at most `share` of them of one user.
    pub fn with(idle: usize, pool: usize, share: usize) -> Self {
        Self {
            ring: FdCache::new(idle),
            charges: (0..CHARGE_SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            pinned: AtomicUsize::new(0),
            pool,
            share,
        }
    }

    /// The most pinned files of one user.
    pub fn share(&self) -> usize {
        self.share
    }

    /// Pinned files now (all users).
    pub fn pinned(&self) -> usize {
        self.pinned.load(Ordering::Relaxed)
    }

    fn charges(&self, uid: u32) -> MutexGuard<'_, HashMap<u32, usize>> {
        self.charges[uid as usize % CHARGE_SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Charges one pinned file to `uid` if its share and the pool allow;
    /// whether it did.
    pub fn charge(&self, uid: u32) -> bool {
        let mut c = self.charges(uid);
        let mine = c.get(&uid).copied().unwrap_or(0);
        if mine >= self.share {
            return false;
        }
        let taken = self
            .pinned
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.pool).then_some(n + 1)
            });
        if taken.is_err() {
            return false;
        }
        c.insert(uid, mine + 1);
        true
    }

    /// Charges one pinned file to `uid` whatever its share: for a file
    /// whose descriptor cannot be closed any more (it lost its last name).
    pub fn force(&self, uid: u32) {
        *self.charges(uid).entry(uid).or_insert(0) += 1;
        self.pinned.fetch_add(1, Ordering::AcqRel);
    }

    /// Gives back one charge of `uid`.
    pub fn uncharge(&self, uid: u32) {
        let mut c = self.charges(uid);
        if let Some(n) = c.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                c.remove(&uid);
            }
            self.pinned.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// [`Self::charge`] as a guard that gives the charge back on drop: for
    /// a descriptor that is not an open file's (a POSIX lock owner's).
    pub fn charge_held(self: &Arc<Self>, uid: u32) -> Option<Charge<T>> {
        self.charge(uid).then(|| Charge {
            budget: self.clone(),
            uid,
        })
    }

    /// Pinned files of `uid` now (tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn charged(&self, uid: u32) -> usize {
        self.charges(uid).get(&uid).copied().unwrap_or(0)
    }

    /// Puts `file`, which has just got its descriptor, on ring `ring`,
    /// evicting others there in CLOCK order.
    pub fn admit(&self, ring: usize, file: Weak<T>) {
        self.ring.admit(ring, file);
    }
}

/// One pinned descriptor charged to a user, given back on drop.
pub struct Charge<T: Cached> {
    budget: Arc<OpenBudget<T>>,
    uid: u32,
}

impl<T: Cached> Drop for Charge<T> {
    fn drop(&mut self) {
        self.budget.uncharge(self.uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[derive(Default)]
    struct File {
        evicted: AtomicBool,
    }

    impl Cached for File {
        fn take_referenced(&self) -> bool {
            false
        }

        fn evict_fd(&self) {
            self.evicted.store(true, Ordering::Relaxed);
        }
    }

    #[test]
    fn one_user_cannot_pin_another_users_share() {
        let b: OpenBudget<File> = OpenBudget::with(16, 6, 2);
        assert!(b.charge(1000) && b.charge(1000));
        // Past its share: that user only.
        assert!(!b.charge(1000));
        assert!(b.charge(0) && b.charge(0));
        assert!(b.charge(7) && b.charge(7));
        // The pool is full: a fourth user waits for a release.
        assert!(!b.charge(8));
        assert_eq!((b.pinned(), b.charged(1000)), (6, 2));
        b.uncharge(1000);
        assert!(b.charge(8));
        assert!(!b.charge(1000));
        // A forced charge goes past both, and counts.
        b.force(0);
        assert_eq!((b.pinned(), b.charged(0)), (7, 3));
        for _ in 0..3 {
            b.uncharge(0);
        }
        assert_eq!((b.pinned(), b.charged(0)), (4, 0));
        // Nothing to give back: nothing changes.
        b.uncharge(0);
        assert_eq!(b.pinned(), 4);
        // A held charge goes back with its guard.
        let b = Arc::new(b);
        let c = b.charge_held(0).expect("within the share");
        assert_eq!(b.pinned(), 5);
        drop(c);
        assert_eq!(b.pinned(), 4);
    }

    #[test]
    fn the_budget_splits_descriptors_between_used_and_pinned_files() {
        // 512 files: 256 that keep their descriptor while used (whole
        // rings), 256 pinned, 32 of one user; and the budget made of them.
        assert_eq!(OpenBudget::<File>::sizes(1024), (256, 256, 32));
        let b: OpenBudget<File> = OpenBudget::new(1024);
        assert_eq!((b.ring.capacity(), b.pool, b.share()), (256, 256, 32));
        // The smallest budget still lets every user pin one file.
        let b: OpenBudget<File> = OpenBudget::new(0);
        assert_eq!((b.ring.capacity(), b.pool, b.share()), (RINGS, SHARES, 1));
    }

    #[test]
    fn files_past_the_rings_are_evicted() {
        let b: OpenBudget<File> = OpenBudget::with(16, 8, 1);
        let files: Vec<Arc<File>> = (0..3).map(|_| Arc::new(File::default())).collect();
        // One file per ring: the second on ring 5 evicts the first.
        b.admit(5, Arc::downgrade(&files[0]));
        b.admit(6, Arc::downgrade(&files[1]));
        b.admit(5, Arc::downgrade(&files[2]));
        let evicted: Vec<bool> = files.iter().map(|f| f.evicted.load(Ordering::Relaxed)).collect();
        assert_eq!(evicted, [true, false, false]);
    }
}

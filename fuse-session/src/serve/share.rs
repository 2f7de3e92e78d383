//! Shares of a bounded number of places by caller uid: the `/dev/fuse`
//! pool's handler slots ([`crate::pool`]) and the async adapter's futures
//! in flight (`max_in_flight`, [`crate::asyncfs`]).
//!
//! Of `max` places (at least [`SHARED_FROM`]), the last [`reserve`]`(max)`
//! are reserved: anyone takes
//! one of the others (one atomic add, as an unshared bound costs), but a
//! place past them goes only to a uid that holds no reserved place yet. So
//! one uid, whatever it sends, holds at most `max - reserve + 1` places,
//! and every other uid finds one free (the next request of a uid that
//! holds none starts at once) until `reserve` distinct uids hold a
//! reserved place each. A request refused a place waits, as it would at
//! the bound (parked by the pool, or its reader waiting at `max_in_flight`);
//! none is answered an error.
//!
//! The reserved places' holders are kept under a lock taken only while
//! the places in use are past the open ones: a session below that costs
//! nothing more than a single counter.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

/// The reserved places out of `max`: a quarter, from 2 to 16; none below
/// [`SHARED_FROM`] places, where holding back two would cost one user
/// alone too large a part of a small bound.
pub(crate) fn reserve(max: usize) -> usize {
    if max < SHARED_FROM {
        return 0;
    }
    (max / 4).clamp(2, 16)
}

/// The smallest bound that is shared by uid.
pub(crate) const SHARED_FROM: usize = 8;

/// A place taken, to give back with [`Shares::give_back`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Place {
    /// One of the places anyone may take.
    Open,
    /// A reserved place, held by this uid.
    Reserved(u32),
}

/// Why a place was not given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Every place is taken.
    Full,
    /// Only reserved places are free, and this uid holds one already.
    Share,
}

/// `max` places, shared by uid as the module docs say.
pub(crate) struct Shares {
    max: usize,
    open: usize,
    used: AtomicUsize,
    /// The uid of each reserved place taken (at most one entry a uid).
    reserved: Mutex<Vec<u32>>,
}

impl Shares {
    /// `max` places (at least 1).
    pub(crate) fn new(max: usize) -> Shares {
        let max = max.max(1);
        Shares {
            max,
            open: max - reserve(max),
            used: AtomicUsize::new(0),
            reserved: Mutex::new(Vec::new()),
        }
    }

    /// Takes a place for a request of `uid`.
    pub(crate) fn take(&self, uid: u32) -> Result<Place, Refused> {
        let n = self.used.fetch_add(1, SeqCst);
        if n < self.open {
            return Ok(Place::Open);
        }
        if n >= self.max {
            self.used.fetch_sub(1, SeqCst);
            return Err(Refused::Full);
        }
        let mut r = self.reserved.lock().unwrap_or_else(|e| e.into_inner());
        if r.contains(&uid) {
            drop(r);
            self.used.fetch_sub(1, SeqCst);
            return Err(Refused::Share);
        }
        r.push(uid);
        Ok(Place::Reserved(uid))
    }

    /// Gives `place` back.
    pub(crate) fn give_back(&self, place: Place) {
        if let Place::Reserved(uid) = place {
            let mut r = self.reserved.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = r.iter().position(|u| *u == uid) {
                r.swap_remove(i);
            }
        }
        self.used.fetch_sub(1, SeqCst);
    }

    /// Whether [`Shares::take`] would refuse `uid` now.
    pub(crate) fn refuses(&self, uid: u32) -> bool {
        let n = self.used.load(SeqCst);
        n >= self.max
            || (n >= self.open
                && self
                    .reserved
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains(&uid))
    }

    /// Whether every place is taken.
    pub(crate) fn full(&self) -> bool {
        self.used.load(SeqCst) >= self.max
    }

    /// Places taken now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(SeqCst)
    }

    /// The number of places.
    pub(crate) fn max(&self) -> usize {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One uid takes every open place and one reserved one; each other uid
    /// then gets one, until the reserved places are all held.
    #[test]
    fn one_uid_leaves_the_reserve_to_the_others() {
        let s = Shares::new(16);
        assert_eq!(reserve(16), 4);
        let mut held: Vec<Place> = (0..13).map(|_| s.take(7).expect("a place")).collect();
        assert_eq!(held[12], Place::Reserved(7));
        assert_eq!(s.take(7), Err(Refused::Share));
        for uid in [0, 1] {
            held.push(s.take(uid).expect("a reserved place"));
            assert_eq!(s.take(uid), Err(Refused::Share), "uid {uid} again");
        }
        held.push(s.take(2).expect("the last reserved place"));
        assert_eq!(s.take(3), Err(Refused::Full));
        assert!(s.full() && s.refuses(3));
        // A reserved place given back goes to whoever holds none.
        let i = held
            .iter()
            .position(|p| *p == Place::Reserved(1))
            .expect("uid 1's");
        s.give_back(held.swap_remove(i));
        assert!(s.refuses(0) && !s.refuses(3));
        held.push(s.take(3).expect("uid 3's turn"));
        for p in held {
            s.give_back(p);
        }
        assert_eq!(s.used(), 0);
        assert!(s.reserved.lock().unwrap().is_empty());
    }

    /// A bound below `SHARED_FROM` is one uid's whole; from it on, two
    /// places are kept for the others.
    #[test]
    fn small_bounds() {
        let s = Shares::new(SHARED_FROM - 1);
        let held: Vec<Place> = (1..SHARED_FROM).map(|_| s.take(7).expect("a place")).collect();
        assert_eq!(s.take(8), Err(Refused::Full));
        held.into_iter().for_each(|p| s.give_back(p));
        let s = Shares::new(SHARED_FROM);
        let held: Vec<Place> = (0..SHARED_FROM - 1)
            .map(|_| s.take(7).expect("a place"))
            .collect();
        assert_eq!(s.take(7), Err(Refused::Share));
        let other = s.take(8).expect("the other uid's");
        held.into_iter().for_each(|p| s.give_back(p));
        s.give_back(other);
        assert_eq!(s.used(), 0);
    }
}

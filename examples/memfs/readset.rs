//! The POSIX read locks of one file, as an interval tree: a treap (a binary
//! search tree kept balanced by random priorities) of records keyed by
//! `(start, owner)`, in which every subtree knows how far its records reach
//! (their largest end) and how far those of a second owner reach.
//!
//! Read locks of different owners may overlap and nest freely, so a map
//! keyed by start cannot tell whether one of them covers a point without
//! scanning back through all that start before it. With the two reaches a
//! search for "a read lock of an owner other than O overlapping [s, e]"
//! walks one path from the root: O(log n), whatever the number of records
//! or owners. Insertion and removal are O(log n) too.

use std::hash::{BuildHasher, RandomState};

/// A read lock found by [`ReadSet::find`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub start: u64,
    /// Inclusive.
    pub end: u64,
    pub owner: u64,
    pub pid: u32,
}

/// How far a subtree's records reach: the largest end with its owner, and
/// the largest end among the other owners' records.
#[derive(Clone, Copy, Debug)]
struct Reach {
    first: (u64, u64),
    second: Option<(u64, u64)>,
}

impl Reach {
    /// The largest end among records of owners other than `owner`.
    fn beyond(&self, owner: u64) -> Option<u64> {
        if self.first.1 != owner {
            Some(self.first.0)
        } else {
            self.second.map(|(end, _)| end)
        }
    }
}

struct Node {
    start: u64,
    owner: u64,
    end: u64,
    pid: u32,
    prio: u64,
    left: Link,
    right: Link,
    reach: Reach,
}

type Link = Option<Box<Node>>;

impl Node {
    fn key(&self) -> (u64, u64) {
        (self.start, self.owner)
    }

    /// Recomputes `reach` from the node and its children. The largest end
    /// of owners other than X in a subtree is its `first` when that is not
    /// X's, else its `second`: so the node's own record and the children's
    /// two reaches are all the candidates.
    fn update(&mut self) {
        let mut cands = [Some((self.end, self.owner)), None, None, None, None];
        for (i, child) in [&self.left, &self.right].into_iter().enumerate() {
            if let Some(c) = child {
                cands[1 + 2 * i] = Some(c.reach.first);
                cands[2 + 2 * i] = c.reach.second;
            }
        }
        let first = cands
            .iter()
            .flatten()
            .copied()
            .max_by_key(|c| c.0)
            .unwrap_or((self.end, self.owner));
        let second = cands
            .iter()
            .flatten()
            .copied()
            .filter(|c| c.1 != first.1)
            .max_by_key(|c| c.0);
        self.reach = Reach { first, second };
    }
}

/// Splits `t` into the keys before `key` (or up to it, with `inclusive`)
/// and the rest.
fn split(t: Link, key: (u64, u64), inclusive: bool) -> (Link, Link) {
    let Some(mut n) = t else {
        return (None, None);
    };
    step();
    let goes_left = if inclusive { n.key() <= key } else { n.key() < key };
    if goes_left {
        let (l, r) = split(n.right.take(), key, inclusive);
        n.right = l;
        n.update();
        (Some(n), r)
    } else {
        let (l, r) = split(n.left.take(), key, inclusive);
        n.left = r;
        n.update();
        (l, Some(n))
    }
}

/// Joins two treaps, every key of `a` before every key of `b`.
fn merge(a: Link, b: Link) -> Link {
    match (a, b) {
        (None, b) => b,
        (a, None) => a,
        (Some(mut a), Some(mut b)) => {
            step();
            if a.prio > b.prio {
                a.right = merge(a.right.take(), Some(b));
                a.update();
                Some(a)
            } else {
                b.left = merge(Some(a), b.left.take());
                b.update();
                Some(b)
            }
        }
    }
}

/// The read locks of a file.
pub struct ReadSet {
    root: Link,
    len: usize,
    /// State of the priority generator (xorshift), seeded at random so that
    /// no caller can choose lock ranges that unbalance the tree.
    rng: u64,
}

impl Default for ReadSet {
    fn default() -> Self {
        ReadSet {
            root: None,
            len: 0,
            rng: RandomState::new().hash_one(0x6d656d6673u64) | 1,
        }
    }
}

impl ReadSet {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    fn next_prio(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    /// Adds `owner`'s read lock `[start, end]` (the caller keeps an owner's
    /// records disjoint, so `(start, owner)` is not present).
    pub fn insert(&mut self, start: u64, end: u64, owner: u64, pid: u32) {
        let mut node = Box::new(Node {
            start,
            owner,
            end,
            pid,
            prio: self.next_prio(),
            left: None,
            right: None,
            reach: Reach {
                first: (end, owner),
                second: None,
            },
        });
        node.update();
        let (l, r) = split(self.root.take(), (start, owner), false);
        self.root = merge(merge(l, Some(node)), r);
        self.len += 1;
    }

    /// Removes `owner`'s read lock starting at `start`; whether it was there.
    pub fn remove(&mut self, start: u64, owner: u64) -> bool {
        let (l, rest) = split(self.root.take(), (start, owner), false);
        let (mid, r) = split(rest, (start, owner), true);
        self.root = merge(l, r);
        let found = mid.is_some();
        if found {
            self.len -= 1;
        }
        found
    }

    /// The read lock of an owner other than `owner` that overlaps `[s, e]`
    /// and starts first (the one the kernel would report).
    ///
    /// Walks one path: when the left subtree holds another owner's record
    /// reaching `s`, either one of them overlaps (and starts before this
    /// node), or all of them start after `e`, and then so does everything
    /// at and right of this node.
    pub fn find(&self, s: u64, e: u64, owner: u64) -> Option<Found> {
        let mut cur = self.root.as_deref();
        while let Some(n) = cur {
            step();
            if n.reach.beyond(owner).is_none_or(|end| end < s) {
                return None;
            }
            if let Some(l) = n.left.as_deref()
                && l.reach.beyond(owner).is_some_and(|end| end >= s)
            {
                cur = Some(l);
                continue;
            }
            if n.start > e {
                return None;
            }
            if n.owner != owner && n.end >= s {
                return Some(Found {
                    start: n.start,
                    end: n.end,
                    owner: n.owner,
                    pid: n.pid,
                });
            }
            cur = n.right.as_deref();
        }
        None
    }
}

/// Counts a node visited (unit tests count them to check that operations
/// do not scan); nothing outside tests.
#[inline]
fn step() {
    #[cfg(test)]
    tests::STEPS.with(|s| s.set(s.get() + 1));
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        pub static STEPS: Cell<u64> = const { Cell::new(0) };
    }

    /// Nodes visited by `f` on this thread.
    pub fn steps_of<T>(f: impl FnOnce() -> T) -> (T, u64) {
        let before = STEPS.with(Cell::get);
        let t = f();
        (t, STEPS.with(Cell::get) - before)
    }

    /// The answer by brute force, for comparison.
    fn naive(recs: &[(u64, u64, u64)], s: u64, e: u64, owner: u64) -> bool {
        recs.iter().any(|&(a, b, o)| o != owner && a <= e && b >= s)
    }

    #[test]
    fn find_agrees_with_a_scan_on_nested_ranges() {
        let mut set = ReadSet::default();
        let mut recs = Vec::new();
        // Nested and overlapping ranges of a few owners, from a fixed
        // pseudo-random sequence.
        let mut x = 12345u64;
        let mut next = |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        for _ in 0..400 {
            let start = next(1000);
            let end = start + next(300);
            let owner = next(5);
            if recs.iter().any(|&(a, _, o)| a == start && o == owner) {
                continue;
            }
            set.insert(start, end, owner, owner as u32);
            recs.push((start, end, owner));
        }
        for _ in 0..2000 {
            let s = next(1400);
            let e = s + next(50);
            let owner = next(6);
            let got = set.find(s, e, owner);
            assert_eq!(got.is_some(), naive(&recs, s, e, owner), "[{s}, {e}] for {owner}");
            if let Some(f) = got {
                assert!(f.owner != owner && f.start <= e && f.end >= s, "{f:?}");
                assert!(recs.contains(&(f.start, f.end, f.owner)));
                let first = recs
                    .iter()
                    .filter(|&&(a, b, o)| o != owner && a <= e && b >= s)
                    .map(|&(a, _, o)| (a, o))
                    .min();
                assert_eq!(first, Some((f.start, f.owner)), "the first one");
            }
        }
        // Remove half and check again.
        for (i, &(a, _, o)) in recs.clone().iter().enumerate() {
            if i % 2 == 0 {
                assert!(set.remove(a, o));
            }
        }
        let kept: Vec<_> = recs
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .map(|(_, r)| *r)
            .collect();
        assert_eq!(set.len(), kept.len());
        for s in (0..1400).step_by(7) {
            for owner in 0..6 {
                assert_eq!(set.find(s, s + 3, owner).is_some(), naive(&kept, s, s + 3, owner));
            }
        }
        assert!(!set.remove(kept[0].0, kept[0].1 + 100));
    }

    #[test]
    fn one_owner_covering_everything_is_invisible_to_itself() {
        let mut set = ReadSet::default();
        set.insert(0, u64::MAX, 7, 70);
        assert_eq!(set.find(0, u64::MAX, 7), None);
        assert_eq!(
            set.find(5, 5, 8),
            Some(Found {
                start: 0,
                end: u64::MAX,
                owner: 7,
                pid: 70
            })
        );
    }

    #[test]
    fn operations_visit_a_logarithmic_number_of_nodes() {
        let mut set = ReadSet::default();
        // Many owners with disjoint one-byte locks, then a long lock of
        // another owner that covers them all.
        for i in 0..20_000u64 {
            set.insert(2 * i, 2 * i, i, 1);
        }
        set.insert(0, u64::MAX, u64::MAX, 1);
        let (_, ins) = steps_of(|| set.insert(1_000_001, 1_000_001, 3, 1));
        let (found, look) = steps_of(|| set.find(40_000, 50_000, u64::MAX));
        assert!(found.is_none());
        let (_, rm) = steps_of(|| set.remove(2 * 777, 777));
        // A balanced tree of 20 000 records is about 15 levels deep; a
        // treap's expected depth is under three times that. A scan would
        // visit 20 000.
        for (what, n) in [("insert", ins), ("find", look), ("remove", rm)] {
            assert!(n < 300, "{what} visited {n} nodes");
        }
    }
}

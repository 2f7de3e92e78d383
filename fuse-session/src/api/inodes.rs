//! The library-owned inode table under the node layer ([`crate::node`]) and
//! the path layer ([`crate::path`]): node ids, generations and lookup counts.
//!
//! # What it counts
//!
//! The kernel holds one lookup reference per successful entry reply (LOOKUP,
//! MKNOD, MKDIR, SYMLINK, LINK, CREATE, TMPFILE, and each READDIRPLUS entry
//! [`crate::reply::DirPlusAdd::counts_lookup`] reports) and gives them back
//! with FORGET and BATCH_FORGET. The layers call [`InodeTable::acquire`]
//! (or [`InodeTable::acquire_ino`]) *before* they send such a reply, so a
//! FORGET can never overtake the count it returns, and give a reference
//! back with [`InodeTable::forget`] when the entry was not sent after all
//! (a READDIRPLUS entry that did not fit). An entry whose count reaches 0
//! is dropped, except the root, which lives as long as the table.
//!
//! # Numbers and generations
//!
//! Node ids are handed out per shard (`ino % SHARDS` is the shard) and a
//! dropped entry's number goes back to its shard's free list with its
//! generation plus one, so `(ino, generation)` never names two different
//! nodes during the table's life, as the kernel (and NFS export) requires.
//!
//! # Locking
//!
//! [`SHARDS`] shards, each a `Mutex` over two maps: node id → entry, and the
//! optional identity key → node id. An entry with a key lives in the shard
//! its key hashes to (its number is allocated there), so finding or adding
//! a keyed node takes exactly one shard lock. No lock is shared by all
//! requests, and no shard lock is held while anything outside this module
//! runs (values are cloned out; dropped values are dropped after unlocking).

use crate::types::Inode;
use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};

/// Number of shards (a power of two).
pub const SHARDS: usize = 64;

/// One node the kernel knows.
struct Slot<K, V> {
    value: V,
    key: Option<K>,
    generation: u64,
    lookups: u64,
}

struct Shard<K, V> {
    nodes: HashMap<u64, Slot<K, V>>,
    keys: HashMap<K, u64>,
    /// Numbers free for reuse, with the generation their next user gets.
    free: Vec<(u64, u64)>,
    /// Next never-used multiple of `SHARDS` (plus this shard's index).
    fresh: u64,
}

/// What [`InodeTable::forget`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Forgotten<V> {
    /// The count went down and is still above 0.
    Kept,
    /// The count reached 0 and the entry was dropped (its value is returned,
    /// to be dropped by the caller outside any lock of its own).
    Dropped(V),
    /// The node is not in the table (logged).
    Unknown,
}

/// A sharded table of the nodes the kernel holds references to.
///
/// `K` identifies a node to the layer above (so that the same node found
/// under two names gets one node id), `V` is what the layer keeps per node
/// (usually an `Arc`).
///
/// ```
/// use fuse_session::inodes::{Forgotten, InodeTable};
/// use fuse_session::Inode;
///
/// let table: InodeTable<&str, u32> = InodeTable::new(0);
/// let (a, gen_a) = table.acquire("a", || 10); // LOOKUP of "a" answered
/// let (again, _) = table.acquire("a", || unreachable!()); // and again
/// assert_eq!(a, again);
/// assert_eq!(table.lookups(a), Some(2));
/// assert_eq!(table.forget(a, 2), Forgotten::Dropped(10)); // FORGET a, 2
/// let (b, gen_b) = table.acquire("b", || 11);
/// assert!(b != a || gen_b > gen_a, "a reused number gets a new generation");
/// assert_eq!(table.len(), 2); // the root and "b"
/// ```
pub struct InodeTable<K, V> {
    shards: Box<[Mutex<Shard<K, V>>]>,
    hasher: RandomState,
    mirror: Option<Arc<dyn TableMirror<K>>>,
}

/// Where a table writes what a successor needs to rebuild it (memory a
/// keeper holds, as the path layer's kept tree). Every call is made under the shard
/// lock of the node it names, before the change is seen by anyone, so the
/// mirror of a slot never runs behind the slot (a crash between the mirror
/// and the reply leaves a count too high, never too low).
pub trait TableMirror<K>: Send + Sync {
    /// Shard `shard` will hand out numbers from `next` on (its never-used
    /// counter went up).
    fn fresh(&self, shard: usize, next: u64);
    /// Node `ino` was added with `generation`, one lookup and `key`.
    fn live(&self, ino: u64, generation: u64, key: Option<&K>);
    /// The lookup count of node `ino` is now `n` (above 0).
    fn lookups(&self, ino: u64, n: u64);
    /// Node `ino` was dropped; its next user gets `next_generation`.
    fn freed(&self, ino: u64, next_generation: u64);
}

/// A node a table is rebuilt with ([`InodeTable::rebuild`]).
pub struct Restored<K, V> {
    /// Its node id.
    pub ino: u64,
    /// Its generation.
    pub generation: u64,
    /// Its lookup count.
    pub lookups: u64,
    /// Its identity key.
    pub key: Option<K>,
    /// The layer's value.
    pub value: V,
}

thread_local! {
    /// Where this thread allocates numbers for unkeyed nodes (spreads
    /// threads over shards without a shared counter).
    static NEXT_SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

impl<K: Hash + Eq + Clone, V: Clone> InodeTable<K, V> {
    /// A table holding only the root ([`Inode::ROOT`], generation 0), whose
    /// value is `root`. The root is never dropped.
    pub fn new(root: V) -> Self {
        let shards: Box<[_]> = (0..SHARDS)
            .map(|i| {
                Mutex::new(Shard {
                    nodes: HashMap::new(),
                    keys: HashMap::new(),
                    free: Vec::new(),
                    // 0 is no node and 1 is the root: shards 0 and 1 start one round later.
                    fresh: if i <= 1 { 1 } else { 0 },
                })
            })
            .collect();
        let t = Self {
            shards,
            hasher: RandomState::new(),
            mirror: None,
        };
        t.shard(Inode::ROOT.0).nodes.insert(
            Inode::ROOT.0,
            Slot {
                value: root,
                key: None,
                generation: 0,
                lookups: 0,
            },
        );
        t
    }

    /// [`InodeTable::new`], with every change written to `mirror` too.
    pub fn with_mirror(root: V, mirror: Arc<dyn TableMirror<K>>) -> Self {
        let mut t = Self::new(root);
        t.mirror = Some(mirror);
        t
    }

    /// The table a predecessor's mirror describes: the root, the nodes in
    /// `live`, the numbers in `free` (each with the generation its next
    /// user gets), and each shard's never-used counter at least `fresh[i]`.
    /// Numbers neither live nor free nor below a counter are never handed
    /// out. A keyed node is found by its key only if the key still hashes
    /// to the node's shard (keys hash anew in each process): otherwise it
    /// is kept without its key.
    pub fn rebuild(
        root: V,
        mirror: Arc<dyn TableMirror<K>>,
        live: Vec<Restored<K, V>>,
        free: Vec<(u64, u64)>,
        fresh: &[u64],
    ) -> Self {
        let t = Self::with_mirror(root, mirror);
        for (i, &f) in fresh.iter().enumerate().take(SHARDS) {
            let mut s = t.shard(i as u64);
            s.fresh = s.fresh.max(f);
        }
        for r in live {
            if r.ino <= Inode::ROOT.0 {
                continue;
            }
            let key = r.key.filter(|k| t.key_shard(k) == (r.ino as usize) % SHARDS);
            let mut s = t.shard(r.ino);
            let above = r.ino / SHARDS as u64 + 1;
            s.fresh = s.fresh.max(above);
            if let Some(k) = &key {
                s.keys.insert(k.clone(), r.ino);
            }
            s.nodes.insert(
                r.ino,
                Slot {
                    value: r.value,
                    key,
                    generation: r.generation,
                    lookups: r.lookups.max(1),
                },
            );
        }
        for (ino, generation) in free {
            let mut s = t.shard(ino);
            if ino > Inode::ROOT.0 && !s.nodes.contains_key(&ino) {
                s.free.push((ino, generation));
            }
        }
        t
    }

    /// Runs `f` under the shard lock of `ino` if the table holds it with
    /// `generation` (a layer's own record of the node, kept in step with
    /// the table's: no other node can take the number meanwhile).
    pub fn with_node<R>(&self, ino: Inode, generation: u64, f: impl FnOnce() -> R) -> Option<R> {
        let s = self.shard(ino.0);
        let here = s.nodes.get(&ino.0).is_some_and(|n| n.generation == generation);
        let r = here.then(f);
        drop(s);
        r
    }

    fn shard(&self, index_or_ino: u64) -> MutexGuard<'_, Shard<K, V>> {
        self.shards[(index_or_ino as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn key_shard(&self, key: &K) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    /// Allocates a number in shard `index` (locked as `s`).
    fn allocate(&self, s: &mut Shard<K, V>, index: usize) -> (u64, u64) {
        if let Some(reused) = s.free.pop() {
            return reused;
        }
        let ino = s.fresh * SHARDS as u64 + index as u64;
        s.fresh += 1;
        if let Some(m) = &self.mirror {
            m.fresh(index, s.fresh);
        }
        (ino, 0)
    }

    /// Takes one lookup reference on the node identified by `key`, adding
    /// it (with the value `make` returns) if the kernel does not know it
    /// yet. Returns its node id and generation. Call it before sending the
    /// entry reply.
    pub fn acquire(&self, key: K, make: impl FnOnce() -> V) -> (Inode, u64) {
        let index = self.key_shard(&key);
        let mut s = self.shard(index as u64);
        if let Some(&ino) = s.keys.get(&key)
            && let Some(slot) = s.nodes.get_mut(&ino)
        {
            slot.lookups += 1;
            if let Some(m) = &self.mirror {
                m.lookups(ino, slot.lookups);
            }
            return (Inode(ino), slot.generation);
        }
        let (ino, generation) = self.allocate(&mut s, index);
        if let Some(m) = &self.mirror {
            m.live(ino, generation, Some(&key));
        }
        s.keys.insert(key.clone(), ino);
        s.nodes.insert(
            ino,
            Slot {
                value: make(),
                key: Some(key),
                generation,
                lookups: 1,
            },
        );
        (Inode(ino), generation)
    }

    /// Adds a node that has no identity key, with one lookup reference.
    pub fn insert(&self, value: V) -> (Inode, u64) {
        let index = thread_shard();
        let mut s = self.shard(index as u64);
        let (ino, generation) = self.allocate(&mut s, index);
        if let Some(m) = &self.mirror {
            m.live(ino, generation, None);
        }
        s.nodes.insert(
            ino,
            Slot {
                value,
                key: None,
                generation,
                lookups: 1,
            },
        );
        (Inode(ino), generation)
    }

    /// Takes one more lookup reference on `ino` if it is still in the table
    /// (its value and generation), `None` if it was dropped.
    pub fn acquire_ino(&self, ino: Inode) -> Option<(V, u64)> {
        let mut s = self.shard(ino.0);
        let slot = s.nodes.get_mut(&ino.0)?;
        slot.lookups += 1;
        if let Some(m) = &self.mirror
            && ino != Inode::ROOT
        {
            m.lookups(ino.0, slot.lookups);
        }
        Some((slot.value.clone(), slot.generation))
    }

    /// Gives back `n` lookup references of `ino` (FORGET). At 0 the entry
    /// is dropped (never the root). A FORGET of more than the count is
    /// logged and drops the entry; of an unknown node is logged.
    pub fn forget(&self, ino: Inode, n: u64) -> Forgotten<V> {
        let mut s = self.shard(ino.0);
        let Some(slot) = s.nodes.get_mut(&ino.0) else {
            drop(s);
            log::warn!("FORGET of node {ino}, which the table does not hold (ignored)");
            return Forgotten::Unknown;
        };
        if n > slot.lookups {
            log::warn!(
                "FORGET of {n} references of node {ino}, which has {}",
                slot.lookups
            );
        }
        slot.lookups = slot.lookups.saturating_sub(n);
        if slot.lookups > 0 || ino == Inode::ROOT {
            if let Some(m) = &self.mirror
                && ino != Inode::ROOT
            {
                m.lookups(ino.0, slot.lookups);
            }
            return Forgotten::Kept;
        }
        let Some(slot) = s.nodes.remove(&ino.0) else {
            return Forgotten::Unknown;
        };
        if let Some(k) = &slot.key {
            s.keys.remove(k);
        }
        s.free.push((ino.0, slot.generation.wrapping_add(1)));
        if let Some(m) = &self.mirror {
            m.freed(ino.0, slot.generation.wrapping_add(1));
        }
        drop(s);
        Forgotten::Dropped(slot.value)
    }

    /// The value of `ino`, if the table holds it.
    pub fn get(&self, ino: Inode) -> Option<V> {
        self.shard(ino.0).nodes.get(&ino.0).map(|s| s.value.clone())
    }

    /// The node id of `key`, if the kernel knows that node.
    pub fn find(&self, key: &K) -> Option<Inode> {
        let s = self.shard(self.key_shard(key) as u64);
        s.keys.get(key).map(|&i| Inode(i))
    }

    /// The lookup count of `ino` (`None`: not in the table).
    pub fn lookups(&self, ino: Inode) -> Option<u64> {
        self.shard(ino.0).nodes.get(&ino.0).map(|s| s.lookups)
    }

    /// The generation of `ino` (`None`: not in the table).
    pub fn generation(&self, ino: Inode) -> Option<u64> {
        self.shard(ino.0).nodes.get(&ino.0).map(|s| s.generation)
    }

    /// How many nodes the table holds, the root included (locks each shard
    /// in turn: for tests and statistics).
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|i| self.shard(i as u64).nodes.len()).sum()
    }

    /// Whether the table holds only the root.
    pub fn is_empty(&self) -> bool {
        self.len() <= 1
    }

    /// Every node with its lookup count, sorted (for tests and diagnostics).
    pub fn counts(&self) -> Vec<(Inode, u64)> {
        let mut v: Vec<_> = (0..SHARDS)
            .flat_map(|i| {
                self.shard(i as u64)
                    .nodes
                    .iter()
                    .map(|(&ino, s)| (Inode(ino), s.lookups))
                    .collect::<Vec<_>>()
            })
            .collect();
        v.sort();
        v
    }
}

/// Open files of a layer: file handle → value, sharded like the inode
/// table (`fh % SHARDS` is the shard; a thread allocates in a shard of its
/// own choosing, so opens on different threads do not meet on one lock).
pub(crate) struct HandleTable<T> {
    shards: Box<[Mutex<HandleShard<T>>]>,
}

/// Open handles of one shard, and the count of handles it gave out.
type HandleShard<T> = (HashMap<u64, T>, u64);

impl<T: Clone> HandleTable<T> {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new((HashMap::new(), 0))).collect(),
        }
    }

    /// A table whose shard `i` hands out numbers above `counts[i]` (the
    /// numbers a predecessor gave), holding `open` under their numbers.
    pub(crate) fn rebuild(counts: &[u64], open: Vec<(u64, T)>) -> Self {
        let t = Self::new();
        for (i, &c) in counts.iter().enumerate().take(SHARDS) {
            t.shard(i as u64).1 = c / SHARDS as u64;
        }
        for (fh, v) in open {
            let mut s = t.shard(fh);
            s.1 = s.1.max(fh / SHARDS as u64);
            s.0.insert(fh, v);
        }
        t
    }

    /// Stores `value` under `fh`, a number this table gave out before
    /// (a file opened again under the number the kernel holds).
    pub(crate) fn insert_at(&self, fh: u64, value: T) {
        self.shard(fh).0.insert(fh, value);
    }

    fn shard(&self, i: u64) -> MutexGuard<'_, HandleShard<T>> {
        self.shards[(i as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Stores `value` under a new handle.
    pub(crate) fn insert(&self, value: T) -> u64 {
        let index = thread_shard() as u64;
        let mut s = self.shard(index);
        s.1 += 1;
        let fh = s.1 * SHARDS as u64 + index;
        s.0.insert(fh, value);
        fh
    }

    pub(crate) fn get(&self, fh: u64) -> Option<T> {
        self.shard(fh).0.get(&fh).cloned()
    }

    pub(crate) fn remove(&self, fh: u64) -> Option<T> {
        self.shard(fh).0.remove(&fh)
    }

    pub(crate) fn len(&self) -> usize {
        (0..SHARDS).map(|i| self.shard(i as u64).0.len()).sum()
    }
}

/// How the open files of one node do I/O: through one kernel backing file,
/// or served by the daemon, never both at once (the kernel fails an open
/// whose backing file differs from the one its inode uses, or that mixes
/// the two kinds).
#[derive(Default)]
pub(crate) struct OpenModes {
    backing: Option<crate::backing::BackingFile>,
    passthrough: usize,
    served: usize,
}

impl OpenModes {
    /// A new open that offers `backing` (or none): the backing file it
    /// gets. The node's backing file if it has one (the offered one is
    /// dropped), the offered one if the node has no served opens, none
    /// otherwise; an open without one joins the passthrough opens if any.
    pub(crate) fn attach(
        &mut self,
        backing: Option<crate::backing::BackingFile>,
    ) -> Option<crate::backing::BackingFile> {
        let got = match backing {
            Some(b) if self.served == 0 => Some(self.backing.get_or_insert(b).clone()),
            None if self.passthrough > 0 => self.backing.clone(),
            _ => None,
        };
        match got {
            Some(_) => self.passthrough += 1,
            None => self.served += 1,
        }
        got
    }

    /// An open attached with (`passthrough`) or without a backing file
    /// was released; the backing file goes with the last passthrough open.
    pub(crate) fn detach(&mut self, passthrough: bool) {
        if passthrough {
            self.passthrough = self.passthrough.saturating_sub(1);
            if self.passthrough == 0 {
                self.backing = None;
            }
        } else {
            self.served = self.served.saturating_sub(1);
        }
    }
}

/// The shard this thread allocates in next (rotating, starting at a
/// per-thread place).
fn thread_shard() -> usize {
    NEXT_SHARD.with(|n| {
        let mut i = n.get();
        if i == usize::MAX {
            i = (&raw const *n as usize / 64) % SHARDS;
        }
        n.set((i + 1) % SHARDS);
        i
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_unique_and_reuse_bumps_the_generation() {
        let t: InodeTable<u32, u32> = InodeTable::new(0);
        let mut seen = std::collections::HashSet::new();
        for k in 0..1000 {
            let (ino, g) = t.acquire(k, || k);
            assert!(ino.0 > 1, "0 and the root are never handed out");
            assert!(seen.insert((ino, g)));
        }
        for k in 0..1000 {
            let ino = t.find(&k).unwrap();
            assert!(matches!(t.forget(ino, 1), Forgotten::Dropped(v) if v == k));
        }
        assert!(t.is_empty());
        for k in 1000..2000 {
            let (ino, g) = t.acquire(k, || k);
            assert!(seen.insert((ino, g)), "({ino}, {g}) named another node before");
        }
        assert_eq!(t.forget(Inode(1 << 40), 1), Forgotten::Unknown);
        assert_eq!(t.forget(Inode::ROOT, 5), Forgotten::Kept);
        assert_eq!(t.get(Inode::ROOT), Some(0));
    }
}

//! A layer's node table and open files kept where the keeper holds them:
//! what a successor needs so that every node id, generation, lookup count
//! and file handle the kernel holds means the same thing again after a
//! crash. The path layer keeps its tree here ([`crate::path::PathFs::kept`]).
//!
//! A shared region ([`crate::region`]) deposited in the vault under
//! [`REGION_KEY`] holds, after a header (magic, layout, the connection it
//! was made for, the epoch of the daemon serving it):
//!
//! - each inode table shard's never-used counter, so that no number the
//!   kernel may hold is handed out again (a node beyond the records'
//!   capacity is not recorded: after a crash it answers `ESTALE`);
//! - each file handle shard's highest number, so that a RELEASE sent again
//!   never closes a newer file;
//! - one record per node id: its state and generation, lookup count,
//!   identity key and one name (parent node id and name) in two halves,
//!   the one in use named by the record's first word, so that a rename
//!   rewrites the other half and flips one word: a crash halfway leaves
//!   the old name or the new one, never a mix;
//! - one record per open file: kernel file handle, node id, open flags.
//!
//! Every node record is written under the inode table's shard lock of its
//! node ([`TableMirror`], [`crate::inodes::InodeTable::with_node`]), before
//! the request that changed it is answered. Nothing here locks or
//! allocates on the way of a request.

use crate::inodes::TableMirror;
use crate::region::{SharedRegion, load_bytes, store_bytes};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// The vault key of the kept tree's region.
pub const REGION_KEY: u64 = (1 << 62) | 0x7061_7468;
/// Node records by default: node ids the kernel may hold at once and be
/// kept (the region's pages are used only as records are).
pub const DEFAULT_NODES: usize = 1 << 18;
/// Open file records by default.
pub const DEFAULT_OPENS: usize = 1 << 16;

const MAGIC: u64 = u64::from_le_bytes(*b"FWPATH01");
const HEADER_WORDS: usize = 8;
/// Shards of the inode and handle tables ([`crate::inodes::SHARDS`]).
const SHARDS: usize = crate::inodes::SHARDS;
/// Longest name kept (`NAME_MAX`).
const NAME_MAX: usize = 255;
const NAME_WORDS: usize = NAME_MAX.div_ceil(8);
/// A name half: parent, length, the name's bytes.
const HALF_WORDS: usize = 2 + NAME_WORDS;
/// State word, lookups, key, two name halves.
const NODE_WORDS: usize = 3 + 2 * HALF_WORDS;
/// File handle, node id, flags, spare.
const OPEN_WORDS: usize = 4;
/// Probes for a free open file record.
const OPEN_PROBES: usize = 64;
/// An open file record being written.
const CLAIMED: u64 = u64::MAX;

const LIVE: u64 = 1;
const VACANT: u64 = 2;
const HALF_BIT: u64 = 1 << 2;
const GEN_SHIFT: u32 = 3;

/// Why a kept region cannot be taken over: the table the kernel's node
/// ids refer to is lost or belongs to another mount. A daemon refuses to
/// serve rather than give those ids to other files.
#[derive(Debug)]
pub struct NotRecoverable(pub String);

impl std::fmt::Display for NotRecoverable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotRecoverable {}

impl NotRecoverable {
    /// The reason, if `e` says a kept table cannot be taken over.
    pub fn reason(e: &io::Error) -> Option<String> {
        e.get_ref()
            .and_then(|i| i.downcast_ref::<NotRecoverable>())
            .map(|n| n.0.clone())
    }

    fn err(why: String) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, NotRecoverable(why))
    }
}

/// A node as its record says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptNode {
    /// Node id.
    pub ino: u64,
    /// Generation.
    pub generation: u64,
    /// Lookup count.
    pub lookups: u64,
    /// Identity key (the `st_ino` of a hard-linked file).
    pub key: Option<u64>,
    /// Parent node id and name, if it has one.
    pub name: Option<(u64, Vec<u8>)>,
}

/// An open file as its record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeptOpen {
    /// The record.
    pub slot: usize,
    /// The file handle the kernel holds.
    pub fh: u64,
    /// Its node.
    pub ino: u64,
    /// The open's flags.
    pub flags: i32,
}

/// Everything a successor rebuilds from ([`KeptTree::load`]).
#[derive(Debug, Default)]
pub struct Kept {
    /// Live nodes.
    pub nodes: Vec<KeptNode>,
    /// Freed numbers, with the generation their next user gets.
    pub free: Vec<(u64, u64)>,
    /// Each inode table shard's never-used counter.
    pub fresh: Vec<u64>,
    /// Each handle table shard's highest file handle.
    pub handles: Vec<u64>,
    /// Open files.
    pub opens: Vec<KeptOpen>,
}

/// The kept tree over its region.
#[derive(Debug)]
pub struct KeptTree {
    region: SharedRegion,
    nodes: usize,
    opens: usize,
    epoch: u64,
}

impl KeptTree {
    /// The bytes a region for `nodes` node and `opens` open file records
    /// needs.
    pub fn bytes_needed(nodes: usize, opens: usize) -> usize {
        (HEADER_WORDS + 2 * SHARDS + nodes * NODE_WORDS + opens * OPEN_WORDS) * 8
    }

    /// The kept tree in `region`: a new one when `fresh` (a new
    /// connection), else the predecessor's, in a new epoch. A kept one that
    /// is blank, of another layout, or made for another connection than
    /// `connection` (when both are known) is refused ([`NotRecoverable`]).
    pub fn open(
        region: SharedRegion,
        fresh: bool,
        connection: Option<u32>,
        nodes: usize,
        opens: usize,
    ) -> io::Result<KeptTree> {
        if region.len() < Self::bytes_needed(nodes, opens) {
            return Err(NotRecoverable::err(
                "the kept node table's region is smaller than this daemon's".into(),
            ));
        }
        let w = region.words();
        let owner = connection.map_or(0, |c| u64::from(c) + 1);
        if fresh {
            region.clear();
            w[1].store(nodes as u64, Ordering::Relaxed);
            w[2].store(opens as u64, Ordering::Relaxed);
            w[3].store(owner, Ordering::Relaxed);
            w[0].store(MAGIC, Ordering::Release);
        } else {
            match w[0].load(Ordering::Acquire) {
                0 => {
                    return Err(NotRecoverable::err(
                        "the kept node table is blank on a takeover: the record of the node ids the \
                         kernel holds is lost, and a new table would give them to other files; refusing \
                         to serve"
                            .into(),
                    ));
                }
                MAGIC => {}
                _ => {
                    return Err(NotRecoverable::err(
                        "the kept region is not a node table of this version: refusing to serve".into(),
                    ));
                }
            }
            let layout = (w[1].load(Ordering::Relaxed), w[2].load(Ordering::Relaxed));
            if layout != (nodes as u64, opens as u64) {
                return Err(NotRecoverable::err(format!(
                    "the kept node table has {} node and {} open file records, this daemon {nodes} and \
                     {opens}: refusing to serve",
                    layout.0, layout.1
                )));
            }
            let kept = w[3].load(Ordering::Relaxed);
            if kept != 0 && owner != 0 && kept != owner {
                return Err(NotRecoverable::err(format!(
                    "the kept node table belongs to connection {}, not to this one ({}): refusing to serve",
                    kept - 1,
                    owner - 1
                )));
            }
        }
        let epoch = w[4].fetch_add(1, Ordering::AcqRel) + 1;
        Ok(KeptTree {
            region,
            nodes,
            opens,
            epoch,
        })
    }

    /// How many daemons have served from this tree, this one included.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    fn fresh_word(&self, shard: usize) -> &AtomicU64 {
        &self.region.words()[HEADER_WORDS + shard % SHARDS]
    }

    fn handle_word(&self, shard: usize) -> &AtomicU64 {
        &self.region.words()[HEADER_WORDS + SHARDS + shard % SHARDS]
    }

    fn node(&self, ino: u64) -> Option<&[AtomicU64]> {
        let i = usize::try_from(ino).ok().filter(|&i| i < self.nodes)?;
        let at = HEADER_WORDS + 2 * SHARDS + i * NODE_WORDS;
        Some(&self.region.words()[at..at + NODE_WORDS])
    }

    fn open_rec(&self, slot: usize) -> &[AtomicU64] {
        let at = HEADER_WORDS + 2 * SHARDS + self.nodes * NODE_WORDS + slot * OPEN_WORDS;
        &self.region.words()[at..at + OPEN_WORDS]
    }

    fn half(r: &[AtomicU64], which: u64) -> &[AtomicU64] {
        let at = 3 + if which == 0 { 0 } else { HALF_WORDS };
        &r[at..at + HALF_WORDS]
    }

    /// Node `ino`'s name is now `name` (parent, name), or none. Call under
    /// the node's shard lock ([`crate::inodes::InodeTable::with_node`]).
    /// A name longer than `NAME_MAX` is kept as none.
    pub fn set_name(&self, ino: u64, name: Option<(u64, &[u8])>) {
        let Some(r) = self.node(ino) else { return };
        let w0 = r[0].load(Ordering::Acquire);
        let next = (w0 & HALF_BIT) ^ HALF_BIT;
        let h = Self::half(r, next);
        match name.filter(|(_, n)| n.len() <= NAME_MAX) {
            Some((parent, n)) => {
                store_bytes(&h[2..], n);
                h[1].store(n.len() as u64, Ordering::Relaxed);
                h[0].store(parent, Ordering::Relaxed);
            }
            None => h[0].store(0, Ordering::Relaxed),
        }
        r[0].store((w0 & !HALF_BIT) | next, Ordering::Release);
    }

    /// File handle `fh` was given out (call before the open is answered).
    pub fn handle_given(&self, fh: u64) {
        self.handle_word(fh as usize).fetch_max(fh, Ordering::Relaxed);
    }

    /// Records open file `fh` of node `ino`: its record, or `None` when
    /// none is free near its place (then a successor answers it `EBADF`).
    pub fn opened(&self, fh: u64, ino: u64, flags: i32) -> Option<usize> {
        if self.opens == 0 {
            return None;
        }
        let start = (fh as usize) % self.opens;
        for k in 0..OPEN_PROBES.min(self.opens) {
            let slot = (start + k) % self.opens;
            let r = self.open_rec(slot);
            if r[0]
                .compare_exchange(0, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                r[1].store(ino, Ordering::Relaxed);
                r[2].store(flags as u32 as u64, Ordering::Relaxed);
                r[0].store(fh, Ordering::Release);
                return Some(slot);
            }
        }
        log::warn!("no open file record free for file handle {fh}: a crash would lose it (EBADF)");
        None
    }

    /// Frees an open file record (call before the release is answered).
    pub fn closed(&self, slot: usize) {
        if slot < self.opens {
            self.open_rec(slot)[0].store(0, Ordering::Release);
        }
    }

    /// What a predecessor left.
    pub fn load(&self) -> Kept {
        let fresh: Vec<u64> = (0..SHARDS)
            .map(|i| self.fresh_word(i).load(Ordering::Acquire))
            .collect();
        let handles = (0..SHARDS)
            .map(|i| self.handle_word(i).load(Ordering::Acquire))
            .collect();
        let limit = fresh.iter().max().copied().unwrap_or(0).saturating_add(1) * SHARDS as u64;
        let mut kept = Kept {
            fresh,
            handles,
            ..Kept::default()
        };
        for ino in 2..limit.min(self.nodes as u64) {
            let Some(r) = self.node(ino) else { break };
            let w0 = r[0].load(Ordering::Acquire);
            let generation = w0 >> GEN_SHIFT;
            match w0 & 3 {
                LIVE => {}
                VACANT => {
                    kept.free.push((ino, generation));
                    continue;
                }
                _ => continue,
            }
            let h = Self::half(r, w0 & HALF_BIT);
            let parent = h[0].load(Ordering::Relaxed);
            let len = h[1].load(Ordering::Relaxed) as usize;
            let name = (parent != 0 && len > 0 && len <= NAME_MAX).then(|| {
                let mut n = vec![0u8; len];
                load_bytes(&h[2..], &mut n);
                (parent, n)
            });
            let key = r[2].load(Ordering::Relaxed);
            kept.nodes.push(KeptNode {
                ino,
                generation,
                lookups: r[1].load(Ordering::Relaxed),
                key: key.checked_sub(1),
                name,
            });
        }
        for slot in 0..self.opens {
            let r = self.open_rec(slot);
            let fh = r[0].load(Ordering::Acquire);
            if fh != 0 && fh != CLAIMED {
                kept.opens.push(KeptOpen {
                    slot,
                    fh,
                    ino: r[1].load(Ordering::Relaxed),
                    flags: r[2].load(Ordering::Relaxed) as u32 as i32,
                });
            } else if fh == CLAIMED {
                // Its open was never answered.
                r[0].store(0, Ordering::Release);
            }
        }
        kept
    }
}

impl TableMirror<u64> for KeptTree {
    fn fresh(&self, shard: usize, next: u64) {
        self.fresh_word(shard).fetch_max(next, Ordering::Release);
    }

    fn live(&self, ino: u64, generation: u64, key: Option<&u64>) {
        let Some(r) = self.node(ino) else { return };
        r[1].store(1, Ordering::Relaxed);
        r[2].store(key.map_or(0, |k| k.saturating_add(1)), Ordering::Relaxed);
        Self::half(r, 0)[0].store(0, Ordering::Relaxed);
        r[0].store(generation << GEN_SHIFT | LIVE, Ordering::Release);
    }

    fn lookups(&self, ino: u64, n: u64) {
        if let Some(r) = self.node(ino) {
            r[1].store(n, Ordering::Release);
        }
    }

    fn freed(&self, ino: u64, next_generation: u64) {
        if let Some(r) = self.node(ino) {
            r[1].store(0, Ordering::Relaxed);
            r[0].store(next_generation << GEN_SHIFT | VACANT, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region() -> SharedRegion {
        SharedRegion::create("test-kept-tree", KeptTree::bytes_needed(256, 16)).unwrap()
    }

    fn again(t: &KeptTree) -> SharedRegion {
        SharedRegion::from_fd(t.region.fd().try_clone_to_owned().unwrap()).unwrap()
    }

    #[test]
    fn a_successor_finds_nodes_names_and_open_files() {
        let t = KeptTree::open(region(), true, Some(7), 256, 16).unwrap();
        t.fresh(2, 3);
        t.live(66, 4, None);
        t.lookups(66, 3);
        t.set_name(66, Some((1, b"a")));
        t.set_name(66, Some((1, b"renamed")));
        t.live(130, 0, Some(&99));
        t.freed(130, 1);
        let slot = t.opened(66 * 64 + 5, 66, libc::O_RDWR).unwrap();
        t.handle_given(66 * 64 + 5);
        let next = KeptTree::open(again(&t), false, Some(7), 256, 16).unwrap();
        assert_eq!(next.epoch(), 2);
        let k = next.load();
        assert_eq!(
            k.nodes,
            vec![KeptNode {
                ino: 66,
                generation: 4,
                lookups: 3,
                key: None,
                name: Some((1, b"renamed".to_vec())),
            }]
        );
        assert_eq!(k.free, vec![(130, 1)]);
        assert_eq!(k.fresh[2], 3);
        assert_eq!(k.handles[5], 66 * 64 + 5);
        assert_eq!(
            k.opens,
            vec![KeptOpen {
                slot,
                fh: 66 * 64 + 5,
                ino: 66,
                flags: libc::O_RDWR
            }]
        );
        next.closed(slot);
        assert!(next.load().opens.is_empty());
    }

    #[test]
    fn a_blank_foreign_or_other_layout_region_is_refused_on_takeover() {
        let blank = KeptTree::open(region(), false, Some(7), 256, 16).unwrap_err();
        assert!(NotRecoverable::reason(&blank).unwrap().contains("blank"));
        let t = KeptTree::open(region(), true, Some(7), 256, 16).unwrap();
        let foreign = KeptTree::open(again(&t), false, Some(8), 256, 16).unwrap_err();
        assert!(NotRecoverable::reason(&foreign).unwrap().contains("connection 7"));
        let layout = KeptTree::open(again(&t), false, Some(7), 128, 16).unwrap_err();
        assert!(NotRecoverable::reason(&layout).is_some());
        let other = SharedRegion::create("test-other", KeptTree::bytes_needed(256, 16)).unwrap();
        other.words()[0].store(42, Ordering::Release);
        let e = KeptTree::open(other, false, Some(7), 256, 16).unwrap_err();
        assert!(NotRecoverable::reason(&e).unwrap().contains("not a node table"));
    }
}

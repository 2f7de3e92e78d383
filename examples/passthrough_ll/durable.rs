//! What outlives the daemon under `-o keeper`: the node table's durable
//! facts, mirrored in shared memory that the keeper holds, and the keys of
//! the descriptors deposited with the keeper's vault.
//!
//! The kernel refers to nodes by `(node id, generation)` and counts its
//! lookups; after a crash every node id it holds must still mean the same
//! inode. So each slot of the inode table (`inodes.rs`) has a record here,
//! written under its shard's lock before the request that changed it is
//! answered: its state and generation, its lookup count, its source key,
//! its kind, and its file handle. A successor rebuilds the table from the
//! records ([`Mirror::load`]). An inode without a file handle (on a
//! filesystem mounted below the source) has its `O_PATH` descriptor
//! deposited with the vault instead, under [`anchor_key`].
//!
//! Open files have records here too ([`OpenRecords`]): which node, with
//! which flags. A successor opens them again through the node's file
//! handle, so opening and releasing a file costs two stores, not a message
//! to the keeper. What a new open cannot reach is deposited instead: the
//! descriptor of a node whose last name went while files of it were open
//! (under its [`anchor_key`], see `InodeTable::keep_removed`), and a file
//! holding a `flock` lock, which belongs to its open file description
//! (under its file handle number).
//!
//! A record is rewritten so that a crash halfway leaves a safe state: a
//! slot being given to a new inode is marked vacant first and live last,
//! so a successor never finds an old `(node id, generation)` with a new
//! inode's handle. Lookup counts are stored before the reply; a crash after
//! the store and before the reply only leaves a count too high (a node kept
//! longer), never too low.

use crate::handles::SHARDS as HANDLE_SHARDS;
use crate::sys::{MAX_HANDLE_SZ, RawFileHandle};
use fuse_wire::session::region::SharedRegion;
use fuse_wire::session::vault::Vault;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What passthrough_ll needs of the keeper's vault: it holds a duplicate of
/// a descriptor under a key until withdrawn, for the next daemon.
pub trait Keep: Send + Sync {
    fn deposit(&self, key: u64, fd: BorrowedFd<'_>) -> io::Result<()>;
    fn withdraw(&self, key: u64) -> io::Result<()>;
}

/// Memory that outlives the daemon, seen as words.
pub trait Words: Send + Sync {
    fn words(&self) -> &[AtomicU64];
}

impl Keep for Vault {
    fn deposit(&self, key: u64, fd: BorrowedFd<'_>) -> io::Result<()> {
        Vault::deposit(self, key, fd)
    }

    fn withdraw(&self, key: u64) -> io::Result<()> {
        Vault::withdraw(self, key)
    }
}

impl Words for SharedRegion {
    fn words(&self) -> &[AtomicU64] {
        SharedRegion::words(self)
    }
}

/// Open files deposited (flock holders, and any open file without a free
/// record) are kept under their file handle number, below this.
pub const FH_KEYS_END: u64 = 1 << 61;
/// In an open file's key: it was opened with `O_APPEND` (the source
/// descriptor is not, so its flags do not say).
pub const APPEND_KEY: u64 = 1 << 60;
/// The node table's region is kept under this key.
pub const REGION_KEY: u64 = 1 << 62;
/// Descriptors of inodes without a file handle: this bit and the node id.
const ANCHOR_KEYS: u64 = 1 << 61;

/// The vault key of the descriptor of node `id` (an inode without a file
/// handle).
pub fn anchor_key(id: u64) -> u64 {
    ANCHOR_KEYS | id
}

/// The node id deposited under `key`, if it is an anchor key.
pub fn anchor_of(key: u64) -> Option<u64> {
    (key & !(ANCHOR_KEYS - 1) == ANCHOR_KEYS).then_some(key & (ANCHOR_KEYS - 1))
}

const MAGIC: u64 = u64::from_le_bytes(*b"ptllnode");
const VERSION: u64 = 2;
const HEADER_WORDS: usize = 8;
/// Open file records a handle table shard has (its file handle numbers
/// are those equal to the shard's index modulo [`HANDLE_SHARDS`]). More
/// than the descriptors a daemon may hold, so only a very uneven spread
/// leaves a shard without a record, and then its descriptor is deposited.
pub const OPEN_PER_SHARD: usize = 512;
/// Words of one open file record: file handle number, node id, flags.
const OPEN_WORDS: usize = 4;
/// Words of one record: state and generation, lookup count, device, inode
/// number, handle type/length and kind, free stamp, handle bytes, spare.
pub const RECORD_WORDS: usize = 24;
const HANDLE_WORDS: usize = MAX_HANDLE_SZ / 8;

/// A slot's state in its record (the low two bits of word 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Live,
    Forgotten,
    Vacant,
}

/// One slot, as a successor reads it.
#[derive(Clone, Copy)]
pub struct Record {
    pub state: State,
    pub generation: u64,
    pub nlookup: u64,
    pub key: (u64, u64),
    pub kind: u32,
    /// `None`: the inode has no file handle (its descriptor is deposited).
    pub handle: Option<RawFileHandle>,
    pub stamp: u64,
}

/// The node table's records in shared memory: `shards` arrays of
/// `per_shard` records after a header.
pub struct Mirror {
    region: Arc<dyn Words>,
    shards: usize,
    per_shard: usize,
}

/// The file handle numbers, counted in the kept region: a number is never
/// given twice on one mount, by any daemon. A RELEASE the predecessor
/// carried out is sent again to the successor (it died before answering);
/// had the successor given that number to a new open file, the replay
/// would close it.
#[derive(Clone)]
pub struct FhCounter {
    region: Arc<dyn Words>,
}

impl FhCounter {
    /// The next number (from 1).
    pub fn next(&self) -> u64 {
        self.region.words()[FH_WORD].fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Makes every later number larger than `n`.
    pub fn above(&self, n: u64) {
        self.region.words()[FH_WORD].fetch_max(n, Ordering::Relaxed);
    }
}

/// The header word counting file handle numbers.
const FH_WORD: usize = 5;

/// The header word counting open file records a handle table shard has.
const OPEN_PER_SHARD_WORD: usize = 6;
/// The header word counting the handle table's shards.
const HANDLE_SHARDS_WORD: usize = 7;

fn node_words(shards: usize, per_shard: usize) -> usize {
    HEADER_WORDS + shards * per_shard * RECORD_WORDS
}

/// The bytes a region for `shards` × `per_shard` node records and the open
/// file records needs.
pub fn region_len(shards: usize, per_shard: usize) -> usize {
    (node_words(shards, per_shard) + HANDLE_SHARDS * OPEN_PER_SHARD * OPEN_WORDS) * 8
}

/// One open file's record, as a successor reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenRecord {
    /// The slot in its shard.
    pub slot: usize,
    pub fh: u64,
    pub node: u64,
    /// The flags of the open as the kernel gave them.
    pub flags: i32,
    /// Writes pick the end of the file (see `Handle::append`).
    pub append: bool,
}

/// The open files' records: [`HANDLE_SHARDS`] arrays of
/// [`OPEN_PER_SHARD`] after the node records. A record is written before
/// the open is answered and cleared before the release is; its file
/// handle number is stored last, so a record is whole once it has one.
#[derive(Clone)]
pub struct OpenRecords {
    region: Arc<dyn Words>,
    base: usize,
}

impl OpenRecords {
    fn rec(&self, shard: usize, slot: usize) -> &[AtomicU64] {
        let at = self.base + (shard * OPEN_PER_SHARD + slot) * OPEN_WORDS;
        &self.region.words()[at..at + OPEN_WORDS]
    }

    /// Records open file `fh` (which is in `shard`) in `slot`.
    pub fn set(&self, shard: usize, slot: usize, fh: u64, node: u64, flags: i32, append: bool) {
        let r = self.rec(shard, slot);
        r[1].store(node, Ordering::Relaxed);
        r[2].store(flags as u32 as u64 | u64::from(append) << 32, Ordering::Relaxed);
        r[0].store(fh, Ordering::Release);
    }

    /// Frees `slot` of `shard`.
    pub fn clear(&self, shard: usize, slot: usize) {
        self.rec(shard, slot)[0].store(0, Ordering::Release);
    }

    /// The records of `shard` in use.
    pub fn load(&self, shard: usize) -> Vec<OpenRecord> {
        (0..OPEN_PER_SHARD)
            .filter_map(|slot| {
                let r = self.rec(shard, slot);
                let fh = r[0].load(Ordering::Acquire);
                let w2 = r[2].load(Ordering::Relaxed);
                (fh != 0).then(|| OpenRecord {
                    slot,
                    fh,
                    node: r[1].load(Ordering::Relaxed),
                    flags: w2 as u32 as i32,
                    append: w2 >> 32 & 1 == 1,
                })
            })
            .collect()
    }
}

impl Mirror {
    /// The mirror in `region`: a new one if the region is zeroed, else the
    /// one a predecessor wrote, which must have this layout. On a takeover
    /// (`takeover`) a zeroed region is refused: the table the kernel's node
    /// ids refer to is lost, and a new one would give them to other files.
    pub fn new(
        region: Arc<dyn Words>,
        shards: usize,
        per_shard: usize,
        takeover: bool,
    ) -> io::Result<Mirror> {
        let w = region.words();
        if w.len() * 8 < region_len(shards, per_shard) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the kept node table region is smaller than this daemon's",
            ));
        }
        // Word index and value of each layout fact.
        let want = [
            (1, VERSION),
            (2, shards as u64),
            (3, per_shard as u64),
            (4, RECORD_WORDS as u64),
            (OPEN_PER_SHARD_WORD, OPEN_PER_SHARD as u64),
            (HANDLE_SHARDS_WORD, HANDLE_SHARDS as u64),
        ];
        match w[0].load(Ordering::Acquire) {
            0 if takeover => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the kept node table is blank on a takeover: the record of the node ids the kernel \
                     holds is lost, and a new table would give them to other files; refusing to serve",
                ));
            }
            0 => {
                for (i, v) in want {
                    w[i].store(v, Ordering::Relaxed);
                }
                w[0].store(MAGIC, Ordering::Release);
            }
            MAGIC => {
                let have: Vec<u64> = want.iter().map(|&(i, _)| w[i].load(Ordering::Relaxed)).collect();
                let want: Vec<u64> = want.iter().map(|&(_, v)| v).collect();
                if have != want {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "the kept node table has another layout (version, shards, records a shard, \
                             record words, open file records a shard, handle shards: {have:?}, this \
                             daemon: {want:?}): restart the mount"
                        ),
                    ));
                }
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the kept region is not a passthrough_ll node table",
                ));
            }
        }
        Ok(Mirror {
            region,
            shards,
            per_shard,
        })
    }

    /// The open files' records, after the node records.
    pub fn open_records(&self) -> OpenRecords {
        OpenRecords {
            region: self.region.clone(),
            base: node_words(self.shards, self.per_shard),
        }
    }

    /// The file handle numbers' counter.
    pub fn fh_counter(&self) -> FhCounter {
        FhCounter {
            region: self.region.clone(),
        }
    }

    /// Records a shard can hold.
    pub fn per_shard(&self) -> usize {
        self.per_shard
    }

    fn rec(&self, shard: usize, slot: usize) -> &[AtomicU64] {
        let at = HEADER_WORDS + (shard * self.per_shard + slot) * RECORD_WORDS;
        &self.region.words()[at..at + RECORD_WORDS]
    }

    fn set_state(r: &[AtomicU64], state: State, generation: u64) {
        let s = match state {
            State::Live => 1,
            State::Forgotten => 2,
            State::Vacant => 3,
        };
        r[0].store(generation << 2 | s, Ordering::Release);
    }

    /// Slot `slot` of `shard` holds a new inode (the first lookup), or one
    /// brought back: its facts, then live with `generation`. `slot` must be
    /// below [`Self::per_shard`].
    pub fn live(
        &self,
        shard: usize,
        slot: usize,
        generation: u64,
        key: (u64, u64),
        kind: u32,
        handle: Option<&RawFileHandle>,
    ) {
        let r = self.rec(shard, slot);
        Self::set_state(r, State::Vacant, generation);
        r[1].store(1, Ordering::Relaxed);
        r[2].store(key.0, Ordering::Relaxed);
        r[3].store(key.1, Ordering::Relaxed);
        let (t, len) = handle.map_or((0, 0), |h| {
            (h.handle_type() as u32 as u64, h.bytes().len() as u64)
        });
        let present = u64::from(handle.is_some());
        r[4].store(
            t | len << 32 | present << 47 | (kind as u64 & 0xffff) << 48,
            Ordering::Relaxed,
        );
        if let Some(h) = handle {
            store_bytes(&r[6..6 + HANDLE_WORDS], h.bytes());
        }
        Self::set_state(r, State::Live, generation);
    }

    /// The lookup count of a live slot.
    pub fn nlookup(&self, shard: usize, slot: usize, n: u64) {
        self.rec(shard, slot)[1].store(n, Ordering::Release);
    }

    /// The slot's inode is forgotten (`remember`: its handle stays for a
    /// revival) or gone, freed with `stamp`.
    pub fn freed(&self, shard: usize, slot: usize, generation: u64, stamp: u64, remember: bool) {
        let r = self.rec(shard, slot);
        r[1].store(0, Ordering::Relaxed);
        r[5].store(stamp, Ordering::Relaxed);
        let s = if remember { State::Forgotten } else { State::Vacant };
        Self::set_state(r, s, generation);
    }

    /// The records of `shard`, up to the first never written.
    pub fn load(&self, shard: usize) -> Vec<Record> {
        let mut out = Vec::new();
        for slot in 0..self.per_shard {
            let r = self.rec(shard, slot);
            let w0 = r[0].load(Ordering::Acquire);
            let state = match w0 & 3 {
                1 => State::Live,
                2 => State::Forgotten,
                3 => State::Vacant,
                _ => break,
            };
            let w4 = r[4].load(Ordering::Relaxed);
            let len = ((w4 >> 32) & 0x7fff) as usize;
            let handle = (w4 >> 47 & 1 == 1 && len <= MAX_HANDLE_SZ).then(|| {
                let mut b = [0u8; MAX_HANDLE_SZ];
                load_bytes(&r[6..6 + HANDLE_WORDS], &mut b[..len]);
                RawFileHandle::from_parts(w4 as u32 as i32, &b[..len])
            });
            out.push(Record {
                state,
                generation: w0 >> 2,
                nlookup: r[1].load(Ordering::Acquire),
                key: (r[2].load(Ordering::Relaxed), r[3].load(Ordering::Relaxed)),
                kind: (w4 >> 48) as u32,
                handle,
                stamp: r[5].load(Ordering::Relaxed),
            });
        }
        out
    }
}

/// Stores `bytes` into `words`, eight to a word, little-endian.
fn store_bytes(words: &[AtomicU64], bytes: &[u8]) {
    for (w, chunk) in words.iter().zip(bytes.chunks(8)) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        w.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
}

/// Loads what [`store_bytes`] stored into `out`.
fn load_bytes(words: &[AtomicU64], out: &mut [u8]) {
    for (w, chunk) in words.iter().zip(out.chunks_mut(8)) {
        chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes()[..chunk.len()]);
    }
}

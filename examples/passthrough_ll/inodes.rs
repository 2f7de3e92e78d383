//! The inode table: every inode the kernel knows, keyed by the source
//! filesystem's `(st_dev, st_ino)`, each holding an `O_PATH` descriptor and
//! the kernel's lookup count.
//!
//! It is split into [`SHARDS`] shards, each a mutex over a slab of slots and
//! a map from key to slot; an inode lives in the shard its key hashes to. The
//! node id encodes `(slot, shard)`, so both "find by key" (lookup, create)
//! and "find by node id" (every other operation, forget) take exactly one
//! shard's lock, briefly, and never a lock that all requests share. Node id 1
//! is the source root, kept outside the shards and never forgotten.
//!
//! A slot is reused after its inode is forgotten; its generation number then
//! grows, so `(node id, generation)` never repeats.

use crate::sys;
use fuse_wire::session::BackingFile;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Number of shards (a power of two).
pub const SHARDS: usize = 64;
const SHARD_BITS: u32 = SHARDS.trailing_zeros();
/// Table node ids start above the root's id 1.
const ID_BASE: u64 = 2;
pub const ROOT_ID: u64 = 1;

/// `(st_dev, st_ino)` of an inode on the source side.
pub type Key = (u64, u64);

/// What the kernel's passthrough opens of one inode share: one backing id,
/// registered at the first open and closed after the last release.
#[derive(Default)]
pub struct Passthrough {
    /// Open files of this inode that use the backing file.
    pub opens: usize,
    /// Open files of this inode the daemon serves itself although
    /// passthrough is on (see `PassthroughFs::attach_backing`).
    pub served: usize,
    /// The registered backing file while `opens > 0`.
    pub backing: Option<BackingFile>,
    /// Whether the backing file was opened for writing.
    pub writable: bool,
    /// Why it could not be (the errno to give a later writable open).
    pub write_errno: i32,
}

/// The POSIX lock owner (a process's lock_owner id) of one inode: its own
/// open file description, on which its locks are open file description
/// locks, so that the source filesystem treats every owner as one process.
pub struct LockOwnerFd {
    pub fd: OwnedFd,
    /// The owning process, which F_GETLK reports.
    pub pid: u32,
}

/// One inode.
pub struct InodeData {
    /// `O_PATH | O_NOFOLLOW` descriptor of the inode.
    pub fd: OwnedFd,
    pub key: Key,
    /// The `S_IFMT` bits.
    pub kind: u32,
    /// Passthrough state (its own mutex: only opens and releases take it).
    pub passthrough: Mutex<Passthrough>,
    /// The POSIX lock owners of this inode, by lock owner id (`-o posix_lock`).
    pub lock_owners: Mutex<HashMap<u64, Arc<LockOwnerFd>>>,
    /// For a directory: whether everyone may search it (see
    /// `PassthroughFs::child_ttl`): 0 unknown, 1 yes, 2 no.
    pub search_all: AtomicU8,
}

impl InodeData {
    pub fn new(fd: OwnedFd, st: &libc::stat) -> Self {
        Self {
            fd,
            key: (st.st_dev, st.st_ino),
            kind: st.st_mode & libc::S_IFMT,
            passthrough: Mutex::new(Passthrough::default()),
            lock_owners: Mutex::new(HashMap::new()),
            search_all: AtomicU8::new(0),
        }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }

    pub fn is_symlink(&self) -> bool {
        self.kind == libc::S_IFLNK
    }

    pub fn passthrough(&self) -> MutexGuard<'_, Passthrough> {
        self.passthrough.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn lock_owners(&self) -> MutexGuard<'_, HashMap<u64, Arc<LockOwnerFd>>> {
        self.lock_owners.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Slot {
    data: Arc<InodeData>,
    nlookup: u64,
}

#[derive(Default)]
struct Shard {
    slots: Vec<Option<Slot>>,
    generations: Vec<u64>,
    free: Vec<usize>,
    by_key: HashMap<Key, usize>,
}

/// The sharded table.
pub struct InodeTable {
    root: Arc<InodeData>,
    shards: Box<[Mutex<Shard>]>,
    live: AtomicUsize,
}

/// The shard an inode with `key` lives in.
pub fn shard_of(key: Key) -> usize {
    // A multiplicative mix of both halves; inode numbers are often dense.
    let h = (key.0 ^ key.1.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> (64 - SHARD_BITS)) as usize
}

fn encode(shard: usize, slot: usize) -> u64 {
    ((slot as u64) << SHARD_BITS | shard as u64) + ID_BASE
}

fn decode(id: u64) -> Option<(usize, usize)> {
    let v = id.checked_sub(ID_BASE)?;
    let shard = (v & (SHARDS as u64 - 1)) as usize;
    let slot = usize::try_from(v >> SHARD_BITS).ok()?;
    Some((shard, slot))
}

/// A looked-up inode: its node id, generation and data.
pub struct Found {
    pub id: u64,
    pub generation: u64,
    pub data: Arc<InodeData>,
}

impl InodeTable {
    /// A table whose root (node id 1) is the directory behind `root_fd`.
    pub fn new(root_fd: OwnedFd) -> io::Result<Self> {
        let st = sys::stat_fd(root_fd.as_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(Self {
            root: Arc::new(InodeData::new(root_fd, &st)),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            live: AtomicUsize::new(0),
        })
    }

    fn shard(&self, i: usize) -> MutexGuard<'_, Shard> {
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds shard `i`'s lock until the result drops (tests: shows that
    /// the other shards go on meanwhile).
    #[doc(hidden)]
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn lock_shard(&self, i: usize) -> impl Sized + '_ {
        self.shard(i)
    }

    pub fn root(&self) -> &Arc<InodeData> {
        &self.root
    }

    /// The inode with node id `id`, if the kernel may know it.
    pub fn get(&self, id: u64) -> Option<Arc<InodeData>> {
        if id == ROOT_ID {
            return Some(self.root.clone());
        }
        let (shard, slot) = decode(id)?;
        let s = self.shard(shard);
        s.slots.get(slot)?.as_ref().map(|e| e.data.clone())
    }

    /// Records one more lookup of the inode behind `fd` (with attributes
    /// `st`): the existing entry if the key is known (then `fd` is closed),
    /// else a new one holding `fd`.
    pub fn lookup_or_insert(&self, fd: OwnedFd, st: &libc::stat) -> Found {
        let key = (st.st_dev, st.st_ino);
        if key == self.root.key {
            return Found {
                id: ROOT_ID,
                generation: 0,
                data: self.root.clone(),
            };
        }
        let shard_i = shard_of(key);
        let mut s = self.shard(shard_i);
        if let Some(&slot) = s.by_key.get(&key) {
            let generation = s.generations[slot];
            if let Some(e) = s.slots[slot].as_mut() {
                e.nlookup += 1;
                let data = e.data.clone();
                drop(s);
                drop(fd);
                return Found {
                    id: encode(shard_i, slot),
                    generation,
                    data,
                };
            }
        }
        let data = Arc::new(InodeData::new(fd, st));
        let slot = match s.free.pop() {
            Some(i) => {
                s.generations[i] += 1;
                i
            }
            None => {
                s.slots.push(None);
                s.generations.push(0);
                s.slots.len() - 1
            }
        };
        s.slots[slot] = Some(Slot {
            data: data.clone(),
            nlookup: 1,
        });
        s.by_key.insert(key, slot);
        let generation = s.generations[slot];
        drop(s);
        self.live.fetch_add(1, Ordering::Relaxed);
        Found {
            id: encode(shard_i, slot),
            generation,
            data,
        }
    }

    /// Drops `n` lookups of node `id`; forgets it at zero.
    pub fn forget(&self, id: u64, n: u64) {
        if id == ROOT_ID {
            return;
        }
        let Some((shard, slot)) = decode(id) else {
            log::warn!("forget of unknown node id {id}");
            return;
        };
        let mut s = self.shard(shard);
        let Some(Some(e)) = s.slots.get_mut(slot) else {
            drop(s);
            log::warn!("forget of unknown node id {id}");
            return;
        };
        if e.nlookup > n {
            e.nlookup -= n;
            return;
        }
        if e.nlookup < n {
            log::warn!("node {id}: forget of {n} exceeds its {} lookups", e.nlookup);
        }
        let key = e.data.key;
        // Dropping the slot closes the O_PATH fd unless a request still holds it.
        let gone = s.slots[slot].take();
        s.by_key.remove(&key);
        s.free.push(slot);
        drop(s);
        drop(gone);
        self.live.fetch_sub(1, Ordering::Relaxed);
    }

    /// Inodes the kernel holds lookups on, the root not counted.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// The lookup count of node `id` (tests and debugging).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn nlookup(&self, id: u64) -> Option<u64> {
        let (shard, slot) = decode(id)?;
        let s = self.shard(shard);
        s.slots.get(slot)?.as_ref().map(|e| e.nlookup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn open_path(p: &std::path::Path) -> (OwnedFd, libc::stat) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let fd = sys::openat(sys::Dir::Cwd, &c, libc::O_PATH | libc::O_NOFOLLOW, 0).unwrap();
        let st = sys::stat_fd(fd.as_fd()).unwrap();
        (fd, st)
    }

    #[test]
    fn ids_are_stable_counted_and_reused_with_new_generation() {
        let dir = std::env::temp_dir().join(format!("pt-inodes-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("f"), b"x").unwrap();
        let (root, _) = open_path(&dir);
        let t = InodeTable::new(root).unwrap();

        let (fd, st) = open_path(&dir.join("f"));
        let a = t.lookup_or_insert(fd, &st);
        let (fd, st) = open_path(&dir.join("f"));
        let b = t.lookup_or_insert(fd, &st);
        assert_eq!(a.id, b.id);
        assert!(a.id > ROOT_ID);
        assert_eq!(t.nlookup(a.id), Some(2));
        assert_eq!(t.live(), 1);

        let (fd, st) = open_path(&dir);
        assert_eq!(t.lookup_or_insert(fd, &st).id, ROOT_ID);
        let (fd, st) = open_path(&dir.join("sub"));
        let c = t.lookup_or_insert(fd, &st);
        assert_ne!(c.id, a.id);
        assert_eq!(t.live(), 2);

        t.forget(a.id, 1);
        assert!(t.get(a.id).is_some());
        t.forget(a.id, 1);
        assert!(t.get(a.id).is_none());
        t.forget(c.id, 5);
        assert_eq!(t.live(), 0);
        t.forget(a.id, 1); // unknown now: ignored
        t.forget(0, 1);
        t.forget(u64::MAX, 1);
        assert!(t.get(0).is_none());
        assert!(t.get(u64::MAX).is_none());

        let (fd, st) = open_path(&dir.join("f"));
        let d = t.lookup_or_insert(fd, &st);
        if d.id == a.id {
            assert!(d.generation > a.generation);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn encoding_round_trips() {
        for shard in [0, 1, SHARDS - 1] {
            for slot in [0usize, 1, 12345] {
                let id = encode(shard, slot);
                assert!(id >= ID_BASE);
                assert_eq!(decode(id), Some((shard, slot)));
            }
        }
        assert_eq!(decode(0), None);
        assert_eq!(decode(1), None);
    }
}

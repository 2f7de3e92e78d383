//! What slowfs serves, whichever trait serves it: the tree (generated
//! read-only files, the writable directory `rw`, the `.stats` file), each
//! operation's answer, the simulated remote's latency and the counters of
//! operations in progress.
//!
//! Byte `p` of the generated file `file-N` is `b'a' + (p + N) % 26`.

use fuse_wire::asyncfs::{DirEntry, Open};
use fuse_wire::{Entry, Errno, FileAttr, FileHandle, FileKind, FopenFlags, Inode, SetattrRequest};
use std::collections::BTreeMap;
use std::ffi::CStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

/// How long the kernel may cache names and attributes.
const TTL: Duration = Duration::from_secs(1);
/// `.stats`: the counters, served without latency.
pub const STATS: Inode = Inode(2);
/// `rw`: the writable directory.
pub const RW: Inode = Inode(3);
/// The first generated file.
const FIRST: u64 = 16;
/// The first node id of a file made in `rw`.
const FIRST_RW: u64 = 1 << 32;

/// The generated files' content at `offset`, `len` bytes long.
pub fn generated(index: u64, offset: u64, len: usize) -> Vec<u8> {
    (offset..offset + len as u64)
        .map(|p| b'a' + ((p + index) % 26) as u8)
        .collect()
}

/// How slowfs is set up.
pub struct Setup {
    pub files: u64,
    pub size: u64,
    /// The simulated remote's round trip, for every operation.
    pub latency: Duration,
    /// For READ, if given.
    pub read_latency: Option<Duration>,
}

#[derive(Default)]
struct Rw {
    names: BTreeMap<Vec<u8>, u64>,
    data: BTreeMap<u64, Vec<u8>>,
    /// Each file's permission bits and owner, as its creator gave them.
    meta: BTreeMap<u64, (u16, u32, u32)>,
    /// How many times each file is open: one unlinked while open keeps
    /// its data until its last RELEASE.
    open: BTreeMap<u64, usize>,
}

impl Rw {
    /// Drops `ino`'s data once it has no name and is not open.
    fn drop_if_unused(&mut self, ino: u64) {
        if !self.open.contains_key(&ino) && !self.names.values().any(|&n| n == ino) {
            self.data.remove(&ino);
            self.meta.remove(&ino);
        }
    }
}

/// The tree and its counters.
pub struct Tree {
    setup: Setup,
    rw: Mutex<Rw>,
    next_rw: AtomicU64,
    running: AtomicUsize,
    peak: AtomicUsize,
    completed: AtomicU64,
    cancelled: AtomicU64,
}

/// An operation in progress: counted until dropped; dropped before
/// [`Op::finish`] it was cancelled (its future dropped). Those on `.stats`
/// are not counted (`None`).
pub struct Op<'a>(Option<&'a Tree>, bool);

impl Op<'_> {
    pub fn finish(mut self) {
        self.1 = true;
    }
}

impl Drop for Op<'_> {
    fn drop(&mut self) {
        let Some(tree) = self.0 else { return };
        tree.running.fetch_sub(1, SeqCst);
        let counter = if self.1 { &tree.completed } else { &tree.cancelled };
        counter.fetch_add(1, SeqCst);
    }
}

impl Tree {
    pub fn new(setup: Setup) -> Tree {
        Tree {
            setup,
            rw: Mutex::default(),
            next_rw: AtomicU64::new(FIRST_RW),
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            completed: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
        }
    }

    /// Starts an operation on `ino` (READ if `read`): its guard, and how
    /// long the remote takes to answer it.
    pub fn op(&self, ino: Inode, read: bool) -> (Op<'_>, Duration) {
        if ino == STATS {
            return (Op(None, false), Duration::ZERO);
        }
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.peak.fetch_max(now, SeqCst);
        let delay = match read {
            true => self.setup.read_latency.unwrap_or(self.setup.latency),
            false => self.setup.latency,
        };
        (Op(Some(self), false), delay)
    }

    /// The counters, as `.stats` and `--stats` show them.
    pub fn counters(&self) -> [(&'static str, u64); 4] {
        [
            ("running", self.running.load(SeqCst) as u64),
            ("peak", self.peak.load(SeqCst) as u64),
            ("completed", self.completed.load(SeqCst)),
            ("cancelled", self.cancelled.load(SeqCst)),
        ]
    }

    fn stats_text(&self) -> Vec<u8> {
        let mut s = String::new();
        for (k, v) in self.counters() {
            s.push_str(&format!("{k} {v}\n"));
        }
        s.into_bytes()
    }

    fn rw(&self) -> std::sync::MutexGuard<'_, Rw> {
        self.rw.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The generated file `ino`'s index, if it is one.
    fn index(&self, ino: Inode) -> Option<u64> {
        (FIRST..FIRST + self.setup.files)
            .contains(&ino.0)
            .then(|| ino.0 - FIRST)
    }

    pub fn getattr(&self, ino: Inode) -> Result<FileAttr, Errno> {
        let file = |size: u64, perm| FileAttr::fixed(ino.0, FileKind::RegularFile, perm).with_size(size);
        match ino {
            Inode::ROOT => Ok(FileAttr::fixed(1, FileKind::Directory, 0o555)),
            RW => Ok(FileAttr::fixed(RW.0, FileKind::Directory, 0o777)),
            STATS => Ok(file(0, 0o444)),
            _ if self.index(ino).is_some() => Ok(file(self.setup.size, 0o444)),
            _ => {
                let rw = self.rw();
                match (rw.data.get(&ino.0), rw.meta.get(&ino.0)) {
                    (Some(d), Some(&(perm, uid, gid))) => {
                        let mut a = file(d.len() as u64, perm);
                        (a.uid, a.gid) = (uid, gid);
                        Ok(a)
                    }
                    _ => Err(Errno::ENOENT),
                }
            }
        }
    }

    fn entry(&self, ino: Inode) -> Result<Entry, Errno> {
        Ok(Entry::new(ino, self.getattr(ino)?, TTL))
    }

    pub fn lookup(&self, parent: Inode, name: &CStr) -> Result<Entry, Errno> {
        let name = name.to_bytes();
        match parent {
            Inode::ROOT => match name {
                b"rw" => self.entry(RW),
                b".stats" => self.entry(STATS),
                _ => {
                    let n = std::str::from_utf8(name)
                        .ok()
                        .and_then(|s| s.strip_prefix("file-"))
                        .and_then(|n| n.parse::<u64>().ok())
                        .filter(|&n| n < self.setup.files && name == format!("file-{n:03}").as_bytes());
                    self.entry(Inode(FIRST + n.ok_or(Errno::ENOENT)?))
                }
            },
            RW => {
                let ino = self.rw().names.get(name).copied().ok_or(Errno::ENOENT)?;
                self.entry(Inode(ino))
            }
            _ => Err(Errno::ENOTDIR),
        }
    }

    pub fn setattr(&self, ino: Inode, req: &SetattrRequest) -> Result<FileAttr, Errno> {
        if let Some(size) = req.size {
            let mut rw = self.rw();
            let data = rw.data.get_mut(&ino.0).ok_or(Errno::EROFS)?;
            data.resize(usize::try_from(size).map_err(|_| Errno::EFBIG)?, 0);
        }
        self.getattr(ino)
    }

    pub fn readdir(&self, ino: Inode, offset: u64) -> Result<Vec<DirEntry>, Errno> {
        let mut all = vec![
            DirEntry::new(ino, 1, FileKind::Directory, "."),
            DirEntry::new(Inode::ROOT, 2, FileKind::Directory, ".."),
        ];
        match ino {
            Inode::ROOT => {
                all.push(DirEntry::new(RW, 3, FileKind::Directory, "rw"));
                all.push(DirEntry::new(STATS, 4, FileKind::RegularFile, ".stats"));
                for n in 0..self.setup.files {
                    let name = format!("file-{n:03}");
                    all.push(DirEntry::new(
                        Inode(FIRST + n),
                        5 + n,
                        FileKind::RegularFile,
                        name,
                    ));
                }
            }
            RW => {
                // Each name's cookie is its node id (above 2): a listing
                // goes on after the last name it gave, whatever was
                // removed or made meanwhile.
                let mut files: Vec<(u64, Vec<u8>)> =
                    self.rw().names.iter().map(|(n, &i)| (i, n.clone())).collect();
                files.sort();
                for (ino, name) in files {
                    all.push(DirEntry::new(Inode(ino), ino, FileKind::RegularFile, name));
                }
            }
            _ => return Err(Errno::ENOTDIR),
        }
        Ok(all.into_iter().filter(|e| e.offset > offset).take(256).collect())
    }

    /// Every file is opened `DIRECT_IO`: each `read(2)` reaches the remote.
    pub fn open(&self, ino: Inode) -> Result<Open, Errno> {
        self.getattr(ino)?;
        if ino.0 >= FIRST_RW {
            *self.rw().open.entry(ino.0).or_default() += 1;
        }
        Ok(Open::new(FileHandle(0)).with_flags(FopenFlags::DIRECT_IO))
    }

    pub fn read(&self, ino: Inode, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let slice = |d: &[u8]| {
            let start = (offset as usize).min(d.len());
            d[start..(start + size as usize).min(d.len())].to_vec()
        };
        if ino == STATS {
            return Ok(slice(&self.stats_text()));
        }
        if let Some(n) = self.index(ino) {
            let len = self.setup.size.saturating_sub(offset).min(u64::from(size));
            return Ok(generated(n, offset, len as usize));
        }
        self.rw().data.get(&ino.0).map(|d| slice(d)).ok_or(Errno::ENOENT)
    }

    pub fn write(&self, ino: Inode, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let mut rw = self.rw();
        let file = rw.data.get_mut(&ino.0).ok_or(Errno::EROFS)?;
        let start = usize::try_from(offset).map_err(|_| Errno::EFBIG)?;
        let end = start.checked_add(data.len()).ok_or(Errno::EFBIG)?;
        if file.len() < end {
            file.resize(end, 0);
        }
        file[start..end].copy_from_slice(data);
        Ok(data.len() as u32)
    }

    /// RELEASE of an open file.
    pub fn release(&self, ino: Inode) {
        let mut rw = self.rw();
        if let Some(n) = rw.open.get_mut(&ino.0) {
            *n -= 1;
            if *n == 0 {
                rw.open.remove(&ino.0);
                rw.drop_if_unused(ino.0);
            }
        }
    }

    /// CREATE `name` in `rw` with permission bits `perm`, owned by `owner`.
    pub fn create(
        &self,
        parent: Inode,
        name: &CStr,
        perm: u16,
        owner: (u32, u32),
    ) -> Result<(Entry, Open), Errno> {
        if parent != RW {
            return Err(Errno::EROFS);
        }
        let ino = {
            let mut rw = self.rw();
            if rw.names.contains_key(name.to_bytes()) {
                return Err(Errno::EEXIST);
            }
            let ino = self.next_rw.fetch_add(1, SeqCst);
            rw.names.insert(name.to_bytes().to_vec(), ino);
            rw.data.insert(ino, Vec::new());
            rw.meta.insert(ino, (perm, owner.0, owner.1));
            ino
        };
        Ok((self.entry(Inode(ino))?, self.open(Inode(ino))?))
    }

    pub fn unlink(&self, parent: Inode, name: &CStr) -> Result<(), Errno> {
        if parent != RW {
            return Err(Errno::EROFS);
        }
        let mut rw = self.rw();
        let ino = rw.names.remove(name.to_bytes()).ok_or(Errno::ENOENT)?;
        rw.drop_if_unused(ino);
        Ok(())
    }
}

//! memfs: an in-memory filesystem with per-inode locking.
//!
//! # Locking
//!
//! - The inode table is split into [`SHARDS`] maps, each behind its own
//!   `RwLock`, keyed by inode number. A shard lock is held only to find,
//!   insert or remove an `Arc<Node>`, and nothing else is locked meanwhile.
//! - Every inode has its own `RwLock` over its metadata and contents. Link
//!   count, lookup count, open count and (for directories) the parent live
//!   in atomics beside it, so that freeing an inode or walking up the tree
//!   never needs an inode lock.
//! - When an operation holds several inode locks it takes a directory
//!   before anything in it. A rename between two directories first takes
//!   `rename_lock` (renames only, like the VFS), which keeps the tree's
//!   shape still while it checks for loops and orders the two directories
//!   (an ancestor before its descendants).
//!
//! # Limits of the model
//!
//! - Without `-o default_permissions` the kernel leaves permission checks to
//!   the filesystem, and memfs applies the POSIX rules itself (see `may`):
//!   search permission in lookups, read/write permission on open, truncate
//!   and user.* xattrs, write and search permission on the directory for
//!   create, link, unlink, rename and rmdir, the sticky-directory rule, and
//!   the owner rules of chmod, chown and utimensat. Group checks count the
//!   supplementary groups and privilege checks the capabilities that the
//!   library's `RequestContext::caller` could establish; what it cannot
//!   know counts as absent (a caller outside the daemon's pid namespace
//!   has only its primary group). A caller with `CAP_DAC_OVERRIDE` and
//!   `CAP_FOWNER` (root, normally) passes every check; uid 0 without them
//!   does not.
//! - Holes are tracked per 4 KiB page, as on tmpfs: SEEK_DATA/SEEK_HOLE
//!   report pages, so zeros inside a written page count as data.
//! - atime changes only through SETATTR (as if mounted `noatime`).
//!
//! # Capacity
//!
//! `-o size=` and `-o nr_inodes=` bound what memfs holds; the defaults are
//! tmpfs's, half of the RAM and one inode per page of that. `size=` is
//! charged the memory memfs really takes, not the bytes callers stored:
//! each page of contents touched, each inode, directory entry, extended
//! attribute, symlink target and lock record, at a cost per record that
//! bounds what it takes from the allocator (`capacity.rs` lists them; unit
//! tests hold each against the allocations it makes). statfs reports that
//! same figure as used. Each inode records the bytes it is charged for
//! (`Data::charged`) and gives them back, with its inode slot, when it is
//! dropped: after its last name, kernel reference and open file are gone,
//! so an unlinked file that is still open keeps its space until the last
//! RELEASE. Every growth is reserved before anything changes, so a request
//! refused with ENOSPC (ENOLCK for locks) leaves everything as it was. A
//! write that does not fit entirely writes the pages that fit and answers
//! with that count, as tmpfs does (the caller sees a short write, then
//! ENOSPC on the next one); fallocate, xattrs, creations and renames are
//! all or nothing; truncating up makes a hole and costs nothing, as on
//! tmpfs.
//!
//! # Memory beyond `size=`
//!
//! The daemon's resident memory stays within `size=` plus:
//!
//! - what it takes before holding anything: code, libraries, and each
//!   worker thread's stack and request buffer (about `max_write` plus a page
//!   each, for the workers the load has started);
//! - buffers of requests in flight: a COPY_FILE_RANGE copies 64 KiB at a
//!   time, a LISTXATTR reply is at most what the caller's buffer holds
//!   (64 KiB), and the session's own per-request state;
//! - what the allocator keeps once memfs frees memory: glibc reuses it for
//!   later records and gives back what it can at the end of its heaps, but
//!   freed memory scattered between live records stays resident (at most
//!   the peak of what was charged).
use fuse_wire::proto::abi::{Kstatfs, SetattrIn};
use fuse_wire::proto::flags::{FopenFlags, InitFlags, SetattrValid, WriteFlags};
use fuse_wire::session::attr::time_from_wire;
use fuse_wire::session::credentials;
use fuse_wire::session::reply::{
    DirPlusAdd, ReplyAttr, ReplyCopy, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
};
use fuse_wire::session::{
    CopyFileRangeRequest, CreateRequest, Entry, Errno, FallocateRequest, FileAttr, FileHandle, FileKind,
    Filesystem, InitConfig, Inode, LockOwner, LockRequest, LseekRequest, MknodRequest, OpenFlags,
    ReadRequest, Recovery, ReleaseRequest, RenameRequest, RequestContext, SetattrRequest, SetxattrRequest,
    WriteRequest,
};
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[cfg(test)]
#[path = "alloc_count.rs"]
mod alloc_count;
#[path = "capacity.rs"]
pub mod capacity;
#[path = "data.rs"]
mod data;
#[path = "keep.rs"]
pub mod keep;
#[path = "locks.rs"]
mod locks;
#[path = "readset.rs"]
mod readset;
use capacity::{Capacity, INODE_COST, PAGE, TARGET_COST};
use data::{DOTDOT_COOKIE, DirData, FileData, Xattrs, dirent_cost};
use locks::Locks;

/// Number of inode-table shards.
pub const SHARDS: usize = 64;
const MAX_NAME: usize = 255;
/// Largest extended attribute value (the kernel's `XATTR_SIZE_MAX`).
const MAX_XATTR: usize = 64 * 1024;
/// Largest file size: what a signed 64-bit offset can address.
const MAX_SIZE: u64 = i64::MAX as u64;
/// Largest amount one COPY_FILE_RANGE copies (callers loop on short copies).
const COPY_MAX: u64 = 16 << 20;
/// What COPY_FILE_RANGE copies at a time, through a buffer.
const COPY_PIECE: usize = 64 << 10;
/// The preferred I/O size reported in `st_blksize`.
const IO_SIZE: u32 = 64 << 10;

const ENXIO: Errno = Errno::new_or_eio(libc::ENXIO);
const EFBIG: Errno = Errno::new_or_eio(libc::EFBIG);
const ENOSPC: Errno = Errno::new_or_eio(libc::ENOSPC);
const ENAMETOOLONG: Errno = Errno::new_or_eio(libc::ENAMETOOLONG);
const E2BIG: Errno = Errno::new_or_eio(libc::E2BIG);
const ENODEV: Errno = Errno::new_or_eio(libc::ENODEV);

/// A point in time as the kernel stores it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Time {
    sec: i64,
    nsec: u32,
}

impl Time {
    fn now() -> Time {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => Time {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(_) => Time::default(),
        }
    }
}

enum Content {
    File(FileData),
    Dir(DirData),
    Symlink(Box<[u8]>),
    /// FIFOs, sockets and device nodes: only attributes.
    Special,
}

/// What an inode's contents are charged (see `capacity.rs`).
fn content_cost(c: &Content) -> u64 {
    match c {
        Content::File(f) => f.cost(),
        Content::Dir(d) => d.cost(),
        Content::Symlink(t) => TARGET_COST + t.len() as u64,
        Content::Special => 0,
    }
}

/// What an inode's lock protects.
struct Data {
    /// Type and permission bits.
    mode: u32,
    uid: u32,
    gid: u32,
    rdev: u32,
    atime: Time,
    mtime: Time,
    ctime: Time,
    xattrs: Xattrs,
    content: Content,
    /// Bytes of the capacity this inode holds (what `usage` says, plus
    /// what a change in progress has reserved).
    charged: u64,
}

impl Data {
    /// Bytes this inode should be charged for: see `capacity.rs`.
    fn usage(&self) -> u64 {
        INODE_COST + content_cost(&self.content) + self.xattrs.cost()
    }

    fn dir(&self) -> Result<&DirData, Errno> {
        match &self.content {
            Content::Dir(d) => Ok(d),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn dir_mut(&mut self) -> Result<&mut DirData, Errno> {
        match &mut self.content {
            Content::Dir(d) => Ok(d),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn file(&self) -> Result<&FileData, Errno> {
        match &self.content {
            Content::File(f) => Ok(f),
            Content::Dir(_) => Err(Errno::EISDIR),
            _ => Err(Errno::EINVAL),
        }
    }

    fn file_mut(&mut self) -> Result<&mut FileData, Errno> {
        match &mut self.content {
            Content::File(f) => Ok(f),
            Content::Dir(_) => Err(Errno::EISDIR),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Something about the inode changed (ctime), and its contents (mtime).
    fn touch_modified(&mut self) {
        let now = Time::now();
        self.mtime = now;
        self.ctime = now;
    }

    /// What the VFS clears on a non-directory that changes owner, or that a
    /// caller without CAP_FSETID writes or truncates: S_ISUID; S_ISGID when
    /// it means set-group-ID (group execute is set) or, given the caller,
    /// when the caller is neither root nor in the file's group; and file
    /// capabilities. (memfs asks for HANDLE_KILLPRIV_V2, so this is its job,
    /// not the kernel's.)
    fn kill_suid_sgid(&mut self, caller: Option<&Caller>) {
        self.mode &= !libc::S_ISUID;
        if self.mode & libc::S_IXGRP != 0 || caller.is_some_and(|c| !c.is_root() && !c.in_group(self.gid)) {
            self.mode &= !libc::S_ISGID;
        }
        self.xattrs.remove(b"security.capability");
    }
}

struct Node {
    ino: u64,
    /// Hard links (directories: 2 + subdirectories; 0 once removed).
    nlink: AtomicU32,
    /// References the kernel holds (each entry reply adds one, FORGET drops).
    lookups: AtomicU64,
    /// Open files (OPEN/CREATE add one, RELEASE drops).
    opens: AtomicU32,
    /// For directories, the directory containing it (changed only by a
    /// rename, under `rename_lock`).
    parent: AtomicU64,
    data: RwLock<Data>,
    /// Where the inode's bytes and slot go back when it is dropped.
    cap: Arc<Capacity>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let d = self.data.get_mut().unwrap_or_else(|e| e.into_inner());
        self.cap.release_bytes(d.charged);
        self.cap.release_inode();
    }
}

impl Node {
    fn read(&self) -> RwLockReadGuard<'_, Data> {
        self.data.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Data> {
        self.data.write().unwrap_or_else(|e| e.into_inner())
    }

    fn attr(&self, d: &Data) -> FileAttr {
        let (size, blocks) = match &d.content {
            Content::File(f) => (f.size(), f.pages() * (PAGE / 512)),
            Content::Dir(dir) => (dir.len() as u64 * 32, 0),
            Content::Symlink(t) => (t.len() as u64, 0),
            Content::Special => (0, 0),
        };
        FileAttr {
            ino: self.ino,
            size,
            blocks,
            atime: time_from_wire(d.atime.sec as u64, d.atime.nsec),
            mtime: time_from_wire(d.mtime.sec as u64, d.mtime.nsec),
            ctime: time_from_wire(d.ctime.sec as u64, d.ctime.nsec),
            kind: FileKind::from_mode(d.mode).unwrap_or(FileKind::RegularFile),
            perm: (d.mode & 0o7777) as u16,
            nlink: self.nlink.load(Relaxed),
            uid: d.uid,
            gid: d.gid,
            rdev: d.rdev,
            blksize: IO_SIZE,
            flags: 0,
        }
    }
}

/// Tunables of a [`MemFs`].
#[derive(Clone, Debug)]
pub struct MemFsConfig {
    /// How long the kernel may cache names and attributes. Every change goes
    /// through the kernel, so caching is safe; 1 s keeps `ls -l` honest if
    /// you inspect the process with a debugger.
    pub ttl: Duration,
    /// Whether the mount uses `default_permissions` (told to INIT).
    pub default_permissions: bool,
    /// Serve POSIX record locks here (`-o posix_lock`) instead of leaving
    /// them to the kernel, which only sees this machine's processes.
    pub posix_lock: bool,
    /// Serve `flock` locks here (`-o flock`).
    pub flock: bool,
    /// Most bytes held (`-o size=`; 0: no limit).
    pub size: u64,
    /// Most inodes and extra hard links (`-o nr_inodes=`; 0: no limit).
    pub nr_inodes: u64,
}

impl Default for MemFsConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(1),
            default_permissions: false,
            posix_lock: false,
            flock: false,
            size: capacity::default_size(),
            nr_inodes: capacity::default_inodes(),
        }
    }
}

/// The filesystem.
pub struct MemFs {
    shards: Vec<RwLock<HashMap<u64, Arc<Node>>>>,
    /// Where inode numbers come from (shared memory under a keeper: see
    /// `keep.rs`).
    ids: keep::Ids,
    rename_lock: Mutex<()>,
    config: MemFsConfig,
    locks: Arc<Locks>,
    cap: Arc<Capacity>,
    /// The keeper's vault, under a keeper: where the tree goes at an upgrade.
    vault: Option<fuse_wire::session::vault::Vault>,
}

/// A caller's identity, as permission checks need it: the library's
/// [`credentials::Caller`] with its ids at hand.
struct Caller {
    uid: u32,
    gid: u32,
    creds: credentials::Caller,
}

impl Caller {
    fn of(ctx: &RequestContext<'_>) -> Caller {
        let creds = ctx.caller();
        Caller {
            uid: creds.uid(),
            gid: creds.gid(),
            creds,
        }
    }

    /// Whether the caller passes permission and owner checks as root does.
    fn is_root(&self) -> bool {
        self.creds.has_capability(credentials::cap::DAC_OVERRIDE)
            && self.creds.has_capability(credentials::cap::FOWNER)
    }

    fn in_group(&self, gid: u32) -> bool {
        self.creds.in_group(gid)
    }
}

/// Flags of RENAME2.
const RENAME_NOREPLACE: u32 = libc::RENAME_NOREPLACE;
const RENAME_EXCHANGE: u32 = libc::RENAME_EXCHANGE;

/// `ENAMETOOLONG` for a name longer than [`MAX_NAME`], in every operation
/// that takes one (the kernel passes names up to 1024 bytes): a lookup of
/// one does not answer "no such name".
fn too_long(n: &[u8]) -> Result<&[u8], Errno> {
    if n.len() > MAX_NAME {
        Err(ENAMETOOLONG)
    } else {
        Ok(n)
    }
}

fn check_name(name: &CStr) -> Result<&[u8], Errno> {
    let n = too_long(name.to_bytes())?;
    if n.is_empty() || n == b"." || n == b".." || n.contains(&b'/') {
        Err(Errno::EINVAL)
    } else {
        Ok(n)
    }
}

/// Two directory locks, or one when both names are in the same directory.
enum Dirs<'a> {
    Same(RwLockWriteGuard<'a, Data>),
    Two {
        src: RwLockWriteGuard<'a, Data>,
        dst: RwLockWriteGuard<'a, Data>,
    },
}

impl Dirs<'_> {
    fn src(&mut self) -> &mut Data {
        match self {
            Dirs::Same(d) => d,
            Dirs::Two { src, .. } => src,
        }
    }

    fn dst(&mut self) -> &mut Data {
        match self {
            Dirs::Same(d) => d,
            Dirs::Two { dst, .. } => dst,
        }
    }
}

impl Default for MemFs {
    fn default() -> Self {
        Self::new(MemFsConfig::default())
    }
}

impl MemFs {
    /// An empty filesystem: a root directory owned by this process's user.
    pub fn new(config: MemFsConfig) -> MemFs {
        let cap = Arc::new(Capacity::new(config.size, config.nr_inodes));
        let fs = MemFs {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            ids: keep::Ids::local(),
            rename_lock: Mutex::new(()),
            config,
            locks: Arc::new(Locks::new(cap.clone())),
            cap,
            vault: None,
        };
        fs.add_root();
        fs
    }

    /// Adds an empty root directory owned by this process's user.
    fn add_root(&self) {
        use std::os::unix::fs::MetadataExt;
        let (uid, gid) = std::fs::metadata("/proc/self")
            .map(|m| (m.uid(), m.gid()))
            .unwrap_or((0, 0));
        // The root takes the first inode slot and its record's bytes,
        // whatever the limits.
        self.cap.force_inodes(1);
        self.cap.force_bytes(INODE_COST);
        let now = Time::now();
        let root = Node {
            ino: Inode::ROOT.0,
            nlink: AtomicU32::new(2),
            // The kernel never forgets the root.
            lookups: AtomicU64::new(1),
            opens: AtomicU32::new(0),
            parent: AtomicU64::new(Inode::ROOT.0),
            data: RwLock::new(Data {
                mode: libc::S_IFDIR | 0o755,
                uid,
                gid,
                rdev: 0,
                atime: now,
                mtime: now,
                ctime: now,
                xattrs: Xattrs::default(),
                content: Content::Dir(DirData::default()),
                charged: INODE_COST,
            }),
            cap: self.cap.clone(),
        };
        self.insert(Arc::new(root));
    }

    /// Inodes alive: reachable by a name, known to the kernel, or open.
    pub fn inode_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    /// Bytes and inodes in use, as statfs counts them.
    pub fn usage(&self) -> (u64, u64) {
        (self.cap.bytes_used(), self.cap.inodes_used())
    }

    /// Brings the capacity's count in line with what `d` (an inode's data,
    /// write locked) now holds: gives back what a shrink freed and what a
    /// reservation did not use.
    fn settle(&self, d: &mut Data) {
        let now = d.usage();
        match now.cmp(&d.charged) {
            std::cmp::Ordering::Less => self.cap.release_bytes(d.charged - now),
            // Growth is reserved before it happens; this is a safety net.
            std::cmp::Ordering::Greater => self.cap.force_bytes(now - d.charged),
            std::cmp::Ordering::Equal => {}
        }
        d.charged = now;
    }

    /// Reserves `n` more bytes for `d` (ENOSPC when they do not fit).
    fn charge(&self, d: &mut Data, n: u64) -> Result<(), Errno> {
        self.cap.reserve_bytes(n)?;
        d.charged += n;
        Ok(())
    }

    /// A name of a non-directory went away and `before` was its link count
    /// before: a link beyond the first held an inode slot.
    fn unlinked(&self, before: u32) {
        if before > 1 {
            self.cap.release_inode();
        }
    }

    fn shard(&self, ino: u64) -> &RwLock<HashMap<u64, Arc<Node>>> {
        &self.shards[(ino % SHARDS as u64) as usize]
    }

    /// The inode `ino`. One the table does not hold is ESTALE when a
    /// daemon that crashed gave it out (see `keep.rs`), ENOENT otherwise.
    fn get(&self, ino: Inode) -> Result<Arc<Node>, Errno> {
        let shard = self.shard(ino.0).read().unwrap_or_else(|e| e.into_inner());
        match shard.get(&ino.0) {
            Some(n) => Ok(n.clone()),
            None if self.ids.lost(ino.0) => Err(Errno::ESTALE),
            None => Err(Errno::ENOENT),
        }
    }

    fn insert(&self, node: Arc<Node>) {
        let mut shard = self.shard(node.ino).write().unwrap_or_else(|e| e.into_inner());
        shard.insert(node.ino, node);
    }

    /// Frees `node` once nothing refers to it: no name, no kernel
    /// reference, no open file. (None of the three can come back once all
    /// are zero: a name needs LINK, which needs a kernel reference.)
    fn maybe_free(&self, node: &Node) {
        let unused = |n: &Node| {
            n.nlink.load(Acquire) == 0 && n.lookups.load(Acquire) == 0 && n.opens.load(Acquire) == 0
        };
        if node.ino == Inode::ROOT.0 || !unused(node) {
            return;
        }
        let mut shard = self.shard(node.ino).write().unwrap_or_else(|e| e.into_inner());
        if unused(node) && shard.remove(&node.ino).is_some() {
            log::trace!("inode {} freed", node.ino);
            // A table never shrinks by itself: give back what a mass
            // removal left empty (INODE_COST counts a slot's share).
            data::shrink(&mut shard);
        }
    }

    fn entry(&self, node: &Node, d: &Data) -> Entry {
        Entry {
            ino: Inode(node.ino),
            // Inode numbers are never reused, not even by a daemon started
            // after a crash under a keeper (`keep.rs`).
            generation: 0,
            attr: node.attr(d),
            entry_ttl: self.config.ttl,
            attr_ttl: self.config.ttl,
        }
    }

    /// Whether directory `ancestor` is `ino` or above it (walks the parent
    /// atomics; stable while `rename_lock` is held).
    fn is_ancestor(&self, ancestor: u64, mut ino: u64) -> bool {
        for _ in 0..100_000 {
            if ino == ancestor {
                return true;
            }
            if ino == Inode::ROOT.0 {
                return false;
            }
            match self.get(Inode(ino)) {
                Ok(n) => ino = n.parent.load(Acquire),
                Err(_) => return false,
            }
        }
        false
    }

    /// Whether `caller` may access `d` for `mask` (R_OK/W_OK/X_OK bits).
    /// With `default_permissions` the kernel has checked already; without,
    /// memfs applies the POSIX rules itself (EACCES).
    fn may(&self, caller: &Caller, d: &Data, mask: i32) -> Result<(), Errno> {
        if self.config.default_permissions || permitted(caller, d, mask) {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    /// Whether `caller` may read (or, with `write`, set or remove) the
    /// extended attribute `name` of `d`.
    ///
    /// memfs keeps the namespaces a local disk filesystem keeps: `user.`
    /// (the mode decides, and only the owner may write those of a sticky
    /// directory), `trusted.` (root only) and `security.` (the kernel's
    /// security modules decide). Anything else fails with EOPNOTSUPP as on
    /// ext4, `system.` included: memfs has no POSIX ACLs (it does not ask
    /// for `POSIX_ACL`, so the kernel itself answers EOPNOTSUPP for
    /// `system.posix_acl_*`), and no other `system.` name means anything.
    fn xattr_allowed(&self, caller: &Caller, d: &Data, name: &[u8], write: bool) -> Result<(), Errno> {
        let mask = if write { libc::W_OK } else { libc::R_OK };
        let ns = [USER, TRUSTED, SECURITY]
            .into_iter()
            .find(|ns| name.starts_with(ns));
        match ns {
            Some(SECURITY) => {}
            Some(TRUSTED) if !caller.is_root() => {
                return Err(if write { Errno::EPERM } else { Errno::ENODATA });
            }
            Some(TRUSTED) => {}
            Some(_) => {
                let sticky_dir = d.mode & libc::S_IFMT == libc::S_IFDIR && d.mode & libc::S_ISVTX != 0;
                if write && sticky_dir && !caller.is_root() && caller.uid != d.uid {
                    return Err(Errno::EPERM);
                }
                self.may(caller, d, mask)?;
            }
            None => {
                // As on ext4, the mode is checked before the namespace.
                self.may(caller, d, mask)?;
                return Err(Errno::EOPNOTSUPP);
            }
        }
        match ns {
            Some(prefix) if prefix.len() == name.len() => Err(Errno::EINVAL),
            _ => Ok(()),
        }
    }

    /// Creates `name` in `parent`: the common part of MKNOD, MKDIR, SYMLINK
    /// and CREATE. The new inode starts with one lookup reference (for the
    /// reply) and `opens` open files.
    #[allow(clippy::too_many_arguments)]
    fn create_node(
        &self,
        ctx: &RequestContext<'_>,
        parent: &Node,
        pd: &mut Data,
        name: &[u8],
        mode: u32,
        rdev: u32,
        content: Content,
        opens: u32,
    ) -> Result<(Arc<Node>, Entry), Errno> {
        if parent.nlink.load(Acquire) == 0 {
            return Err(Errno::ENOENT); // the directory was removed
        }
        let caller = Caller::of(ctx);
        // Search permission to look the name up, then write permission to add it.
        self.may(&caller, pd, libc::X_OK)?;
        if pd.dir()?.get(name).is_some() {
            return Err(Errno::EEXIST);
        }
        self.may(&caller, pd, libc::W_OK | libc::X_OK)?;
        let kind = mode & libc::S_IFMT;
        let is_dir = kind == libc::S_IFDIR;
        let mut perm = mode & 0o7777;
        if kind != libc::S_IFLNK {
            perm &= !(ctx.umask().unwrap_or(0) & 0o777);
        }
        // Group ownership: a set-group-ID directory passes its group (and,
        // to subdirectories, the bit itself) on to what is created in it.
        let gid = if pd.mode & libc::S_ISGID != 0 {
            if is_dir {
                perm |= libc::S_ISGID;
            }
            pd.gid
        } else {
            caller.gid
        };
        if !is_dir && perm & libc::S_ISGID != 0 && !caller.is_root() && !caller.in_group(gid) {
            perm &= !libc::S_ISGID;
        }
        // Last, so that a refused request reserves nothing: the inode slot,
        // the new inode's bytes (it gives both back when it is dropped),
        // then the directory's new entry.
        let bytes = INODE_COST + content_cost(&content);
        self.cap.reserve_inode()?;
        if let Err(e) = self.cap.reserve_bytes(bytes) {
            self.cap.release_inode();
            return Err(e);
        }
        let entry_cost = pd.dir()?.insert_cost(name.len());
        if let Err(e) = self.charge(pd, entry_cost) {
            self.cap.release_bytes(bytes);
            self.cap.release_inode();
            return Err(e);
        }
        let now = Time::now();
        let ino = self.ids.next();
        let node = Arc::new(Node {
            ino,
            nlink: AtomicU32::new(if is_dir { 2 } else { 1 }),
            lookups: AtomicU64::new(1),
            opens: AtomicU32::new(opens),
            parent: AtomicU64::new(parent.ino),
            data: RwLock::new(Data {
                mode: kind | perm,
                uid: caller.uid,
                gid,
                rdev,
                atime: now,
                mtime: now,
                ctime: now,
                xattrs: Xattrs::default(),
                content,
                charged: bytes,
            }),
            cap: self.cap.clone(),
        });
        let entry = self.entry(&node, &node.read());
        self.insert(node.clone());
        pd.dir_mut()?.insert(name, ino, kind);
        self.settle(pd);
        if is_dir {
            parent.nlink.fetch_add(1, AcqRel);
        }
        pd.mtime = now;
        pd.ctime = now;
        Ok((node, entry))
    }

    fn make(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        mode: u32,
        rdev: u32,
        content: Content,
    ) -> Result<Entry, Errno> {
        let name = check_name(name)?;
        let p = self.get(parent)?;
        let mut pd = p.write();
        self.create_node(ctx, &p, &mut pd, name, mode, rdev, content, 0)
            .map(|(_, e)| e)
    }

    fn do_lookup(&self, caller: &Caller, parent: Inode, name: &CStr) -> Result<Option<Entry>, Errno> {
        let p = self.get(parent)?;
        let pd = p.read();
        let dir = pd.dir()?;
        self.may(caller, &pd, libc::X_OK)?;
        too_long(name.to_bytes())?;
        let Some(e) = dir.get(name.to_bytes()) else {
            return Ok(None);
        };
        let node = self.get(Inode(e.ino))?;
        let entry = self.entry(&node, &node.read());
        node.lookups.fetch_add(1, AcqRel);
        Ok(Some(entry))
    }

    fn do_setattr(&self, ctx: &RequestContext<'_>, ino: Inode, a: &SetattrIn) -> Result<FileAttr, Errno> {
        let valid = SetattrValid::from_bits_retain(a.valid);
        let node = self.get(ino)?;
        let mut d = node.write();
        let caller = Caller::of(ctx);
        let privileged = caller.is_root();
        let owner = privileged || caller.uid == d.uid;
        // Checks that do not depend on the order of the changes come first,
        // so that a refused request changes nothing.
        if valid.contains(SetattrValid::SIZE) && !valid.contains(SetattrValid::FH) {
            // truncate(2) by name; ftruncate(2) needs a descriptor open for
            // writing, which the kernel has checked.
            self.may(&caller, &d, libc::W_OK)?;
        }
        if valid.intersects(SetattrValid::ATIME | SetattrValid::MTIME) && !owner {
            // Only the owner may set arbitrary times; anyone who may write
            // the file may set them to now.
            let explicit = (valid.contains(SetattrValid::ATIME) && !valid.contains(SetattrValid::ATIME_NOW))
                || (valid.contains(SetattrValid::MTIME) && !valid.contains(SetattrValid::MTIME_NOW));
            if explicit {
                return Err(Errno::EPERM);
            }
            self.may(&caller, &d, libc::W_OK)?;
        }
        let now = Time::now();
        if valid.contains(SetattrValid::MODE) {
            if !owner {
                return Err(Errno::EPERM);
            }
            let mut perm = a.mode & 0o7777;
            if !privileged && !caller.in_group(d.gid) {
                perm &= !libc::S_ISGID;
            }
            d.mode = (d.mode & libc::S_IFMT) | perm;
        }
        if valid.intersects(SetattrValid::UID | SetattrValid::GID) {
            let uid = if valid.contains(SetattrValid::UID) {
                a.uid
            } else {
                d.uid
            };
            let gid = if valid.contains(SetattrValid::GID) {
                a.gid
            } else {
                d.gid
            };
            if !privileged
                && (uid != d.uid || (gid != d.gid && (caller.uid != d.uid || !caller.in_group(gid))))
            {
                return Err(Errno::EPERM);
            }
            // chown(2) clears the set-ID bits of anything but a directory,
            // even when root calls it and even to the same owner.
            if d.mode & libc::S_IFMT != libc::S_IFDIR {
                d.kill_suid_sgid(Some(&caller));
                self.settle(&mut d);
            }
            d.uid = uid;
            d.gid = gid;
        }
        if valid.contains(SetattrValid::SIZE) {
            if a.size > MAX_SIZE {
                return Err(EFBIG);
            }
            d.file_mut()?.truncate(a.size);
            d.touch_modified();
        }
        if valid.contains(SetattrValid::KILL_SUIDGID) {
            d.kill_suid_sgid(None);
        }
        self.settle(&mut d);
        if valid.contains(SetattrValid::ATIME) {
            d.atime = if valid.contains(SetattrValid::ATIME_NOW) {
                now
            } else {
                Time {
                    sec: a.atime as i64,
                    nsec: a.atimensec.min(999_999_999),
                }
            };
        }
        if valid.contains(SetattrValid::MTIME) {
            d.mtime = if valid.contains(SetattrValid::MTIME_NOW) {
                now
            } else {
                Time {
                    sec: a.mtime as i64,
                    nsec: a.mtimensec.min(999_999_999),
                }
            };
        }
        d.ctime = if valid.contains(SetattrValid::CTIME) {
            Time {
                sec: a.ctime as i64,
                nsec: a.ctimensec.min(999_999_999),
            }
        } else {
            now
        };
        Ok(node.attr(&d))
    }

    fn do_unlink(&self, caller: &Caller, parent: Inode, name: &CStr, want_dir: bool) -> Result<(), Errno> {
        let p = self.get(parent)?;
        let mut pd = p.write();
        let name = name.to_bytes();
        if name == b"." {
            return Err(Errno::EINVAL);
        }
        pd.dir()?;
        self.may(caller, &pd, libc::X_OK)?;
        too_long(name)?;
        let e = pd.dir()?.get(name).cloned().ok_or(Errno::ENOENT)?;
        self.may(caller, &pd, libc::W_OK | libc::X_OK)?;
        let is_dir = e.kind == libc::S_IFDIR;
        if want_dir && !is_dir {
            return Err(Errno::ENOTDIR);
        }
        if !want_dir && is_dir {
            return Err(Errno::EISDIR);
        }
        let child = self.get(Inode(e.ino))?;
        {
            // Directory before what is in it: the parent is already held.
            let mut cd = child.write();
            if sticky_forbids(caller, &pd, cd.uid) {
                return Err(Errno::EPERM);
            }
            if is_dir {
                if !cd.dir()?.is_empty() {
                    return Err(Errno::ENOTEMPTY);
                }
                child.nlink.store(0, Release);
                p.nlink.fetch_sub(1, AcqRel);
            } else {
                self.unlinked(child.nlink.fetch_sub(1, AcqRel));
            }
            cd.ctime = Time::now();
        }
        pd.dir_mut()?.remove(name);
        self.settle(&mut pd);
        pd.touch_modified();
        drop(pd);
        self.maybe_free(&child);
        Ok(())
    }

    fn do_rename(
        &self,
        caller: &Caller,
        parent: Inode,
        name: &CStr,
        newparent: Inode,
        newname: &CStr,
        flags: u32,
    ) -> Result<(), Errno> {
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags & RENAME_NOREPLACE != 0 && flags & RENAME_EXCHANGE != 0
        {
            return Err(Errno::EINVAL); // RENAME_WHITEOUT is for overlay filesystems
        }
        let exchange = flags & RENAME_EXCHANGE != 0;
        let (name, newname) = (too_long(name.to_bytes())?, check_name(newname)?);
        let cross = parent != newparent;
        let _tree = cross.then(|| self.rename_lock.lock().unwrap_or_else(|e| e.into_inner()));
        let p = self.get(parent)?;
        let np = self.get(newparent)?;
        let mut dirs = if !cross {
            Dirs::Same(p.write())
        } else if self.is_ancestor(p.ino, np.ino) || (!self.is_ancestor(np.ino, p.ino) && p.ino < np.ino) {
            let src = p.write();
            Dirs::Two { src, dst: np.write() }
        } else {
            let dst = np.write();
            Dirs::Two { src: p.write(), dst }
        };
        if np.nlink.load(Acquire) == 0 {
            return Err(Errno::ENOENT);
        }
        dirs.src().dir()?;
        dirs.dst().dir()?;
        self.may(caller, dirs.src(), libc::X_OK)?;
        self.may(caller, dirs.dst(), libc::X_OK)?;
        let src = dirs.src().dir()?.get(name).cloned().ok_or(Errno::ENOENT)?;
        let dst = dirs.dst().dir()?.get(newname).cloned();
        match &dst {
            Some(_) if flags & RENAME_NOREPLACE != 0 => return Err(Errno::EEXIST),
            None if exchange => return Err(Errno::ENOENT),
            Some(d) if d.ino == src.ino => return Ok(()), // two names of one file
            _ => {}
        }
        let src_is_dir = src.kind == libc::S_IFDIR;
        let dst_is_dir = dst.as_ref().is_some_and(|d| d.kind == libc::S_IFDIR);
        // No directory may move below itself.
        if cross && src_is_dir && self.is_ancestor(src.ino, np.ino) {
            return Err(Errno::EINVAL);
        }
        if let Some(d) = dst.as_ref().filter(|_| exchange)
            && cross
            && dst_is_dir
            && self.is_ancestor(d.ino, p.ino)
        {
            return Err(Errno::EINVAL);
        }
        // A directory replaced by a rename must not contain the source (it
        // would not be empty, and it must not be locked after `p`).
        if let Some(d) = dst.as_ref().filter(|_| !exchange && dst_is_dir)
            && (d.ino == p.ino || cross && self.is_ancestor(d.ino, p.ino))
        {
            return Err(Errno::ENOTEMPTY);
        }
        let src_node = self.get(Inode(src.ino))?;
        let dst_node = dst.as_ref().map(|d| self.get(Inode(d.ino))).transpose()?;
        // Permissions, once the names are known to make sense: write and
        // search on both directories, the sticky rule for the names removed
        // or replaced, and write permission on a directory that changes
        // parent (its ".." changes). Neither child is one of the two locked
        // directories nor above them (refused above), so taking their locks
        // now keeps the order: directories before what is in them.
        self.may(caller, dirs.src(), libc::W_OK | libc::X_OK)?;
        self.may(caller, dirs.dst(), libc::W_OK | libc::X_OK)?;
        {
            let sd = src_node.read();
            if sticky_forbids(caller, dirs.src(), sd.uid) {
                return Err(Errno::EPERM);
            }
            if cross && src_is_dir {
                self.may(caller, &sd, libc::W_OK)?;
            }
        }
        if let Some(n) = &dst_node {
            let dd = n.read();
            if sticky_forbids(caller, dirs.dst(), dd.uid) {
                return Err(Errno::EPERM);
            }
            if exchange && cross && dst_is_dir {
                self.may(caller, &dd, libc::W_OK)?;
            }
        }
        let now = Time::now();
        let mut replaced = None;
        if exchange {
            let Some(d) = dst else { return Err(Errno::ENOENT) };
            let dst_node = self.get(Inode(d.ino))?;
            dirs.src().dir_mut()?.replace(name, d.ino, d.kind);
            dirs.dst().dir_mut()?.replace(newname, src.ino, src.kind);
            if cross {
                if src_is_dir {
                    src_node.parent.store(np.ino, Release);
                }
                if dst_is_dir {
                    dst_node.parent.store(p.ino, Release);
                }
                if src_is_dir != dst_is_dir {
                    let (from, to) = if src_is_dir { (&p, &np) } else { (&np, &p) };
                    from.nlink.fetch_sub(1, AcqRel);
                    to.nlink.fetch_add(1, AcqRel);
                }
            }
            dst_node.write().ctime = now;
        } else {
            let dst_node = match &dst {
                Some(d) => {
                    if src_is_dir && !dst_is_dir {
                        return Err(Errno::ENOTDIR);
                    }
                    if !src_is_dir && dst_is_dir {
                        return Err(Errno::EISDIR);
                    }
                    Some(self.get(Inode(d.ino))?)
                }
                None => None,
            };
            let mut dst_data = dst_node.as_ref().map(|n| n.write());
            if let Some(dd) = &dst_data
                && dst_is_dir
                && !dd.dir()?.is_empty()
            {
                return Err(Errno::ENOTEMPTY);
            }
            // What the destination directory grows by, reserved before
            // anything changes: nothing when an entry of that name is
            // replaced; a new entry in another directory; in the same
            // directory, a longer name.
            let growth = match (&dst, cross) {
                (Some(_), _) => 0,
                (None, true) => dirs.dst().dir()?.insert_cost(newname.len()),
                (None, false) => dirent_cost(newname.len()).saturating_sub(dirent_cost(name.len())),
            };
            self.charge(dirs.dst(), growth)?;
            if let (Some(n), Some(dd)) = (&dst_node, &mut dst_data) {
                if dst_is_dir {
                    n.nlink.store(0, Release);
                    np.nlink.fetch_sub(1, AcqRel);
                } else {
                    self.unlinked(n.nlink.fetch_sub(1, AcqRel));
                }
                dd.ctime = now;
                dirs.dst().dir_mut()?.remove(newname);
            }
            drop(dst_data);
            replaced = dst_node;
            dirs.src().dir_mut()?.remove(name);
            dirs.dst().dir_mut()?.insert(newname, src.ino, src.kind);
            if cross && src_is_dir {
                src_node.parent.store(np.ino, Release);
                p.nlink.fetch_sub(1, AcqRel);
                np.nlink.fetch_add(1, AcqRel);
            }
        }
        self.settle(dirs.src());
        self.settle(dirs.dst());
        dirs.src().touch_modified();
        dirs.dst().touch_modified();
        src_node.write().ctime = now;
        drop(dirs);
        if let Some(n) = replaced {
            self.maybe_free(&n);
        }
        Ok(())
    }

    fn do_link(&self, caller: &Caller, ino: Inode, newparent: Inode, newname: &CStr) -> Result<Entry, Errno> {
        let newname = check_name(newname)?;
        let node = self.get(ino)?;
        // Checked before taking the directory's lock: a directory could be
        // an ancestor of `newparent`, and ancestors are locked first.
        if node.read().mode & libc::S_IFMT == libc::S_IFDIR {
            return Err(Errno::EPERM);
        }
        let np = self.get(newparent)?;
        let mut pd = np.write();
        if np.nlink.load(Acquire) == 0 {
            return Err(Errno::ENOENT);
        }
        pd.dir()?;
        self.may(caller, &pd, libc::X_OK)?;
        if pd.dir()?.get(newname).is_some() {
            return Err(Errno::EEXIST);
        }
        self.may(caller, &pd, libc::W_OK | libc::X_OK)?;
        let mut d = node.write();
        if node.nlink.load(Acquire) == 0 {
            return Err(Errno::ENOENT);
        }
        // Each extra name takes an inode slot (as on tmpfs), and the
        // directory's bytes for the entry.
        self.cap.reserve_inode()?;
        let entry_cost = pd.dir()?.insert_cost(newname.len());
        if let Err(e) = self.charge(&mut pd, entry_cost) {
            self.cap.release_inode();
            return Err(e);
        }
        node.nlink.fetch_add(1, AcqRel);
        d.ctime = Time::now();
        pd.dir_mut()?.insert(newname, node.ino, d.mode & libc::S_IFMT);
        self.settle(&mut pd);
        pd.touch_modified();
        node.lookups.fetch_add(1, AcqRel);
        Ok(self.entry(&node, &d))
    }

    fn do_atomic_open(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        flags: i32,
        mode: u32,
    ) -> Result<(Entry, bool), Errno> {
        let name = check_name(name)?;
        let p = self.get(parent)?;
        let mut pd = p.write();
        let caller = Caller::of(ctx);
        pd.dir()?;
        self.may(&caller, &pd, libc::X_OK)?;
        if let Some(e) = pd.dir()?.get(name).cloned() {
            if flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0 {
                return Err(Errno::EEXIST);
            }
            let node = self.get(Inode(e.ino))?;
            let entry = self.open_node(&caller, &node, flags)?;
            node.lookups.fetch_add(1, AcqRel);
            return Ok((entry, false));
        }
        if flags & libc::O_CREAT == 0 {
            return Err(Errno::ENOENT);
        }
        let mode = libc::S_IFREG | (mode & 0o7777);
        let content = Content::File(FileData::default());
        let (_, entry) = self.create_node(ctx, &p, &mut pd, name, mode, 0, content, 1)?;
        Ok((entry, true))
    }

    /// Opens an existing inode. O_TRUNC truncates a regular file whatever
    /// the access mode, `O_RDONLY|O_TRUNC` included (memfs asks for
    /// ATOMIC_O_TRUNC, so the kernel sends O_TRUNC here instead of a
    /// separate SETATTR).
    fn open_node(&self, caller: &Caller, node: &Node, flags: i32) -> Result<Entry, Errno> {
        let mut d = node.write();
        let trunc = flags & libc::O_TRUNC != 0;
        let acc = flags & libc::O_ACCMODE;
        let writing = acc != libc::O_RDONLY || trunc;
        if writing && d.mode & libc::S_IFMT == libc::S_IFDIR {
            return Err(Errno::EISDIR);
        }
        let mut mask = if writing { libc::W_OK } else { 0 };
        if acc != libc::O_WRONLY {
            mask |= libc::R_OK;
        }
        self.may(caller, &d, mask)?;
        if trunc && let Content::File(f) = &mut d.content {
            if f.size() != 0 {
                f.truncate(0);
                d.touch_modified();
            }
            if !caller.is_root() {
                d.kill_suid_sgid(Some(caller));
            }
            self.settle(&mut d);
        }
        node.opens.fetch_add(1, AcqRel);
        Ok(self.entry(node, &d))
    }

    fn do_write(&self, ino: Inode, offset: u64, data: &[u8], kill_priv: bool) -> Result<u32, Errno> {
        offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_SIZE)
            .ok_or(EFBIG)?;
        let node = self.get(ino)?;
        let mut d = node.write();
        let n = self.write_locked(&mut d, offset, data)?;
        if kill_priv {
            d.kill_suid_sgid(None);
        }
        self.settle(&mut d);
        Ok(n as u32)
    }

    /// Writes `data` at `offset` into the file `d` (write locked), or the
    /// longest part of it that the capacity has room for (a short write, as
    /// on tmpfs: up to the first page that cannot be charged); ENOSPC when
    /// not one byte fits. Nothing is written before it is charged, so a
    /// refused write changes nothing. The caller settles.
    fn write_locked(&self, d: &mut Data, offset: u64, data: &[u8]) -> Result<usize, Errno> {
        let len = data.len() as u64;
        let f = d.file()?;
        let (pages, new) = (f.pages(), f.new_pages(offset, len));
        let cost = |added: u64| data::cost_with_pages(pages + added) - data::cost_with_pages(pages);
        let n = if self.charge(d, cost(new)).is_ok() {
            data.len()
        } else {
            // Other writers move the free space meanwhile: try what fits
            // now a few times, then give up.
            let mut fitted = None;
            for _ in 0..16 {
                let free = self.cap.bytes_free();
                // The most pages `free` pays for.
                let mut budget = new;
                while budget > 0 && cost(budget) > free {
                    budget = (budget - 1).min(free / capacity::PAGE_COST);
                }
                let n = d.file()?.fit(offset, len, budget);
                if n == 0 {
                    break;
                }
                if self.charge(d, cost(budget)).is_ok() {
                    fitted = Some(n as usize);
                    break;
                }
            }
            fitted.ok_or(ENOSPC)?
        };
        d.file_mut()?.write(offset, &data[..n]);
        d.touch_modified();
        Ok(n)
    }

    fn do_fallocate(
        &self,
        caller: &Caller,
        ino: Inode,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<bool, Errno> {
        offset
            .checked_add(length)
            .filter(|&e| e <= MAX_SIZE)
            .ok_or(EFBIG)?;
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let node = self.get(ino)?;
        let mut d = node.write();
        let f = match d.file_mut() {
            Ok(f) => f,
            Err(Errno::EISDIR) => return Err(Errno::EISDIR),
            Err(_) => return Err(ENODEV),
        };
        match mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => {
                // KEEP_SIZE allocates past the end too, as on tmpfs.
                let pages = f.pages();
                let cost =
                    data::cost_with_pages(pages + f.new_pages(offset, length)) - data::cost_with_pages(pages);
                // Memory is the backing store: without a size limit, refuse
                // what cannot fit now rather than let a later write abort
                // the process.
                if self.cap.max_bytes() == capacity::UNLIMITED && cost > available_memory() {
                    return Err(ENOSPC);
                }
                // All or nothing, as on tmpfs.
                self.charge(&mut d, cost)?;
                d.file_mut()?.allocate(offset, length, !keep_size);
            }
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => f.punch_hole(offset, length),
            _ => return Err(Errno::EOPNOTSUPP),
        }
        let before = d.mode;
        if !caller.is_root() {
            d.kill_suid_sgid(Some(caller));
        }
        d.touch_modified();
        self.settle(&mut d);
        Ok(d.mode != before)
    }

    /// Returns the bytes copied and whether the destination's mode changed
    /// (set-ID bits cleared for a caller that may not keep them, as a write
    /// does).
    fn do_copy(
        &self,
        caller: &Caller,
        ino_in: Inode,
        off_in: u64,
        ino_out: Inode,
        off_out: u64,
        len: u64,
    ) -> Result<(u64, bool), Errno> {
        let src = self.get(ino_in)?;
        let mut mode_changed = false;
        let dst = self.get(ino_out)?;
        // Copy through a small buffer, a piece at a time, so that the two
        // inode locks are never held together (same inode included) and
        // the buffer stays small whatever the length.
        let len = len.min(COPY_MAX);
        let mut buf = vec![0u8; COPY_PIECE.min(len as usize)];
        let mut done = 0u64;
        while done < len {
            let want = (len - done).min(buf.len() as u64) as usize;
            let got = {
                let d = src.read();
                d.file()?.read(off_in + done, &mut buf[..want])
            };
            if got == 0 {
                break;
            }
            let at = off_out + done;
            let written = if at.checked_add(got as u64).is_some_and(|e| e <= MAX_SIZE) {
                let mut d = dst.write();
                let r = self.write_locked(&mut d, at, &buf[..got]);
                if r.is_ok() && !caller.is_root() {
                    let before = d.mode;
                    d.kill_suid_sgid(Some(caller));
                    mode_changed |= d.mode != before;
                }
                self.settle(&mut d);
                r
            } else {
                Err(EFBIG)
            };
            match written {
                Ok(n) if n < got => return Ok((done + n as u64, mode_changed)),
                Ok(n) => done += n as u64,
                // What was copied stands; the error comes with the next call.
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok((done, mode_changed))
    }

    fn do_setxattr(
        &self,
        caller: &Caller,
        ino: Inode,
        name: &CStr,
        value: &[u8],
        flags: i32,
    ) -> Result<(), Errno> {
        if value.len() > MAX_XATTR {
            return Err(E2BIG);
        }
        let name = name.to_bytes();
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(Errno::ERANGE);
        }
        let node = self.get(ino)?;
        let mut d = node.write();
        self.xattr_allowed(caller, &d, name, true)?;
        let exists = d.xattrs.contains(name);
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(Errno::EEXIST);
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(Errno::ENODATA);
        }
        let growth = d
            .xattrs
            .cost_with(name, value.len())
            .saturating_sub(d.xattrs.cost());
        self.charge(&mut d, growth)?;
        d.xattrs.set(name, value);
        d.ctime = Time::now();
        self.settle(&mut d);
        Ok(())
    }

    /// What statfs reports: the limits and the usage in 4 KiB blocks (free
    /// blocks rounded down, so that what df shows free can be written), and
    /// inode slots. Without a limit, the free part is the host's available
    /// memory (blocks) or a large number (inodes).
    fn statfs_now(&self) -> Kstatfs {
        const BSIZE: u64 = 4096;
        let (used, inodes) = self.usage();
        let (blocks, free) = match self.cap.max_bytes() {
            capacity::UNLIMITED => {
                let free = available_memory() / BSIZE;
                (used.div_ceil(BSIZE) + free, free)
            }
            max => (max / BSIZE, max.saturating_sub(used) / BSIZE),
        };
        let (files, ffree) = match self.cap.max_inodes() {
            capacity::UNLIMITED => (inodes + (1 << 20), 1 << 20),
            max => (max, max.saturating_sub(inodes)),
        };
        Kstatfs {
            blocks,
            bfree: free,
            bavail: free,
            files,
            ffree,
            bsize: BSIZE as u32,
            namelen: MAX_NAME as u32,
            frsize: BSIZE as u32,
            ..Kstatfs::default()
        }
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes (1 GiB if unknown).
fn available_memory() -> u64 {
    capacity::meminfo("MemAvailable:").unwrap_or(1 << 30)
}

/// Whether `caller` may access an inode of `mode`/`uid`/`gid` for `mask`.
fn permitted(caller: &Caller, d: &Data, mask: i32) -> bool {
    let mask = (mask & (libc::R_OK | libc::W_OK | libc::X_OK)) as u32;
    if caller.is_root() {
        // root may read and write anything, and execute what anyone may.
        return mask & libc::X_OK as u32 == 0
            || d.mode & libc::S_IFMT == libc::S_IFDIR
            || d.mode & 0o111 != 0;
    }
    let grants = |bits: u32| bits & mask == mask;
    if caller.uid == d.uid {
        return grants((d.mode >> 6) & 7);
    }
    let (group, other) = (grants((d.mode >> 3) & 7), grants(d.mode & 7));
    // Group membership (which may mean reading /proc) matters only when
    // the group and other bits answer differently.
    if group != other && caller.in_group(d.gid) {
        group
    } else {
        other
    }
}

const USER: &[u8] = b"user.";
const TRUSTED: &[u8] = b"trusted.";
const SECURITY: &[u8] = b"security.";

/// The sticky-directory rule: in a directory with S_ISVTX only root, the
/// directory's owner and the file's owner (`owner`) may remove or rename it.
fn sticky_forbids(caller: &Caller, dir: &Data, owner: u32) -> bool {
    dir.mode & libc::S_ISVTX != 0 && !caller.is_root() && caller.uid != dir.uid && caller.uid != owner
}

impl Filesystem for MemFs {
    // Its tree goes to the successor at an upgrade (keep.rs); after a crash
    // node ids it lost answer ESTALE and are never given out again.
    fn recovery(&self) -> Recovery {
        Recovery::HandedOver
    }

    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        // DONT_MASK: we apply the umask ourselves (create_node); the rest:
        // `ls -l` gets names and attributes in one round trip.
        config.want(InitFlags::DONT_MASK | InitFlags::DO_READDIRPLUS | InitFlags::READDIRPLUS_AUTO);
        // O_TRUNC in OPEN (see `open_node`): truncation and the open's
        // permission check happen under one lock.
        config.want(InitFlags::ATOMIC_O_TRUNC);
        // memfs clears set-ID bits itself on chown, truncate and write (see
        // `kill_suid_sgid`). Without this the kernel sends a chown as
        // SETATTR(MODE|UID|GID) with a mode computed from its cached i_mode,
        // and without default_permissions that i_mode lacks S_ISVTX (the
        // kernel hides it so that the VFS does not apply the sticky rule the
        // filesystem is in charge of): the sticky bit would be lost.
        config.want(InitFlags::HANDLE_KILLPRIV_V2);
        config.default_permissions = self.config.default_permissions;
        if self.config.posix_lock {
            config.want(InitFlags::POSIX_LOCKS);
        }
        if self.config.flock {
            config.want(InitFlags::FLOCK_LOCKS);
        }
        Ok(())
    }

    fn destroy(&self) {
        log::info!("memfs: {} inodes alive at the end", self.inode_count());
    }

    fn lookup(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        match self.do_lookup(&Caller::of(ctx), parent, name) {
            Ok(Some(e)) => reply.entry(&e),
            // Every change passes through the kernel, so it may remember
            // that the name does not exist.
            Ok(None) => reply.negative(self.config.ttl),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _ctx: &RequestContext<'_>, ino: Inode, nlookup: u64) {
        if let Ok(node) = self.get(ino) {
            let _ = node
                .lookups
                .fetch_update(AcqRel, Acquire, |n| Some(n.saturating_sub(nlookup)));
            self.maybe_free(&node);
        }
    }

    fn getattr(&self, _ctx: &RequestContext<'_>, ino: Inode, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.get(ino) {
            Ok(node) => {
                let attr = node.attr(&node.read());
                reply.attr(self.config.ttl, &attr)
            }
            Err(e) => reply.error(e),
        }
    }

    fn setattr(&self, ctx: &RequestContext<'_>, ino: Inode, req: &SetattrRequest, reply: ReplyAttr) {
        // The kernel's struct: do_setattr follows its `valid` bits.
        let ttl = self.config.ttl;
        reply.result(self.do_setattr(ctx, ino, req.raw()).map(|a| (ttl, a)));
    }

    fn readlink(&self, _ctx: &RequestContext<'_>, ino: Inode, reply: ReplyData) {
        match self.get(ino) {
            Ok(node) => match &node.read().content {
                Content::Symlink(t) => reply.data(t),
                _ => reply.error(Errno::EINVAL),
            },
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        target: &CStr,
        reply: ReplyEntry,
    ) {
        let content = Content::Symlink(target.to_bytes().into());
        reply.result(self.make(ctx, parent, name, libc::S_IFLNK | 0o777, 0, content));
    }

    fn mknod(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: MknodRequest,
        reply: ReplyEntry,
    ) {
        let MknodRequest { mode, rdev } = req;
        let content = match mode & libc::S_IFMT {
            libc::S_IFREG => Content::File(FileData::default()),
            libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFCHR | libc::S_IFBLK => Content::Special,
            _ => return reply.error(Errno::EINVAL),
        };
        reply.result(self.make(ctx, parent, name, mode, rdev, content));
    }

    fn mkdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, mode: u32, reply: ReplyEntry) {
        let content = Content::Dir(DirData::default());
        reply.result(self.make(ctx, parent, name, libc::S_IFDIR | (mode & 0o7777), 0, content));
    }

    fn unlink(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        reply.result(self.do_unlink(&Caller::of(ctx), parent, name, false));
    }

    fn rmdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        reply.result(self.do_unlink(&Caller::of(ctx), parent, name, true));
    }

    fn rename(&self, ctx: &RequestContext<'_>, req: &RenameRequest<'_>, reply: ReplyEmpty) {
        let RenameRequest {
            parent,
            name,
            newparent,
            newname,
            flags,
        } = *req;
        reply.result(self.do_rename(&Caller::of(ctx), parent, name, newparent, newname, flags.bits()));
    }

    fn link(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        newparent: Inode,
        newname: &CStr,
        reply: ReplyEntry,
    ) {
        reply.result(self.do_link(&Caller::of(ctx), ino, newparent, newname));
    }

    fn open(&self, ctx: &RequestContext<'_>, ino: Inode, flags: OpenFlags, reply: ReplyOpen) {
        let r = self
            .get(ino)
            .and_then(|n| self.open_node(&Caller::of(ctx), &n, flags.bits()));
        reply.result(r.map(|_| (FileHandle(0), FopenFlags::empty())));
    }

    fn read(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        req: ReadRequest,
        reply: ReplyData,
    ) {
        let ReadRequest { offset, size, .. } = req;
        let node = match self.get(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let d = node.read();
        match d.file() {
            // The session's per-thread buffer: no allocation per read.
            Ok(f) => reply.with_buffer(size as usize, |buf| Ok(f.read(offset, buf))),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        let WriteRequest {
            offset,
            data,
            write_flags,
            ..
        } = req;
        let kill = write_flags.contains(WriteFlags::KILL_SUIDGID);
        // In memory unless the session splices WRITEs: then read from the pipe.
        let data = match data.fetch() {
            Ok(d) => d,
            Err(e) => return reply.io_error(&e),
        };
        reply.result(self.do_write(ino, offset, data, kill));
    }

    fn flush(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        // A process closed a descriptor of the file: its POSIX locks go.
        self.locks.drop_owner(ino.0, lo, false);
        reply.ok();
    }

    fn getlk(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        req: LockRequest,
        reply: ReplyLock,
    ) {
        let LockRequest { owner, lock, .. } = req;
        self.locks.getlk(ino.0, owner, lock, reply);
    }

    fn setlk(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        req: LockRequest,
        reply: ReplyEmpty,
    ) {
        let LockRequest {
            owner,
            lock,
            sleep,
            flock,
        } = req;
        let node = match self.get(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        // Locks are taken only while the file is open: they all go when
        // its last open file is released (see `release`).
        let is_open = move || node.opens.load(Acquire) > 0;
        self.locks
            .setlk(ctx, ino.0, owner, lock, sleep, flock, is_open, reply);
    }

    fn release(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        req: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        let ReleaseRequest {
            lock_owner,
            flock_release,
            ..
        } = req;
        if let (true, Some(owner)) = (flock_release, lock_owner) {
            self.locks.drop_owner(ino.0, owner, true);
        }
        if let Ok(node) = self.get(ino) {
            let before = node
                .opens
                .fetch_update(AcqRel, Acquire, |n| Some(n.saturating_sub(1)))
                .unwrap_or(0);
            if before <= 1 {
                // The last open file: no lock can be held any more, but
                // the kernel names the owner of an OFD lock on no release.
                self.locks.drop_file(ino.0, || node.opens.load(Acquire) == 0);
            }
            self.maybe_free(&node);
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _ctx: &RequestContext<'_>,
        _ino: Inode,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok(); // memory is as durable as it gets
    }

    fn opendir(&self, ctx: &RequestContext<'_>, ino: Inode, _flags: OpenFlags, reply: ReplyOpen) {
        let r = self
            .get(ino)
            .and_then(|n| self.may(&Caller::of(ctx), &n.read(), libc::R_OK));
        reply.result(r.map(|()| (FileHandle(0), FopenFlags::empty())));
    }

    fn readdir(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let node = match self.get(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let d = node.read();
        let dir = match d.dir() {
            Ok(dir) => dir,
            Err(e) => return reply.error(e),
        };
        let dir_kind = FileKind::Directory;
        if offset < 1 && reply.add(Inode(node.ino), 1, dir_kind, b".").is_full() {
            return reply.ok();
        }
        let parent = Inode(node.parent.load(Acquire));
        if offset < DOTDOT_COOKIE && reply.add(parent, DOTDOT_COOKIE, dir_kind, b"..").is_full() {
            return reply.ok();
        }
        for (cookie, e) in dir.after(offset.max(DOTDOT_COOKIE)) {
            let kind = FileKind::from_mode(e.kind).unwrap_or(FileKind::RegularFile);
            if reply.add(Inode(e.ino), cookie, kind, &e.name).is_full() {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let node = match self.get(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let d = node.read();
        let dir = match d.dir() {
            Ok(dir) => dir,
            Err(e) => return reply.error(e),
        };
        // "." and "..": the kernel takes no reference and caches nothing.
        let dot = |ino: u64| Entry {
            ino: Inode(ino),
            attr: FileAttr {
                ino,
                kind: FileKind::Directory,
                ..FileAttr::default()
            },
            ..Entry::default()
        };
        if offset < 1 && reply.add(&dot(node.ino), 1, b".").is_full() {
            return reply.ok();
        }
        let dotdot = dot(node.parent.load(Acquire));
        if offset < DOTDOT_COOKIE && reply.add(&dotdot, DOTDOT_COOKIE, b"..").is_full() {
            return reply.ok();
        }
        for (cookie, e) in dir.after(offset.max(DOTDOT_COOKIE)) {
            let Ok(child) = self.get(Inode(e.ino)) else {
                continue;
            };
            let entry = self.entry(&child, &child.read());
            match reply.add(&entry, cookie, &e.name) {
                DirPlusAdd::Full => break,
                // The kernel counts an entry it receives as a lookup.
                DirPlusAdd::Added { lookup: true } => {
                    child.lookups.fetch_add(1, AcqRel);
                }
                _ => {}
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _ctx: &RequestContext<'_>,
        _ino: Inode,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _ctx: &RequestContext<'_>, _ino: Inode, reply: ReplyStatfs) {
        reply.statfs(self.statfs_now());
    }

    fn setxattr(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        name: &CStr,
        req: SetxattrRequest<'_>,
        reply: ReplyEmpty,
    ) {
        let SetxattrRequest { value, flags, .. } = req;
        reply.result(self.do_setxattr(&Caller::of(ctx), ino, name, value, flags));
    }

    fn getxattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, size: u32, reply: ReplyXattr) {
        let node = match self.get(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let d = node.read();
        if let Err(e) = self.xattr_allowed(&Caller::of(ctx), &d, name.to_bytes(), false) {
            return reply.error(e);
        }
        match d.xattrs.get(name.to_bytes()) {
            None => reply.error(Errno::ENODATA),
            Some(v) if size == 0 => reply.size(v.len() as u32),
            Some(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Some(v) => reply.data(v),
        }
    }

    fn listxattr(&self, ctx: &RequestContext<'_>, ino: Inode, size: u32, reply: ReplyXattr) {
        let node = match self.get(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        // trusted.* is invisible to unprivileged callers.
        let root = ctx.uid() == 0;
        let d = node.read();
        let visible = || d.xattrs.names().filter(|n| root || !n.starts_with(TRUSTED));
        // Measured first: the list is built only when it is wanted and
        // fits the caller's buffer (at most the kernel's 64 KiB).
        let total: usize = visible().map(|n| n.len() + 1).sum();
        if size == 0 {
            return reply.size(total.min(u32::MAX as usize) as u32);
        }
        if total > size as usize {
            return reply.error(Errno::ERANGE);
        }
        let mut names = Vec::with_capacity(total);
        for name in visible() {
            names.extend_from_slice(name);
            names.push(0);
        }
        reply.data(&names)
    }

    fn removexattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, reply: ReplyEmpty) {
        let node = match self.get(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let mut d = node.write();
        if let Err(e) = self.xattr_allowed(&Caller::of(ctx), &d, name.to_bytes(), true) {
            return reply.error(e);
        }
        if d.xattrs.remove(name.to_bytes()) {
            d.ctime = Time::now();
            self.settle(&mut d);
            reply.ok()
        } else {
            reply.error(Errno::ENODATA)
        }
    }

    fn access(&self, ctx: &RequestContext<'_>, ino: Inode, mask: i32, reply: ReplyEmpty) {
        match self.get(ino) {
            Ok(node) if permitted(&Caller::of(ctx), &node.read(), mask) => reply.ok(),
            Ok(_) => reply.error(Errno::EACCES),
            Err(e) => reply.error(e),
        }
    }

    fn atomic_open(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: CreateRequest,
        reply: ReplyCreate,
    ) {
        match self.do_atomic_open(ctx, parent, name, req.flags.bits(), req.mode) {
            Ok((e, true)) => reply.created(&e, FileHandle(0), FopenFlags::empty()),
            Ok((e, false)) => reply.opened(&e, FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        req: FallocateRequest,
        reply: ReplyEmpty,
    ) {
        let FallocateRequest { offset, length, mode } = req;
        let r = self.do_fallocate(&Caller::of(ctx), ino, offset, length, mode);
        reply.result(r.map(|mode_changed| drop_cached_mode(ctx, ino, mode_changed)));
    }

    fn lseek(
        &self,
        _ctx: &RequestContext<'_>,
        ino: Inode,
        _fh: FileHandle,
        req: LseekRequest,
        reply: ReplyLseek,
    ) {
        let LseekRequest { offset, whence } = req;
        let node = match self.get(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let d = node.read();
        let f = match d.file() {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let found = match whence {
            libc::SEEK_DATA => f.seek_data(offset),
            libc::SEEK_HOLE => f.seek_hole(offset),
            _ => return reply.error(Errno::EINVAL), // the kernel handles SET/CUR/END
        };
        match found {
            Some(off) => reply.offset(off),
            None => reply.error(ENXIO),
        }
    }

    fn copy_file_range(&self, ctx: &RequestContext<'_>, req: &CopyFileRangeRequest, reply: ReplyCopy) {
        let CopyFileRangeRequest {
            ino_in,
            off_in,
            ino_out,
            off_out,
            len,
            flags,
            ..
        } = *req;
        if flags != 0 {
            return reply.error(Errno::EINVAL);
        }
        let r = self.do_copy(&Caller::of(ctx), ino_in, off_in, ino_out, off_out, len);
        reply.result(r.map(|(n, mode_changed)| {
            drop_cached_mode(ctx, ino_out, mode_changed);
            n
        }));
    }
}

/// After set-ID bits were cleared by a FALLOCATE or COPY_FILE_RANGE (which
/// the kernel answers without new attributes and sends without a kill
/// flag): the kernel's cached mode would go on showing them, and an exec
/// honouring them, so it is dropped before the answer.
fn drop_cached_mode(ctx: &RequestContext<'_>, ino: Inode, changed: bool) {
    if changed && let Err(e) = ctx.notifier().inval_inode(ino, -1, 0).and_then(|t| t.wait()) {
        log::warn!("dropping the cached attributes of ino {ino} after clearing its set-ID bits: {e}");
    }
}

/// Each charge of `capacity.rs` against the memory its record really holds
/// (counted by `alloc_count.rs`), as records are added and removed.
#[cfg(test)]
mod tests {
    use super::alloc_count::held;
    use super::capacity::{MAP_COST, PAGE_COST};
    use super::*;

    fn memfs() -> MemFs {
        MemFs::new(MemFsConfig {
            size: 0,
            nr_inodes: 0,
            ..MemFsConfig::default()
        })
    }

    /// A node as `create_node` makes it, charged for what it holds.
    fn node(fs: &MemFs, content: Content) -> Arc<Node> {
        let mut d = Data {
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
            atime: Time::default(),
            mtime: Time::default(),
            ctime: Time::default(),
            xattrs: Xattrs::default(),
            content,
            charged: 0,
        };
        d.charged = d.usage();
        fs.cap.force_bytes(d.charged);
        let _ = fs.cap.reserve_inode();
        Arc::new(Node {
            ino: fs.ids.next(),
            nlink: AtomicU32::new(1),
            lookups: AtomicU64::new(0),
            opens: AtomicU32::new(0),
            parent: AtomicU64::new(Inode::ROOT.0),
            data: RwLock::new(d),
            cap: fs.cap.clone(),
        })
    }

    /// Asserts that the memory held since `start` is within `charged`.
    #[track_caller]
    fn within(what: &str, start: i64, charged: u64) {
        let used = held() - start;
        assert!(
            used <= charged as i64,
            "{what}: {used} bytes allocated, {charged} charged"
        );
    }

    #[test]
    fn inode_charges_cover_records_and_table_slots() {
        for kind in 0..4 {
            let fs = memfs();
            let base = fs.cap.bytes_used();
            let mut inos = Vec::with_capacity(4000);
            let start = held();
            for i in 0..4000 {
                let content = match kind {
                    0 => Content::File(FileData::default()),
                    1 => Content::Dir(DirData::default()),
                    2 => Content::Symlink(vec![b'x'; i % 300].into()),
                    _ => Content::Special,
                };
                let n = node(&fs, content);
                inos.push(n.ino);
                fs.insert(n);
                within("inodes", start, fs.cap.bytes_used() - base);
            }
            // Freed (as FORGET does after the last unlink), every other
            // one first: the memory goes with the charge.
            let order = inos.iter().step_by(2).chain(inos.iter().skip(1).step_by(2));
            for &ino in order {
                let n = fs.get(Inode(ino)).unwrap();
                n.nlink.store(0, Release);
                fs.maybe_free(&n);
                drop(n);
                within("inodes freed", start, fs.cap.bytes_used() - base);
            }
            assert_eq!(fs.cap.bytes_used(), base);
        }
    }

    #[test]
    fn page_charges_cover_file_contents() {
        let mut f = FileData::default();
        let start = held();
        // One byte every 128 KiB, the sparsest use of pages.
        for i in 0..3000 {
            f.write(i * 128 * 1024, b"x");
            within("sparse pages", start, f.cost());
        }
        assert_eq!(f.cost(), MAP_COST + 3000 * PAGE_COST);
        for i in (0..3000).rev() {
            f.truncate(i * 128 * 1024 + 1);
            within("truncated", start, f.cost());
        }
        // Dense, then holes punched in every other page.
        for i in 0..2000 {
            f.write(i * PAGE, &[1; 100]);
        }
        within("dense pages", start, f.cost());
        for i in (0..2000).step_by(2) {
            f.punch_hole(i * PAGE, PAGE);
            within("punched", start, f.cost());
        }
        f.truncate(0);
        within("empty", start, 0);
    }

    #[test]
    fn entry_charges_cover_directories() {
        let mut d = DirData::default();
        let start = held();
        let name = |i: usize| format!("{i:0width$}", width = 1 + i % 255).into_bytes();
        for i in 0..3000 {
            d.insert(&name(i), i as u64, libc::S_IFREG);
            within("entries", start, d.cost());
        }
        // Removed out of order: the maps shrink as they empty.
        for i in (0..3000)
            .step_by(3)
            .chain((1..3000).step_by(3))
            .chain((2..3000).step_by(3))
        {
            assert!(d.remove(&name(i)).is_some());
            within("entries removed", start, d.cost());
        }
        within("empty", start, 0);
    }

    #[test]
    fn xattr_charges_cover_attributes() {
        let mut x = Xattrs::default();
        let start = held();
        let name = |i: usize| format!("user.{i}").into_bytes();
        for i in 0..2000 {
            x.set(&name(i), &vec![7; i % 300]);
            within("xattrs", start, x.cost());
        }
        for i in 0..2000 {
            x.set(&name(i), &vec![8; (i * 7) % 500]);
            within("xattrs replaced", start, x.cost());
        }
        for i in (0..2000).rev() {
            assert!(x.remove(&name(i)));
            within("xattrs removed", start, x.cost());
        }
        within("empty", start, 0);
    }

    /// The test kit's conformance battery through the fake kernel (no
    /// mount): memfs checking permissions itself, and with the kernel's
    /// `default_permissions`; no protocol violation, nothing unsupported,
    /// and no lookup count left once the kernel forgot every node.
    #[test]
    fn the_conformance_battery_passes() {
        use fuse_wire::testing::TestKernel;
        use fuse_wire::testing::battery::Battery;
        for default_permissions in [false, true] {
            let fs = MemFs::new(MemFsConfig {
                default_permissions,
                ..MemFsConfig::default()
            });
            let k = TestKernel::start(fs).expect("the kit starts");
            let battery = Battery {
                default_permissions,
                ..Battery::default()
            };
            let report = battery.run(&k);
            report.assert_passed();
            assert_eq!(report.unsupported().count(), 0, "{report}");
            if let Err(f) = fuse_wire::testing::explorer::Explorer::default().run(&k) {
                panic!("{f}");
            }
            if let Err(r) = k.finish() {
                panic!("{r}");
            }
        }
    }
}

//! The path layer: a filesystem whose methods take paths, served by
//! [`PathFs`] (an adapter implementing [`crate::Filesystem`]).
//!
//! The filesystem implements [`PathFilesystem`]: `getattr("/a/b")`,
//! `rename("/a", "/c")`, `open("/c/b")` returning a file of its own type
//! ([`PathFilesystem::File`]), and reads and writes through that file. The
//! library keeps the tree of names the kernel knows, so that it can turn a
//! node id back into a path:
//!
//! - every file or directory the kernel was given an entry for is a node
//!   with its names (parent and name), in the shared
//!   [`crate::inodes::InodeTable`] (node ids, generations, lookup counts as
//!   the kernel keeps them, dropped at FORGET);
//! - a rename moves the name, and with it the whole subtree below a
//!   directory; a replaced target, and an unlinked name, lose the name: a
//!   node with no name left still works through its open files (`path` is
//!   `None`, the file is given; GETATTR without a file uses any open file
//!   of the node, or for a removed directory its last attributes with no
//!   links), requests by path answer `ENOENT`;
//! - a hard link is one node with several names: LINK answers with the
//!   node of the file linked, and a LOOKUP finding a non-directory with
//!   more than one link and an `st_ino` ([`FileAttr::ino`]) it has seen
//!   gives that node (so the kernel keeps one inode, with one page cache
//!   and one link count, as for the other filesystems). A filesystem that
//!   reports `st_ino` promises that it identifies the file; with 0 each
//!   name found by LOOKUP is a node of its own.
//!
//! [`PathFs::invalidator`] drops the kernel's cached state of a path, safely
//! from anywhere (it only queues a notification and takes no tree lock).
//!
//! READ, WRITE, FLUSH, FSYNC and RELEASE get the open file only (no path is
//! built for them); every other request builds its paths in new `PathBuf`s
//! (an allocation per request, as libfuse's high-level API does).
//!
//! Permission checks: mount with `default_permissions` (the kernel checks),
//! or check in the methods against [`RequestContext::caller`]; the layer
//! answers ACCESS with `ENOSYS` (the kernel then grants it). A by-name
//! SETATTR, LINK, SETXATTR or REMOVEXATTR sees in
//! [`RequestContext::node_attr`] the node's attributes as last reported,
//! those the kernel checked: a method that re-checks a name against the
//! node (it may have been replaced in the source) compares with them where
//! the caller is unnamed (idmapped mounts, `Caller::is_unmapped`).
//!
//! Set-ID bits: the layer asks for `HANDLE_KILLPRIV_V2` and clears them
//! itself where the VFS would (a flagged WRITE, truncate, chown or
//! `O_TRUNC` open; FALLOCATE and COPY_FILE_RANGE by a caller without
//! `CAP_FSETID`), by [`PathFilesystem::getattr`] and a mode-only
//! [`PathFilesystem::setattr`] (of the open file for the requests on one).
//!
//! # Locking
//!
//! A request that uses paths holds one of [`TREE_SHARDS`] read locks (the
//! one its thread is assigned) while it builds its paths and runs the
//! method; a RENAME takes all of them for writing, so that no path changes
//! under a method that is using it, and no request is torn between an old
//! and a new name. That costs renames (they wait for path methods in
//! flight, and every request waits for a rename) but no lock is shared by
//! all requests. Below that, each directory's children have their own
//! lock, and the inode table its shard locks (children lock first).
//!
//! ```
//! use fuse_session::path::{PathDirFill, PathFilesystem, PathFs, PathOpened};
//! use fuse_session::reply::ReplyData;
//! use fuse_session::{Errno, FileAttr, FileKind, OpenFlags, ReadRequest, RequestContext};
//! use std::path::Path;
//!
//! struct Hello;
//! impl PathFilesystem for Hello {
//!     type File = ();
//!     fn getattr(&self, _: &RequestContext<'_>, path: Option<&Path>, _: Option<&()>) -> Result<FileAttr, Errno> {
//!         match path.and_then(Path::to_str) {
//!             Some("/") => Ok(FileAttr::fixed(1, FileKind::Directory, 0o555)),
//!             Some("/hello") => Ok(FileAttr::fixed(2, FileKind::RegularFile, 0o444).with_size(6)),
//!             _ => Err(Errno::ENOENT),
//!         }
//!     }
//!     fn open(&self, _: &RequestContext<'_>, _: &Path, _: OpenFlags) -> Result<PathOpened<()>, Errno> {
//!         Ok(PathOpened::new(()))
//!     }
//!     fn read(&self, _: &RequestContext<'_>, _: &(), req: ReadRequest, reply: ReplyData) {
//!         reply.data(&b"hello\n"[(req.offset as usize).min(6)..]);
//!     }
//!     fn readdir(&self, _: &RequestContext<'_>, _: &Path, offset: u64, out: &mut PathDirFill<'_>) -> Result<(), Errno> {
//!         // One entry, cookie 1: listed unless the kernel continues after it.
//!         for (cookie, name) in [(1, b"hello")].into_iter().skip(offset as usize) {
//!             if out.add(name, FileKind::RegularFile, cookie).is_full() {
//!                 break;
//!             }
//!         }
//!         Ok(())
//!     }
//! }
//!
//! let fs = PathFs::new(Hello);
//! assert_eq!(fs.live_nodes(), 1);
//! // fuse_session::serve(fs, "/mnt/hello", &Default::default())?;
//! ```

use crate::attr::{FileAttr, FileKind, Statfs};
use crate::backing::BackingFile;
use crate::context::RequestContext;
use crate::filesystem::Filesystem;
use crate::init::InitConfig;
use crate::inodes::{Forgotten, HandleTable, InodeTable, OpenModes, Restored, TableMirror};
use crate::journal::Replay;
use crate::kept_tree::{self, KeptOpen, KeptTree};
use crate::layers::core::{
    Answer, NotifierSlot, SizedXattr, check_name, hide_trusted, lock, on_open_file, open_builders,
};
use crate::layers::setid::{self, Change};
use crate::layers::values::{Created, Open};
use crate::notify::NotifyError;
use crate::ops::*;
use crate::reply::*;
use crate::types::{Entry, FileHandle, Inode, LockOwner};
use fuse_proto::Errno;

pub use crate::layers::core::MAX_COOKIE;
use fuse_proto::flags::{FopenFlags, InitFlags, OpenInFlags, WriteFlags};
use std::collections::HashMap;
use std::ffi::{CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

/// More names than this between a node and the root means the tree is
/// broken (a cycle): answered `EIO` and logged. (Deep trees are fine:
/// `PATH_MAX` only limits one system call's path, not the tree.)
const MAX_DEPTH: usize = 1 << 16;

/// How many read locks the tree lock is split into.
pub const TREE_SHARDS: usize = 16;

/// A filesystem addressed by paths ("/" is the root; no trailing slash).
///
/// Only [`PathFilesystem::getattr`] is required. Defaults: `EROFS` for
/// changes, `EINVAL` for `readlink`, `open`, `read` and `write`,
/// `ENOTDIR` for `readdir`. Methods run on worker threads and may block;
/// a method must not wait for another request of the same filesystem.
pub trait PathFilesystem: Send + Sync + 'static {
    /// What [`PathFilesystem::open`] returns and reads and writes go to.
    type File: Send + Sync + 'static;

    /// Called once with the kernel's INIT offer (see [`Filesystem::init`]).
    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        let _ = config;
        Ok(())
    }

    /// Attributes of `path`, or of the open `file` (`fstat`): at least one
    /// of the two is given; `path` is `None` for a file that lost its name.
    fn getattr(
        &self,
        ctx: &RequestContext<'_>,
        path: Option<&Path>,
        file: Option<&Self::File>,
    ) -> Result<FileAttr, Errno>;

    /// Changes attributes (`chmod`, `chown`, `truncate`, `utimensat`), by
    /// path or through an open file as for `getattr`; the new attributes.
    fn setattr(
        &self,
        ctx: &RequestContext<'_>,
        path: Option<&Path>,
        file: Option<&Self::File>,
        req: &SetattrRequest,
    ) -> Result<FileAttr, Errno> {
        let _ = (ctx, path, file, req);
        Err(Errno::EROFS)
    }

    /// The target of the symbolic link at `path`.
    fn readlink(&self, ctx: &RequestContext<'_>, path: &Path) -> Result<Vec<u8>, Errno> {
        let _ = (ctx, path);
        Err(Errno::EINVAL)
    }

    /// Creates a node (fifo, socket, device, regular file); its attributes.
    fn mknod(&self, ctx: &RequestContext<'_>, path: &Path, req: MknodRequest) -> Result<FileAttr, Errno> {
        let _ = (ctx, path, req);
        Err(Errno::EROFS)
    }

    /// Creates a directory (`mode`: permission bits, to create with
    /// exactly, see [`CreateRequest::mode`]); its attributes.
    fn mkdir(&self, ctx: &RequestContext<'_>, path: &Path, mode: u32) -> Result<FileAttr, Errno> {
        let _ = (ctx, path, mode);
        Err(Errno::EROFS)
    }

    /// Creates a symbolic link at `path` to `target`; its attributes.
    fn symlink(&self, ctx: &RequestContext<'_>, path: &Path, target: &CStr) -> Result<FileAttr, Errno> {
        let _ = (ctx, path, target);
        Err(Errno::EROFS)
    }

    /// Makes `to` a hard link of `from`; the attributes of the file. The
    /// default answers `EROFS`, as for every change (`link(2)` then fails
    /// with "Read-only file system").
    fn link(&self, ctx: &RequestContext<'_>, from: &Path, to: &Path) -> Result<FileAttr, Errno> {
        let _ = (ctx, from, to);
        Err(Errno::EROFS)
    }

    /// Removes a non-directory.
    fn unlink(&self, ctx: &RequestContext<'_>, path: &Path) -> Result<(), Errno> {
        let _ = (ctx, path);
        Err(Errno::EROFS)
    }

    /// Removes an empty directory.
    fn rmdir(&self, ctx: &RequestContext<'_>, path: &Path) -> Result<(), Errno> {
        let _ = (ctx, path);
        Err(Errno::EROFS)
    }

    /// Renames `from` to `to` (`renameat2` flags).
    fn rename(
        &self,
        ctx: &RequestContext<'_>,
        from: &Path,
        to: &Path,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let _ = (ctx, from, to, flags);
        Err(Errno::EROFS)
    }

    /// Opens the file at `path`.
    fn open(
        &self,
        ctx: &RequestContext<'_>,
        path: &Path,
        flags: OpenFlags,
    ) -> Result<PathOpened<Self::File>, Errno> {
        let _ = (ctx, path, flags);
        Err(Errno::EINVAL)
    }

    /// Creates (or, without `O_EXCL`, opens) the regular file at `path`;
    /// its attributes and the open file.
    fn create(
        &self,
        ctx: &RequestContext<'_>,
        path: &Path,
        req: CreateRequest,
    ) -> Result<(FileAttr, PathOpened<Self::File>), Errno> {
        let _ = (ctx, path, req);
        Err(Errno::EROFS)
    }

    /// READ from an open file: answer with `reply`.
    fn read(&self, ctx: &RequestContext<'_>, file: &Self::File, req: ReadRequest, reply: ReplyData) {
        let _ = (ctx, file, req);
        reply.error(Errno::EINVAL);
    }

    /// WRITE to an open file: the count written.
    fn write(
        &self,
        ctx: &RequestContext<'_>,
        file: &Self::File,
        req: WriteRequest<'_>,
    ) -> Result<u32, Errno> {
        let _ = (ctx, file, req);
        Err(Errno::EINVAL)
    }

    /// FLUSH (each `close(2)`): its error is what `close` returns. Sent
    /// only for files opened [`PathOpened::with_flush`] (and, with
    /// writeback caching, for every file); for the others the kernel skips
    /// the round trip. Several per open, the first possibly before any
    /// data (bash's `echo x > f`): commit only what was written since the
    /// last commit, as [`Filesystem::flush`] explains.
    fn flush(&self, ctx: &RequestContext<'_>, file: &Self::File, owner: LockOwner) -> Result<(), Errno> {
        let _ = (ctx, file, owner);
        Ok(())
    }

    /// FSYNC.
    fn fsync(&self, ctx: &RequestContext<'_>, file: &Self::File, datasync: bool) -> Result<(), Errno> {
        let _ = (ctx, file, datasync);
        Ok(())
    }

    /// FALLOCATE on an open file. `ENOSYS` (the default) makes the kernel
    /// answer later calls `EOPNOTSUPP` itself.
    fn fallocate(
        &self,
        ctx: &RequestContext<'_>,
        file: &Self::File,
        req: FallocateRequest,
    ) -> Result<(), Errno> {
        let _ = (ctx, file, req);
        Err(Errno::ENOSYS)
    }

    /// LSEEK with `SEEK_DATA` or `SEEK_HOLE` on an open file. `ENOSYS` (the
    /// default) makes the kernel answer such seeks itself (all data).
    fn lseek(&self, ctx: &RequestContext<'_>, file: &Self::File, req: LseekRequest) -> Result<u64, Errno> {
        let _ = (ctx, file, req);
        Err(Errno::ENOSYS)
    }

    /// COPY_FILE_RANGE from one open file to another: the count copied.
    /// `ENOSYS` (the default) makes the kernel copy through READ and WRITE.
    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        ctx: &RequestContext<'_>,
        from: &Self::File,
        off_in: u64,
        to: &Self::File,
        off_out: u64,
        len: u64,
    ) -> Result<u64, Errno> {
        let _ = (ctx, from, off_in, to, off_out, len);
        Err(Errno::ENOSYS)
    }

    /// RELEASE: the file is closed for good. (Should a request still be
    /// running with it, the file is dropped when that ends instead.) Not
    /// awaited by `close`, and possibly long after it: see
    /// [`Filesystem::release`].
    fn release(&self, ctx: &RequestContext<'_>, file: Self::File) {
        let _ = (ctx, file);
    }

    /// Lists the directory at `path` after cookie `offset` (0: from the
    /// start), adding entries with [`PathDirFill::add`] until it returns
    /// [`DirAdd::Full`]. `offset` is a cookie this method gave an entry
    /// (the entry to continue after), or 0. The library adds "." and ".."
    /// itself (cookies 1 and 2 on the wire) and shifts this method's
    /// cookies past them.
    fn readdir(
        &self,
        ctx: &RequestContext<'_>,
        path: &Path,
        offset: u64,
        out: &mut PathDirFill<'_>,
    ) -> Result<(), Errno> {
        let _ = (ctx, path, offset, out);
        Err(Errno::ENOTDIR)
    }

    /// The value of extended attribute `name` of `path` (`ENODATA` if it
    /// has none). `ENOSYS` (the default) makes the kernel answer every
    /// xattr call `EOPNOTSUPP` from then on. The library answers the size
    /// probe and `ERANGE`.
    fn getxattr(&self, ctx: &RequestContext<'_>, path: &Path, name: &CStr) -> Result<Vec<u8>, Errno> {
        let _ = (ctx, path, name);
        Err(Errno::ENOSYS)
    }

    /// The names of the extended attributes of `path`, each followed by a NUL.
    fn listxattr(&self, ctx: &RequestContext<'_>, path: &Path) -> Result<Vec<u8>, Errno> {
        let _ = (ctx, path);
        Err(Errno::ENOSYS)
    }

    /// Sets extended attribute `name` of `path` (`flags`: `XATTR_CREATE`,
    /// `XATTR_REPLACE` or 0).
    fn setxattr(
        &self,
        ctx: &RequestContext<'_>,
        path: &Path,
        name: &CStr,
        value: &[u8],
        flags: i32,
    ) -> Result<(), Errno> {
        let _ = (ctx, path, name, value, flags);
        Err(Errno::ENOSYS)
    }

    /// Removes extended attribute `name` of `path`.
    fn removexattr(&self, ctx: &RequestContext<'_>, path: &Path, name: &CStr) -> Result<(), Errno> {
        let _ = (ctx, path, name);
        Err(Errno::ENOSYS)
    }

    /// Filesystem statistics. The default: an empty filesystem with
    /// 255-byte names, [`Statfs::new`].
    fn statfs(&self, ctx: &RequestContext<'_>, path: &Path) -> Result<Statfs, Errno> {
        let _ = (ctx, path);
        Ok(Statfs::new())
    }
}

/// An open file and how the kernel should treat it.
pub struct PathOpened<F> {
    /// The file.
    pub file: F,
    /// `DIRECT_IO`, `KEEP_CACHE`, … (the session may add `DIRECT_IO |
    /// PARALLEL_DIRECT_WRITES` for an `O_DIRECT` open: see
    /// [`SessionConfig::o_direct_parallel_writes`](crate::SessionConfig::o_direct_parallel_writes))
    pub flags: FopenFlags,
    /// A passthrough backing file (see [`RequestContext::open_backing`];
    /// the kernel must have granted `PASSTHROUGH`, asked for in
    /// [`PathFilesystem::init`] with a `max_stack_depth`); kept until
    /// RELEASE.
    ///
    /// The kernel wants one backing file for all open files of an inode
    /// and no mix of passthrough and other opens, so the library decides
    /// per node: the first passthrough open's backing file serves every
    /// later open of the node while one is open (open it for reading and
    /// writing), and while the node has opens served by their `File`, a
    /// new one is served by its `File` too. A `File` must therefore be able
    /// to serve reads and writes itself.
    pub backing: Option<BackingFile>,
}

impl<F> PathOpened<F> {
    /// `file`, no backing file, flags `NOFLUSH` only: closing it sends no
    /// FLUSH (see [`PathOpened::with_flush`]).
    pub fn new(file: F) -> Self {
        PathOpened {
            file,
            flags: FopenFlags::NOFLUSH,
            backing: None,
        }
    }

    open_builders!();
}

/// A directory's children the kernel knows: name → (node id, generation).
type Children = HashMap<Box<[u8]>, (u64, u64)>;

/// A file or directory the kernel knows, with the names it has in the
/// tree (several for a hard-linked file, none once unlinked).
struct PNode {
    /// (parent node id, name) of each name.
    names: Mutex<Vec<(u64, Box<[u8]>)>>,
    /// Children the kernel knows: name → (node id, generation).
    children: Mutex<Children>,
    /// Open files of this node (for `fstat` of a file that lost its name).
    open: Mutex<Vec<u64>>,
    /// The attributes last reported (for `fstat` of a removed directory).
    last: Mutex<Option<FileAttr>>,
    /// How its open files do I/O.
    io: Mutex<OpenModes>,
}

impl PNode {
    fn new(names: Vec<(u64, Box<[u8]>)>) -> Arc<PNode> {
        Arc::new(PNode {
            names: Mutex::new(names),
            children: Mutex::default(),
            open: Mutex::default(),
            last: Mutex::default(),
            io: Mutex::default(),
        })
    }

    /// Renames `(parent, name)` to `to` (`None`: removes it).
    fn rename(&self, parent: u64, name: &[u8], to: Option<(u64, &[u8])>) {
        let mut names = lock(&self.names);
        names.retain(|(p, n)| !(*p == parent && &**n == name));
        if let Some((p, n)) = to {
            names.push((p, n.into()));
        }
    }
}

struct OpenEntry<F> {
    node: Arc<PNode>,
    file: F,
    passthrough: bool,
    /// Its record in the kept tree (`usize::MAX`: none).
    record: AtomicUsize,
}

/// The tree lock: [`TREE_SHARDS`] read-write locks, a thread reads one,
/// renames write all (see the module documentation).
struct TreeLock {
    shards: Box<[RwLock<()>]>,
}

impl TreeLock {
    fn read(&self) -> RwLockReadGuard<'_, ()> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % TREE_SHARDS;
        }
        let i = MINE.with(|m| *m);
        self.shards[i].read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> Vec<RwLockWriteGuard<'_, ()>> {
        self.shards
            .iter()
            .map(|s| s.write().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }
}

struct Shared<F: PathFilesystem> {
    fs: F,
    table: Arc<InodeTable<u64, Arc<PNode>>>,
    notifier: Arc<NotifierSlot>,
    files: HandleTable<Arc<OpenEntry<F::File>>>,
    tree: TreeLock,
    /// Where the keeper holds the table and open files ([`PathFs::kept`]).
    kept: Option<Arc<KeptTree>>,
    /// Open files a predecessor recorded, opened again at their first use.
    pending: Mutex<HashMap<u64, KeptOpen>>,
    /// Whether `pending` may hold any (read on every request with a file
    /// handle: no lock unless a predecessor left open files).
    any_pending: AtomicBool,
}

/// Serves a [`PathFilesystem`] as a [`Filesystem`]; see the
/// [module documentation](self). A clone shares everything.
pub struct PathFs<F: PathFilesystem> {
    shared: Arc<Shared<F>>,
    ttl: Duration,
}

impl<F: PathFilesystem> Clone for PathFs<F> {
    fn clone(&self) -> Self {
        PathFs {
            shared: self.shared.clone(),
            ttl: self.ttl,
        }
    }
}

/// Where [`PathFilesystem::readdir`] puts a directory's entries.
///
/// Each entry carries the inode number `readdir(3)` shows (`d_ino`), which
/// must be the `st_ino` that `stat` gives the same name. [`add`](Self::add)
/// finds it with no code of the filesystem's: the node's if the kernel
/// knows the name, otherwise the [`FileAttr::ino`] the filesystem's
/// [`getattr`](PathFilesystem::getattr) reports for the path (one call per
/// such name). A filesystem that has the numbers at hand (a mirror reading
/// its source's `d_ino`) gives them with [`add_with_ino`](Self::add_with_ino)
/// and saves those calls.
///
/// Cookies (`next`) are the filesystem's, from 1 to [`MAX_COOKIE`]; the
/// kernel passes one back as `offset` to continue after its entry. An entry
/// with a cookie out of that range is left out (logged,
/// [`DirAdd::Skipped`]) rather than sent with a cookie another entry has.
pub struct PathDirFill<'r> {
    reply: &'r mut ReplyDirectory,
    full: bool,
    ino_of: &'r mut dyn FnMut(&[u8]) -> u64,
}

/// The `d_ino` sent for a name whose `st_ino` is not known yet: one the
/// kernel has not looked up, of a filesystem that reports no
/// [`FileAttr::ino`] (its `st_ino` is the node id a LOOKUP will give it).
pub const UNKNOWN_INO: u64 = 0xffff_ffff;

impl PathDirFill<'_> {
    /// Adds `name` of `kind` with cookie `next`: the `offset` the kernel
    /// passes back to continue the listing after this entry (1 to
    /// [`MAX_COOKIE`]). Its `d_ino` is found as the [type's
    /// documentation](Self) says. Says what it did, as
    /// [`ReplyDirectory::add`] does:
    /// [`DirAdd::Full`] means the entry is not in the reply and none after
    /// it will be (stop; the kernel asks again from the last entry it
    /// got), [`DirAdd::Skipped`] a name the kernel would reject or a cookie
    /// out of range (logged, left out), [`DirAdd::Added`] an entry sent.
    pub fn add(&mut self, name: &[u8], kind: FileKind, next: u64) -> DirAdd {
        if self.full {
            return DirAdd::Full;
        }
        let ino = (self.ino_of)(name);
        self.add_with_ino(name, kind, next, ino)
    }

    /// [`add`](Self::add) with the entry's inode number given: `ino` must
    /// be the [`FileAttr::ino`] the filesystem's `getattr` reports for it.
    pub fn add_with_ino(&mut self, name: &[u8], kind: FileKind, next: u64, ino: u64) -> DirAdd {
        if self.full {
            return DirAdd::Full;
        }
        let Some(next) = crate::layers::core::wire_cookie(next, name) else {
            return DirAdd::Skipped;
        };
        let added = self.reply.add(Inode(ino), next, kind, name);
        self.full = added.is_full();
        added
    }
}

impl<F: PathFilesystem> PathFs<F> {
    /// Serves `fs`; names and attributes may be cached for 1 s.
    pub fn new(fs: F) -> Self {
        Self::with_ttl(fs, Duration::from_secs(1))
    }

    /// Serves `fs`; names and attributes may be cached for `ttl`.
    pub fn with_ttl(fs: F, ttl: Duration) -> Self {
        Self::build(
            fs,
            ttl,
            InodeTable::new(PNode::new(Vec::new())),
            HandleTable::new(),
            None,
            HashMap::new(),
        )
    }

    fn build(
        fs: F,
        ttl: Duration,
        table: InodeTable<u64, Arc<PNode>>,
        files: HandleTable<Arc<OpenEntry<F::File>>>,
        kept: Option<Arc<KeptTree>>,
        pending: HashMap<u64, KeptOpen>,
    ) -> Self {
        PathFs {
            shared: Arc::new(Shared {
                fs,
                table: Arc::new(table),
                notifier: Arc::default(),
                files,
                tree: TreeLock {
                    shards: (0..TREE_SHARDS).map(|_| RwLock::new(())).collect(),
                },
                kept,
                any_pending: AtomicBool::new(!pending.is_empty()),
                pending: Mutex::new(pending),
            }),
            ttl,
        }
    }

    /// Serves `fs` under a keeper ([`crate::keeper::KeeperLink::serve`]'s
    /// `restore`, or the fd store's), with its node table and open files
    /// kept where the keeper holds them ([`crate::kept_tree`]): after a
    /// crash or an upgrade every node id the kernel holds names the same
    /// path again, and every open file is opened again through
    /// [`PathFilesystem::open`] (without `O_TRUNC`, `O_CREAT`, `O_EXCL`) at
    /// its first use, under the file handle the kernel holds. The layer
    /// then states [`crate::Recovery::Durable`]. A kept table that is
    /// blank, of another layout or of another connection is refused
    /// ([`crate::kept_tree::NotRecoverable`]: the keeper ends the mount).
    /// Names and attributes may be cached for `ttl`.
    pub fn kept(fs: F, ttl: Duration, restore: &crate::keeper::Restore<'_>) -> std::io::Result<Self> {
        Self::kept_sized(
            fs,
            ttl,
            restore,
            kept_tree::DEFAULT_NODES,
            kept_tree::DEFAULT_OPENS,
        )
    }

    /// [`PathFs::kept`] with room for `nodes` node ids and `opens` open
    /// files in the kept tree (a node beyond them answers `ESTALE` after a
    /// crash, an open file `EBADF`). Every daemon of a mount must use the
    /// same figures.
    pub fn kept_sized(
        fs: F,
        ttl: Duration,
        restore: &crate::keeper::Restore<'_>,
        nodes: usize,
        opens: usize,
    ) -> std::io::Result<Self> {
        let fresh = restore.state.is_none();
        let region = restore
            .vault
            .region(kept_tree::REGION_KEY, KeptTree::bytes_needed(nodes, opens))
            .map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    kept_tree::NotRecoverable(format!("the kept node table cannot be mapped: {e}")),
                )
            })?;
        let tree = Arc::new(KeptTree::open(region, fresh, restore.connection, nodes, opens)?);
        let mirror: Arc<dyn TableMirror<u64>> = tree.clone();
        if fresh {
            let table = InodeTable::with_mirror(PNode::new(Vec::new()), mirror);
            return Ok(Self::build(
                fs,
                ttl,
                table,
                HandleTable::new(),
                Some(tree),
                HashMap::new(),
            ));
        }
        let k = tree.load();
        let root = PNode::new(Vec::new());
        let nodes: HashMap<u64, Arc<PNode>> = k
            .nodes
            .iter()
            .map(|n| {
                let names = n.name.iter().map(|(p, nm)| (*p, nm.clone().into_boxed_slice()));
                (n.ino, PNode::new(names.collect()))
            })
            .collect();
        for n in &k.nodes {
            let Some((parent, name)) = &n.name else { continue };
            let dir = if *parent == Inode::ROOT.0 {
                Some(&root)
            } else {
                nodes.get(parent)
            };
            if let Some(dir) = dir {
                lock(&dir.children).insert(name.clone().into_boxed_slice(), (n.ino, n.generation));
            }
        }
        let pending: HashMap<u64, KeptOpen> = k
            .opens
            .iter()
            .filter(|o| {
                let known = nodes.contains_key(&o.ino);
                if !known {
                    tree.closed(o.slot);
                }
                known
            })
            .map(|o| (o.fh, *o))
            .collect();
        let live = k
            .nodes
            .iter()
            .filter_map(|n| {
                Some(Restored {
                    ino: n.ino,
                    generation: n.generation,
                    lookups: n.lookups,
                    key: n.key,
                    value: nodes.get(&n.ino)?.clone(),
                })
            })
            .collect();
        log::info!(
            "path layer: took over {} nodes and {} open files from the kept table (epoch {})",
            k.nodes.len(),
            pending.len(),
            tree.epoch()
        );
        let table = InodeTable::rebuild(root, mirror, live, k.free, &k.fresh);
        let files = HandleTable::rebuild(&k.handles, Vec::new());
        Ok(Self::build(fs, ttl, table, files, Some(tree), pending))
    }

    /// Writes node `ino`'s newest name to the kept tree (under the node's
    /// shard lock, so a number reused meanwhile is never written over).
    /// One name a node: a hard-linked file keeps the one made last (the
    /// one a client most likely goes on using after removing the old).
    fn keep_name(&self, ino: u64, generation: u64, node: &PNode) {
        if let Some(t) = &self.shared.kept {
            let names = lock(&node.names);
            let first = names.last().map(|(p, n)| (*p, &**n));
            self.shared
                .table
                .with_node(Inode(ino), generation, || t.set_name(ino, first));
        }
    }

    /// Opens again, under the number the kernel holds, a file a
    /// predecessor recorded (at its first use). Costs one atomic load
    /// when nothing is pending.
    fn revive(&self, ctx: &RequestContext<'_>, fh: FileHandle) {
        if !self.shared.any_pending.load(Ordering::Acquire) || self.shared.files.get(fh.0).is_some() {
            return;
        }
        let mut pending = lock(&self.shared.pending);
        let Some(rec) = pending.remove(&fh.0) else { return };
        if pending.is_empty() {
            self.shared.any_pending.store(false, Ordering::Release);
        }
        let _tree = self.shared.tree.read();
        let flags = OpenFlags::from_bits(rec.flags & !(libc::O_TRUNC | libc::O_CREAT | libc::O_EXCL));
        let r = self.node(Inode(rec.ino)).and_then(|node| {
            let opened = self.shared.fs.open(ctx, &self.path(Inode(rec.ino))?, flags)?;
            Ok((node, opened))
        });
        match r {
            Ok((node, opened)) => {
                let (_, backing) = crate::layers::core::attach_open(&node.io, opened.flags, opened.backing);
                self.shared.files.insert_at(
                    fh.0,
                    Arc::new(OpenEntry {
                        node: node.clone(),
                        file: opened.file,
                        passthrough: backing.is_some(),
                        record: AtomicUsize::new(rec.slot),
                    }),
                );
                lock(&node.open).push(fh.0);
            }
            Err(e) => {
                log::warn!(
                    "file handle {fh} of node {} could not be opened again ({e}): EBADF",
                    rec.ino
                );
                if let Some(t) = &self.shared.kept {
                    t.closed(rec.slot);
                }
            }
        }
    }

    /// A handle for invalidating the kernel's caches of paths; it may be
    /// kept by the filesystem itself (it holds no reference to it).
    pub fn invalidator(&self) -> PathInvalidator {
        PathInvalidator {
            table: self.shared.table.clone(),
            notifier: self.shared.notifier.clone(),
        }
    }

    fn remember_notifier(&self, ctx: &RequestContext<'_>) {
        self.shared.notifier.remember(ctx)
    }

    /// The filesystem.
    pub fn inner(&self) -> &F {
        &self.shared.fs
    }

    /// Node ids the kernel holds, the root included.
    pub fn live_nodes(&self) -> usize {
        self.shared.table.len()
    }

    /// Files open now.
    pub fn open_files(&self) -> usize {
        self.shared.files.len()
    }

    /// Every node id the kernel holds with its lookup count (for tests).
    pub fn lookup_counts(&self) -> Vec<(Inode, u64)> {
        self.shared.table.counts()
    }

    /// The current path of node id `ino` (`None`: unknown or without a
    /// name). Takes a tree read lock: do not call it from inside a
    /// [`PathFilesystem`] method (the method's request holds one already,
    /// and a rename waiting in between would deadlock the two).
    pub fn path_of(&self, ino: Inode) -> Option<PathBuf> {
        let _tree = self.shared.tree.read();
        self.path(ino).ok()
    }

    fn node(&self, ino: Inode) -> Result<Arc<PNode>, Errno> {
        crate::layers::core::held(&self.shared.table, ino)
    }

    /// The path of `ino` (call with a tree lock held). `ENOENT` for a node
    /// that lost its name.
    fn path(&self, ino: Inode) -> Result<PathBuf, Errno> {
        let mut names: Vec<Box<[u8]>> = Vec::new();
        let mut at = ino;
        while at != Inode::ROOT {
            let node = self.node(at)?;
            let (parent, name) = lock(&node.names).first().cloned().ok_or(Errno::ENOENT)?;
            names.push(name);
            at = Inode(parent);
            if names.len() > MAX_DEPTH {
                log::error!("the path of node {ino} does not reach the root");
                return Err(Errno::EIO);
            }
        }
        let mut p = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum::<usize>() + 1);
        for n in names.iter().rev() {
            p.push(b'/');
            p.extend_from_slice(n);
        }
        if p.is_empty() {
            p.push(b'/');
        }
        Ok(PathBuf::from(OsStr::from_bytes(&p)))
    }

    fn child_path(&self, parent: Inode, name: &CStr) -> Result<PathBuf, Errno> {
        check_name(name)?;
        let mut p = self.path(parent)?;
        p.push(OsStr::from_bytes(name.to_bytes()));
        Ok(p)
    }

    /// The entry for `name` in `parent` with attributes `attr`, one lookup
    /// reference taken (call with a tree lock held, before replying).
    fn enter(&self, parent: Inode, name: &[u8], mut attr: FileAttr) -> Result<Entry, Errno> {
        let dir = self.node(parent)?;
        let mut stale = None;
        let (ino, generation) = {
            let mut children = lock(&dir.children);
            let known = children.get(name).copied().and_then(|(ino, generation)| {
                match self.shared.table.acquire_ino(Inode(ino)) {
                    Some((_, g)) if g == generation => Some((Inode(ino), g)),
                    Some(_) => {
                        // The number was reused for another node: not this name.
                        stale = Some(Inode(ino));
                        None
                    }
                    None => None,
                }
            });
            known.unwrap_or_else(|| {
                let here = || vec![(parent.0, Box::<[u8]>::from(name))];
                let (ino, generation) = if attr.kind != FileKind::Directory && attr.nlink > 1 && attr.ino != 0
                {
                    // A hard-linked file: one node for all its names, found
                    // by the inode number the filesystem reports.
                    let (ino, generation) = self.shared.table.acquire(attr.ino, || PNode::new(Vec::new()));
                    if let Some(node) = self.shared.table.get(ino) {
                        node.rename(parent.0, name, Some((parent.0, name)));
                        self.keep_name(ino.0, generation, &node);
                    }
                    (ino, generation)
                } else {
                    let node = PNode::new(here());
                    let (ino, generation) = self.shared.table.insert(node.clone());
                    self.keep_name(ino.0, generation, &node);
                    (ino, generation)
                };
                children.insert(name.into(), (ino.0, generation));
                (ino, generation)
            })
        };
        if let Some(other) = stale {
            self.forget_one(other, 1);
        }
        if attr.ino == 0 {
            attr.ino = ino.0;
        }
        self.remember(ino, &attr);
        Ok(Entry {
            ino,
            generation,
            attr,
            entry_ttl: self.ttl,
            attr_ttl: self.ttl,
        })
    }

    /// The `st_ino` of node `ino` as last reported (its node id when the
    /// filesystem reports none).
    fn st_ino(&self, ino: Inode) -> u64 {
        self.shared
            .table
            .get(ino)
            .and_then(|n| *lock(&n.last))
            .map(|a| a.ino)
            .filter(|&i| i != 0)
            .unwrap_or(ino.0)
    }

    /// Gives `ctx` the last attributes of `ino`, the node the kernel
    /// checked a by-name request against ([`RequestContext::node_attr`]).
    fn show_node(&self, ctx: &RequestContext<'_>, ino: Inode) {
        ctx.set_node_attr(self.shared.table.get(ino).and_then(|n| *lock(&n.last)));
    }

    /// Keeps `attr` as the last attributes of `ino`.
    fn remember(&self, ino: Inode, attr: &FileAttr) {
        if let Some(node) = self.shared.table.get(ino) {
            *lock(&node.last) = Some(*attr);
        }
    }

    /// Gives back `n` references of `ino`; a node dropped leaves its
    /// parent's children.
    fn forget_one(&self, ino: Inode, n: u64) {
        let Forgotten::Dropped(node) = self.shared.table.forget(ino, n) else {
            return;
        };
        let names = std::mem::take(&mut *lock(&node.names));
        for (parent, name) in names {
            if let Some(dir) = self.shared.table.get(Inode(parent)) {
                let mut children = lock(&dir.children);
                if children.get(&name).is_some_and(|&(i, _)| i == ino.0) {
                    children.remove(&name);
                }
            }
        }
    }

    /// The node of a child entry, if its number still names it.
    fn live(&self, (ino, generation): (u64, u64)) -> Option<Arc<PNode>> {
        let node = self.shared.table.get(Inode(ino))?;
        (self.shared.table.generation(Inode(ino)) == Some(generation)).then_some(node)
    }

    /// Takes `name` out of `parent`'s children and marks its node unnamed.
    fn unname(&self, parent: Inode, name: &[u8]) {
        let Some(dir) = self.shared.table.get(parent) else {
            return;
        };
        let child = lock(&dir.children).remove(name);
        if let Some((c, node)) = child.and_then(|c| Some((c, self.live(c)?))) {
            node.rename(parent.0, name, None);
            self.keep_name(c.0, c.1, &node);
        }
    }

    fn fix_attr(&self, ino: Inode, mut attr: FileAttr) -> (Duration, FileAttr) {
        if attr.ino == 0 {
            attr.ino = ino.0;
        }
        self.remember(ino, &attr);
        (self.ttl, attr)
    }

    /// Clears the set-ID bits `change` drops from the open `file` (handle
    /// `fh`), through the filesystem's getattr and setattr of the file (no
    /// path: READ, WRITE and the like build none); whether it changed the
    /// mode.
    fn clear_setid(
        &self,
        ctx: &RequestContext<'_>,
        change: Change,
        fh: FileHandle,
        file: &F::File,
    ) -> Result<bool, Errno> {
        let fs = &self.shared.fs;
        let cleared = setid::clear(
            ctx,
            change,
            Some(fh),
            || fs.getattr(ctx, None, Some(file)),
            |r| fs.setattr(ctx, None, Some(file), r),
        )?;
        Ok(cleared.is_some())
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<OpenEntry<F::File>>, Errno> {
        crate::layers::core::open_file(&self.shared.files, fh)
    }

    fn store(
        &self,
        ino: Inode,
        open_flags: OpenFlags,
        node: Arc<PNode>,
        opened: PathOpened<F::File>,
    ) -> Open {
        let (flags, backing) = crate::layers::core::attach_open(&node.io, opened.flags, opened.backing);
        let n = node.clone();
        let entry = Arc::new(OpenEntry {
            node,
            file: opened.file,
            passthrough: backing.is_some(),
            record: AtomicUsize::new(usize::MAX),
        });
        let fh = self.shared.files.insert(entry.clone());
        if let Some(t) = &self.shared.kept {
            t.handle_given(fh);
            if let Some(slot) = t.opened(fh, ino.0, open_flags.bits()) {
                entry.record.store(slot, Ordering::Release);
            }
        }
        lock(&n.open).push(fh);
        Open {
            fh: FileHandle(fh),
            flags,
            backing,
        }
    }

    /// The file to go with a request on `ino`: the one given, or (for a
    /// node without a name) any open file of it.
    fn file_for(&self, ino: Inode, fh: Option<FileHandle>, named: bool) -> Option<Arc<OpenEntry<F::File>>> {
        if let Some(fh) = fh {
            return self.shared.files.get(fh.0);
        }
        if named {
            return None;
        }
        let node = self.shared.table.get(ino)?;
        let first = lock(&node.open).first().copied();
        first.and_then(|fh| self.shared.files.get(fh))
    }

    fn new_entry(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        reply: ReplyEntry,
        make: impl FnOnce(&Path) -> Result<FileAttr, Errno>,
    ) {
        let _tree = self.shared.tree.read();
        let r = self
            .child_path(parent, name)
            .and_then(|p| self.made_already(ctx, &p).map_or_else(|| make(&p), Ok))
            .and_then(|attr| self.enter(parent, name.to_bytes(), attr));
        reply.result(r)
    }

    /// For a request resent after a crash ([`Replay::MaybeDone`]) that makes
    /// `path`: its attributes if it exists (the dead daemon made it: the
    /// kernel holds the directory's lock through the request, so nothing
    /// else did).
    fn made_already(&self, ctx: &RequestContext<'_>, path: &Path) -> Option<FileAttr> {
        (ctx.replay() == Replay::MaybeDone)
            .then(|| self.shared.fs.getattr(ctx, Some(path), None).ok())
            .flatten()
    }

    /// For an appending write under a keeper: whether a predecessor wrote
    /// its `len` bytes already (it died before answering). A first try
    /// notes the file's size in the journal; a resent one finds them done
    /// when the file has grown past that by `len` (the kernel writes one
    /// append to a file at a time, so no other write grew it). Without the
    /// size (a filesystem whose `getattr` cannot answer by open file) the
    /// write is carried out again.
    fn appended_already(&self, ctx: &RequestContext<'_>, file: &F::File, len: u64) -> bool {
        let size = || self.shared.fs.getattr(ctx, None, Some(file)).map(|a| a.size);
        match (ctx.replay(), ctx.journal_note()) {
            (Replay::MaybeDone, Some(at)) => size().is_ok_and(|now| now >= at.saturating_add(len)),
            _ => {
                if let Ok(at) = size() {
                    ctx.set_journal_note(at);
                }
                false
            }
        }
    }

    /// For a request resent after a crash that removes `path`: whether it
    /// is gone already.
    fn removed_already(&self, ctx: &RequestContext<'_>, path: &Path) -> bool {
        ctx.replay() == Replay::MaybeDone
            && self.shared.fs.getattr(ctx, Some(path), None) == Err(Errno::ENOENT)
    }
}

impl<F: PathFilesystem> Filesystem for PathFs<F> {
    fn recovery(&self) -> crate::Recovery {
        match self.shared.kept {
            Some(_) => crate::Recovery::Durable,
            None => crate::Recovery::Unsupported(
                "this path layer keeps its node table (node ids to paths) and open files in this process \
                 only: a successor would give the node ids the kernel holds to other files (build it with \
                 PathFs::kept to run under a keeper)",
            ),
        }
    }

    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        self.shared.fs.init(config)?;
        // The layer clears set-ID bits itself (`setid`).
        setid::want(config);
        if config.wanted.contains(InitFlags::DO_READDIRPLUS) {
            // Listings here carry names only.
            log::warn!("the path layer serves READDIR, not READDIRPLUS; not asking for DO_READDIRPLUS");
            config
                .wanted
                .remove(InitFlags::DO_READDIRPLUS | InitFlags::READDIRPLUS_AUTO);
        }
        Ok(())
    }

    fn lookup(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        self.remember_notifier(ctx);
        self.new_entry(ctx, parent, name, reply, |p| {
            self.shared.fs.getattr(ctx, Some(p), None)
        })
    }

    fn forget(&self, _: &RequestContext<'_>, ino: Inode, nlookup: u64) {
        let _tree = self.shared.tree.read();
        self.forget_one(ino, nlookup)
    }

    fn batch_forget(&self, _: &RequestContext<'_>, nodes: &mut dyn Iterator<Item = (Inode, u64)>) {
        let _tree = self.shared.tree.read();
        for (ino, n) in nodes {
            self.forget_one(ino, n)
        }
    }

    fn getattr(&self, ctx: &RequestContext<'_>, ino: Inode, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.remember_notifier(ctx);
        if let Some(fh) = fh {
            self.revive(ctx, fh);
        }
        let _tree = self.shared.tree.read();
        let path = self.path(ino);
        let file = self.file_for(ino, fh, path.is_ok());
        let r = match (&path, &file) {
            // Removed and not open as a file (an open directory, say): what
            // it was, without links.
            (Err(Errno::ENOENT), None) => self
                .shared
                .table
                .get(ino)
                .and_then(|n| *lock(&n.last))
                .map(|a| FileAttr { nlink: 0, ..a })
                .ok_or(Errno::ENOENT),
            (Err(e), None) => Err(*e),
            _ => self
                .shared
                .fs
                .getattr(ctx, path.as_deref().ok(), file.as_deref().map(|f| &f.file)),
        };
        reply.result(r.map(|a| self.fix_attr(ino, a)))
    }

    fn setattr(&self, ctx: &RequestContext<'_>, ino: Inode, req: &SetattrRequest, reply: ReplyAttr) {
        if let Some(fh) = req.fh {
            self.revive(ctx, fh);
        }
        let _tree = self.shared.tree.read();
        let path = self.path(ino);
        let file = self.file_for(ino, req.fh, path.is_ok());
        self.show_node(ctx, ino);
        let r = match (&path, &file) {
            (Err(e), None) => Err(*e),
            _ => {
                let (fs, path, file) = (
                    &self.shared.fs,
                    path.as_deref().ok(),
                    file.as_deref().map(|f| &f.file),
                );
                setid::setattr(
                    ctx,
                    req,
                    || fs.getattr(ctx, path, file),
                    |r| fs.setattr(ctx, path, file, r),
                )
            }
        };
        reply.result(r.map(|a| self.fix_attr(ino, a)))
    }

    fn readlink(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyData) {
        let _tree = self.shared.tree.read();
        reply.result(self.path(ino).and_then(|p| self.shared.fs.readlink(ctx, &p)))
    }

    fn symlink(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        target: &CStr,
        reply: ReplyEntry,
    ) {
        self.new_entry(ctx, parent, name, reply, |p| {
            self.shared.fs.symlink(ctx, p, target)
        })
    }

    fn mknod(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: MknodRequest,
        reply: ReplyEntry,
    ) {
        self.new_entry(ctx, parent, name, reply, |p| self.shared.fs.mknod(ctx, p, req))
    }

    fn mkdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, mode: u32, reply: ReplyEntry) {
        self.new_entry(ctx, parent, name, reply, |p| self.shared.fs.mkdir(ctx, p, mode))
    }

    fn unlink(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        let _tree = self.shared.tree.read();
        let r = self
            .child_path(parent, name)
            .and_then(|p| match self.removed_already(ctx, &p) {
                true => Ok(()),
                false => self.shared.fs.unlink(ctx, &p),
            });
        if r.is_ok() {
            self.unname(parent, name.to_bytes());
        }
        reply.result(r)
    }

    fn rmdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        let _tree = self.shared.tree.read();
        let r = self
            .child_path(parent, name)
            .and_then(|p| match self.removed_already(ctx, &p) {
                true => Ok(()),
                false => self.shared.fs.rmdir(ctx, &p),
            });
        if r.is_ok() {
            self.unname(parent, name.to_bytes());
        }
        reply.result(r)
    }

    fn rename(&self, ctx: &RequestContext<'_>, req: &RenameRequest<'_>, reply: ReplyEmpty) {
        let _tree = self.shared.tree.write();
        let mut from = None;
        let r = (|| {
            let from = from.insert(self.child_path(req.parent, req.name)?);
            let to = self.child_path(req.newparent, req.newname)?;
            // Resent after a crash: done if the source is gone and the
            // target is there (the kernel holds both directories' locks).
            // An exchange leaves both names: carried out again, it would
            // swap back, so it is checked by nothing and not covered.
            if !req.flags.contains(RenameFlags::EXCHANGE)
                && self.removed_already(ctx, from)
                && self.shared.fs.getattr(ctx, Some(&to), None).is_ok()
            {
                return Ok(());
            }
            self.shared.fs.rename(ctx, from, &to, req.flags)
        })();
        // A source name the tree does not hold: the predecessor moved the
        // names already (it died after that, before answering), or the
        // name is a hard link's the kept tree did not keep. Either way the
        // target is not replaced when the source name still exists or is a
        // resent request's (renaming one link of a file onto another does
        // nothing): its node keeps its names.
        let moved_already = |ctx: &RequestContext<'_>| {
            ctx.replay() == Replay::MaybeDone
                || from
                    .as_ref()
                    .is_some_and(|f| self.shared.fs.getattr(ctx, Some(f), None).is_ok())
        };
        if r.is_ok()
            && !req.flags.contains(RenameFlags::EXCHANGE)
            && self
                .shared
                .table
                .get(req.parent)
                .is_some_and(|d| !lock(&d.children).contains_key(req.name.to_bytes()))
            && moved_already(ctx)
        {
            return reply.result(r);
        }
        if r.is_ok() {
            // Alone in the tree now: move the names.
            let (p, q) = (req.parent, req.newparent);
            let (name, newname) = (req.name.to_bytes(), req.newname.to_bytes());
            let take = |dir: Inode, n: &[u8]| {
                let d = self.shared.table.get(dir)?;
                lock(&d.children).remove(n)
            };
            let put = |dir: Inode, n: &[u8], child: (u64, u64), from: (Inode, &[u8])| {
                if let (Some(d), Some(node)) = (self.shared.table.get(dir), self.live(child)) {
                    node.rename(from.0.0, from.1, Some((dir.0, n)));
                    self.keep_name(child.0, child.1, &node);
                    lock(&d.children).insert(n.into(), child);
                }
            };
            let src = take(p, name);
            let dst = take(q, newname);
            match (src, dst) {
                // Two names of one file: rename did nothing.
                (Some(s), Some(d)) if s == d => {
                    put(p, name, s, (p, name));
                    put(q, newname, d, (q, newname));
                }
                (src, dst) => {
                    if req.flags.contains(RenameFlags::EXCHANGE) {
                        if let Some(d) = dst {
                            put(p, name, d, (q, newname));
                        }
                    } else if let Some((d, node)) = dst.and_then(|d| Some((d, self.live(d)?))) {
                        node.rename(q.0, newname, None);
                        self.keep_name(d.0, d.1, &node);
                    }
                    if let Some(s) = src {
                        put(q, newname, s, (p, name));
                    }
                }
            }
        }
        reply.result(r)
    }

    fn link(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        newparent: Inode,
        newname: &CStr,
        reply: ReplyEntry,
    ) {
        let _tree = self.shared.tree.read();
        let r = (|| {
            let from = self.path(ino)?;
            let to = self.child_path(newparent, newname)?;
            self.show_node(ctx, ino);
            let mut attr = match self.made_already(ctx, &to) {
                Some(a) => a,
                None => self.shared.fs.link(ctx, &from, &to)?,
            };
            // The new name leads to the same node (the kernel's inode, with
            // its cached pages and link count).
            let dir = self.node(newparent)?;
            let mut children = lock(&dir.children);
            let (node, generation) = self.shared.table.acquire_ino(ino).ok_or(Errno::ESTALE)?;
            let newname = newname.to_bytes();
            node.rename(newparent.0, newname, Some((newparent.0, newname)));
            self.keep_name(ino.0, generation, &node);
            children.insert(newname.into(), (ino.0, generation));
            drop(children);
            if attr.ino == 0 {
                attr.ino = ino.0;
            }
            self.remember(ino, &attr);
            Ok::<_, Errno>(Entry {
                ino,
                generation,
                attr,
                entry_ttl: self.ttl,
                attr_ttl: self.ttl,
            })
        })();
        reply.result(r)
    }

    fn open(&self, ctx: &RequestContext<'_>, ino: Inode, flags: OpenFlags, reply: ReplyOpen) {
        self.remember_notifier(ctx);
        let _tree = self.shared.tree.read();
        let r = (|| {
            let node = self.node(ino)?;
            let path = self.path(ino)?;
            let fs = &self.shared.fs;
            let opened = fs.open(ctx, &path, flags)?;
            if flags.bits() & libc::O_TRUNC != 0 && ctx.open_in_flags().contains(OpenInFlags::KILL_SUIDGID) {
                let (path, file) = (Some(path.as_path()), Some(&opened.file));
                let cleared = setid::clear(
                    ctx,
                    Change::Written,
                    None,
                    || fs.getattr(ctx, path, file),
                    |r| fs.setattr(ctx, path, file, r),
                );
                if let Err(e) = cleared {
                    fs.release(ctx, opened.file);
                    return Err(e);
                }
            }
            Ok::<_, Errno>(self.store(ino, flags, node, opened))
        })();
        reply.answer(r)
    }

    fn create(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: CreateRequest,
        reply: ReplyCreate,
    ) {
        let _tree = self.shared.tree.read();
        let r = (|| {
            let path = self.child_path(parent, name)?;
            let (attr, opened) = match ctx.replay() {
                // Resent after a crash: a file the dead daemon made is
                // opened as it is (the kernel holds the directory's lock,
                // so the name is the one the request made).
                Replay::MaybeDone if self.shared.fs.getattr(ctx, Some(&path), None).is_ok() => {
                    let flags = OpenFlags::from_bits(
                        req.flags.bits() & !(libc::O_EXCL | libc::O_TRUNC | libc::O_CREAT),
                    );
                    let opened = self.shared.fs.open(ctx, &path, flags)?;
                    (
                        self.shared.fs.getattr(ctx, Some(&path), Some(&opened.file))?,
                        opened,
                    )
                }
                _ => self.shared.fs.create(ctx, &path, req)?,
            };
            let entry = self.enter(parent, name.to_bytes(), attr)?;
            let node = self.node(entry.ino)?;
            Ok::<_, Errno>((entry, self.store(entry.ino, req.flags, node, opened)))
        })();
        reply.answer(r.map(|(entry, open)| Created::new(entry, open)))
    }

    fn read(&self, ctx: &RequestContext<'_>, _: Inode, fh: FileHandle, req: ReadRequest, reply: ReplyData) {
        self.revive(ctx, fh);
        match self.file(fh) {
            Ok(f) => self.shared.fs.read(ctx, &f.file, req, reply),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        ctx: &RequestContext<'_>,
        _: Inode,
        fh: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        self.revive(ctx, fh);
        on_open_file(&self.shared.files, fh, reply, |f| {
            if req.write_flags.contains(WriteFlags::KILL_SUIDGID) {
                self.clear_setid(ctx, Change::Written, fh, &f.file)?;
            }
            if self.shared.kept.is_some()
                && req.flags.bits() & libc::O_APPEND != 0
                && self.appended_already(ctx, &f.file, req.data.len() as u64)
            {
                return Ok(req.data.len() as u32);
            }
            self.shared.fs.write(ctx, &f.file, req)
        })
    }

    fn flush(&self, ctx: &RequestContext<'_>, _: Inode, fh: FileHandle, owner: LockOwner, reply: ReplyEmpty) {
        self.revive(ctx, fh);
        on_open_file(&self.shared.files, fh, reply, |f| {
            self.shared.fs.flush(ctx, &f.file, owner)
        })
    }

    fn fsync(&self, ctx: &RequestContext<'_>, _: Inode, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        self.revive(ctx, fh);
        on_open_file(&self.shared.files, fh, reply, |f| {
            self.shared.fs.fsync(ctx, &f.file, datasync)
        })
    }

    fn fallocate(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: FallocateRequest,
        reply: ReplyEmpty,
    ) {
        self.revive(ctx, fh);
        on_open_file(&self.shared.files, fh, reply, |f| {
            self.shared.fs.fallocate(ctx, &f.file, req)?;
            if self.clear_setid(ctx, Change::Modified, fh, &f.file)? {
                setid::forget_cached_mode(ctx, ino);
            }
            Ok(())
        })
    }

    fn lseek(
        &self,
        ctx: &RequestContext<'_>,
        _: Inode,
        fh: FileHandle,
        req: LseekRequest,
        reply: ReplyLseek,
    ) {
        self.revive(ctx, fh);
        on_open_file(&self.shared.files, fh, reply, |f| {
            self.shared.fs.lseek(ctx, &f.file, req)
        })
    }

    fn copy_file_range(&self, ctx: &RequestContext<'_>, req: &CopyFileRangeRequest, reply: ReplyCopy) {
        self.revive(ctx, req.fh_in);
        self.revive(ctx, req.fh_out);
        let r = (|| {
            let (from, to) = (self.file(req.fh_in)?, self.file(req.fh_out)?);
            let n = self.shared.fs.copy_file_range(
                ctx,
                &from.file,
                req.off_in,
                &to.file,
                req.off_out,
                req.len,
            )?;
            if n > 0 && self.clear_setid(ctx, Change::Modified, req.fh_out, &to.file)? {
                setid::forget_cached_mode(ctx, req.ino_out);
            }
            Ok::<_, Errno>(n)
        })();
        reply.result(r)
    }

    fn release(
        &self,
        ctx: &RequestContext<'_>,
        _: Inode,
        fh: FileHandle,
        _: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        let Some(entry) = self.shared.files.remove(fh.0) else {
            // A file a predecessor left open and nobody used since.
            let left = if self.shared.any_pending.load(Ordering::Acquire)
                && let Some(rec) = lock(&self.shared.pending).remove(&fh.0)
                && let Some(t) = &self.shared.kept
            {
                t.closed(rec.slot);
                true
            } else {
                false
            };
            return if left {
                reply.ok()
            } else {
                reply.error(Errno::EBADF)
            };
        };
        if let Some(t) = &self.shared.kept {
            let slot = entry.record.load(Ordering::Acquire);
            if slot != usize::MAX {
                t.closed(slot);
            }
        }
        lock(&entry.node.open).retain(|&f| f != fh.0);
        lock(&entry.node.io).detach(entry.passthrough);
        reply.ok();
        // Requests still running with this file hold their own reference;
        // the last one out hands the file back.
        if let Ok(e) = Arc::try_unwrap(entry) {
            self.shared.fs.release(ctx, e.file);
        }
    }

    fn readdir(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        _: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _tree = self.shared.tree.read();
        let r = (|| {
            let path = self.path(ino)?;
            let dir = self.node(ino)?;
            let me = match self.shared.table.get(ino).and_then(|n| *lock(&n.last)) {
                Some(_) => self.st_ino(ino),
                None => match self.shared.fs.getattr(ctx, Some(&path), None) {
                    Ok(a) => self.fix_attr(ino, a).1.ino,
                    Err(_) => ino.0,
                },
            };
            if crate::layers::core::add_dots(&mut reply, Inode(me), offset).is_full() {
                return Ok(());
            }
            let mut ino_of = |name: &[u8]| {
                let known = lock(&dir.children).get(name).copied();
                if let Some(k) = known.filter(|&k| self.live(k).is_some()) {
                    return self.st_ino(Inode(k.0));
                }
                let child = path.join(OsStr::from_bytes(name));
                match self.shared.fs.getattr(ctx, Some(&child), None) {
                    Ok(a) if a.ino != 0 => a.ino,
                    _ => UNKNOWN_INO,
                }
            };
            let mut fill = PathDirFill {
                reply: &mut reply,
                full: false,
                ino_of: &mut ino_of,
            };
            self.shared
                .fs
                .readdir(ctx, &path, offset.saturating_sub(2), &mut fill)
        })();
        reply.result(r)
    }

    fn getxattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, size: u32, reply: ReplyXattr) {
        let _tree = self.shared.tree.read();
        let v = self
            .path(ino)
            .and_then(|p| self.shared.fs.getxattr(ctx, &p, name));
        SizedXattr(reply, size).answer(v)
    }

    fn listxattr(&self, ctx: &RequestContext<'_>, ino: Inode, size: u32, reply: ReplyXattr) {
        let _tree = self.shared.tree.read();
        let v = self.path(ino).and_then(|p| self.shared.fs.listxattr(ctx, &p));
        let admin = || ctx.caller().holds_capability(crate::credentials::cap::SYS_ADMIN);
        SizedXattr(reply, size).answer(v.map(|l| hide_trusted(admin, l)))
    }

    fn setxattr(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        name: &CStr,
        req: SetxattrRequest<'_>,
        reply: ReplyEmpty,
    ) {
        let _tree = self.shared.tree.read();
        self.show_node(ctx, ino);
        let r = self.path(ino).and_then(|p| {
            let fs = &self.shared.fs;
            match fs.setxattr(ctx, &p, name, req.value, req.flags) {
                // Resent after a crash, an exclusive set that finds the
                // attribute holding its value was done by the dead daemon
                // (the kernel holds the inode's lock through the request).
                Err(Errno::EEXIST)
                    if req.flags & libc::XATTR_CREATE != 0
                        && ctx.replay() == Replay::MaybeDone
                        && fs.getxattr(ctx, &p, name).is_ok_and(|v| v == req.value) =>
                {
                    Ok(())
                }
                r => r,
            }
        });
        reply.result(r)
    }

    fn removexattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, reply: ReplyEmpty) {
        let _tree = self.shared.tree.read();
        self.show_node(ctx, ino);
        let r = self
            .path(ino)
            .and_then(|p| match self.shared.fs.removexattr(ctx, &p, name) {
                // Resent after a crash and gone: the dead daemon removed it.
                Err(Errno::ENODATA) if ctx.replay() == Replay::MaybeDone => Ok(()),
                r => r,
            });
        reply.result(r)
    }

    fn statfs(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyStatfs) {
        let _tree = self.shared.tree.read();
        let path = self.path(ino).unwrap_or_else(|_| PathBuf::from("/"));
        reply.result(self.shared.fs.statfs(ctx, &path))
    }
}

/// Drops the kernel's cached state of paths (from [`PathFs::invalidator`]);
/// clone freely.
///
/// Each call only queues a notification for the session's notifier thread
/// and never waits, and takes no tree lock, so it is safe anywhere,
/// including inside a method serving the path it invalidates. Paths the
/// kernel holds no entry for need none (`Ok` without sending). It resolves
/// the path through the names the kernel knows without stopping renames: a
/// rename running at the same time may make it invalidate the old or the
/// new place (both harmless) or neither. Errors: no request was served yet,
/// or the kernel lacks the notification.
#[derive(Clone)]
pub struct PathInvalidator {
    table: Arc<InodeTable<u64, Arc<PNode>>>,
    notifier: Arc<NotifierSlot>,
}

impl PathInvalidator {
    /// The node id the kernel knows `path` by, if it holds one.
    pub fn ino(&self, path: &Path) -> Option<Inode> {
        use std::path::Component;
        let mut at = Inode::ROOT;
        for c in path.components() {
            match c {
                Component::RootDir | Component::CurDir => continue,
                Component::Normal(name) => {
                    let dir = self.table.get(at)?;
                    let (ino, generation) = *lock(&dir.children).get(name.as_bytes())?;
                    if self.table.generation(Inode(ino)) != Some(generation) {
                        return None;
                    }
                    at = Inode(ino);
                }
                _ => return None,
            }
        }
        Some(at)
    }

    /// Drops the cached attributes and content of `path`.
    pub fn content(&self, path: &Path) -> Result<(), NotifyError> {
        self.notifier.inval_content(self.ino(path))
    }

    /// Drops the cached name `name` in directory `dir` (after a change the
    /// kernel did not make).
    pub fn entry(&self, dir: &Path, name: &[u8]) -> Result<(), NotifyError> {
        self.notifier.inval_entry(self.ino(dir), name)
    }
}

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
//! # The folder
//!
//! This module holds the layer's type ([`PathFs`]) with its tables (nodes,
//! open files, the tree lock), its constructors and accessors; one file a
//! concern beside it: the trait a filesystem implements and what its `open`
//! returns (`filesystem.rs`), the answers to the kernel request by request
//! (`adapter.rs`, the `Filesystem` impl), the tree of names and the open
//! files' bookkeeping (`tree.rs`), the tables kept under a keeper
//! (`kept.rs`), directory filling (`dir_fill.rs`) and the invalidator
//! (`invalidator.rs`). It uses the layers' shared core (`layers::core`,
//! `setid`, `values`), what a filesystem implements and receives (`api/`:
//! the request context, replies, the inode and handle tables) and, from
//! `recovery/`, the journal's [`Replay`](crate::journal::Replay) (for a
//! resent request) and, for the kept tables, the kept tree and the keeper's
//! restore; never the serving core (`serve/`).
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

mod adapter;
mod dir_fill;
mod filesystem;
mod invalidator;
mod kept;
mod tree;

pub use dir_fill::{PathDirFill, UNKNOWN_INO};
pub use filesystem::{PathFilesystem, PathOpened};
pub use invalidator::PathInvalidator;

use crate::attr::FileAttr;
use crate::context::RequestContext;
use crate::inodes::{HandleTable, InodeTable, OpenModes};
use crate::kept_tree::{KeptOpen, KeptTree};
use crate::layers::core::{NotifierSlot, lock};
use crate::types::Inode;

pub use crate::layers::core::MAX_COOKIE;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

/// More names than this between a node and the root means the tree is
/// broken (a cycle): answered `EIO` and logged. (Deep trees are fine:
/// `PATH_MAX` only limits one system call's path, not the tree.)
const MAX_DEPTH: usize = 1 << 16;

/// How many read locks the tree lock is split into.
pub const TREE_SHARDS: usize = 16;

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

/// Serves a [`PathFilesystem`] as a [`Filesystem`](crate::Filesystem); see the
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
}

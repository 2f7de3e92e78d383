//! The node layer: a filesystem as a tree of objects, one per file or
//! directory, served by [`NodeFs`] (an adapter implementing
//! [`crate::Filesystem`]).
//!
//! The filesystem implements [`Node`] for its files and directories (a
//! directory answers `lookup`, `readdir`, `mkdir`, `create`, `unlink`,
//! `rename`…, a file `getattr`, `setattr`, `open`…) and [`OpenFile`] for
//! what `open` returns. The library does the bookkeeping every FUSE
//! filesystem otherwise redoes:
//!
//! - node ids, generations and lookup counts, in the shared
//!   [`crate::inodes::InodeTable`]: a node gets one node id however many
//!   names lead to it (hard links: return the same `Arc` from `lookup`),
//!   is counted exactly where the kernel counts (entry replies, added
//!   READDIRPLUS entries) and dropped by FORGET/BATCH_FORGET at 0;
//! - open files: the [`OpenFile`] an `open` returned is kept until RELEASE
//!   (a file that was unlinked meanwhile still works through it), with its
//!   passthrough backing file if it asked for one ([`Opened::passthrough`]);
//! - "." and ".." in listings (cookies 1 and 2; a node's own cookies are
//!   shifted past them), TTLs, `st_ino` when a node leaves it 0 (1 for
//!   the root, a keyed hash for the others: see [`Node::getattr`]);
//! - for directories that keep their children in memory, [`Children`]: a
//!   name map with listing cookies that stay valid while names change.
//!
//! Identity is the `Arc`: the same `Arc<dyn Node>` is the same inode. A
//! directory should keep its children (an in-memory tree) or cache them;
//! one that builds a new object at every `lookup` makes the kernel see a
//! new inode each time the cached entry expires.
//!
//! Permission checks: mount with `default_permissions` (the kernel checks),
//! or check in the nodes' methods against [`RequestContext::caller`]; the
//! layer answers ACCESS with `ENOSYS` (the kernel then grants it).
//!
//! Set-ID bits: the layer asks for `HANDLE_KILLPRIV_V2` and clears them
//! itself where the VFS would (a flagged WRITE, truncate, chown or
//! `O_TRUNC` open; FALLOCATE by a caller without `CAP_FSETID`), by the
//! node's [`Node::getattr`] and a mode-only [`Node::setattr`] (with the
//! open file for the requests on one).
//!
//! # Invalidation
//!
//! [`NodeFs::invalidator`] gives an [`Invalidator`] that drops the kernel's
//! cached data, attributes or names of a node. It only queues notifications
//! (the session writes them from its own thread) and never waits, so it is
//! safe anywhere, including inside a handler that serves the same node.
//!
//! # Locking
//!
//! None of its own beyond the inode table's and the open-file table's shard
//! locks, which are never held while a node's method runs: nodes do their
//! own locking (per node, as the examples do).
//!
//! ```
//! use fuse_session::node::{DirFill, Node, NodeFs, NodeRef, OpenFile, Opened};
//! use fuse_session::reply::ReplyData;
//! use fuse_session::{Errno, FileAttr, FileKind, ReadRequest, RequestContext, OpenFlags};
//! use std::{ffi::CStr, sync::Arc};
//!
//! struct Text(&'static [u8]);
//! impl Node for Text {
//!     fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
//!         Ok(FileAttr::fixed(0, FileKind::RegularFile, 0o444).with_size(self.0.len() as u64))
//!     }
//!     fn open(&self, _: &RequestContext<'_>, _: OpenFlags) -> Result<Opened, Errno> {
//!         Ok(Opened::new(Reader(self.0)))
//!     }
//! }
//! struct Reader(&'static [u8]);
//! impl OpenFile for Reader {
//!     fn read(&self, _: &RequestContext<'_>, req: ReadRequest, reply: ReplyData) {
//!         let start = (req.offset as usize).min(self.0.len());
//!         reply.data(&self.0[start..(start + req.size as usize).min(self.0.len())]);
//!     }
//! }
//!
//! struct Root(NodeRef);
//! impl Node for Root {
//!     fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
//!         Ok(FileAttr::fixed(0, FileKind::Directory, 0o555))
//!     }
//!     fn lookup(&self, _: &RequestContext<'_>, name: &CStr) -> Result<NodeRef, Errno> {
//!         if name.to_bytes() == b"hello" { Ok(self.0.clone()) } else { Err(Errno::ENOENT) }
//!     }
//!     fn readdir(&self, _: &RequestContext<'_>, offset: u64, out: &mut DirFill<'_, '_>) -> Result<(), Errno> {
//!         // One child, cookie 1: listed unless the kernel continues after it.
//!         for (cookie, name) in [(1, b"hello")].into_iter().skip(offset as usize) {
//!             if out.add(name, cookie, &self.0).is_full() {
//!                 break;
//!             }
//!         }
//!         Ok(())
//!     }
//! }
//!
//! let fs = NodeFs::new(Arc::new(Root(Arc::new(Text(b"Hello!\n")))));
//! assert_eq!(fs.live_nodes(), 1); // the root
//! // fuse_session::serve(fs, "/mnt/hello", &Default::default())?;
//! ```

use crate::attr::{FileAttr, Statfs};
use crate::backing::BackingFile;
use crate::context::RequestContext;
use crate::filesystem::Filesystem;
use crate::init::InitConfig;
use crate::inodes::{Forgotten, HandleTable, InodeTable, OpenModes};
use crate::layers::core::{
    Answer, NotifierSlot, SizedXattr, check_name, hide_trusted, lock, on_open_file, open_builders,
};
use crate::layers::setid::{self, Change};
use crate::layers::values::{Created, Open};
use crate::ops::*;
use crate::reply::*;
use crate::types::{Entry, FileHandle, Inode, LockOwner};
use fuse_proto::Errno;
use fuse_proto::flags::{FopenFlags, InitFlags, OpenInFlags, WriteFlags};
use std::any::Any;
use std::ffi::CStr;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};

pub use crate::layers::core::MAX_COOKIE;
use std::time::Duration;

/// A node of the tree, shared by the tree and the library.
pub type NodeRef = Arc<dyn Node>;

/// A file or directory of a node-layer filesystem.
///
/// Only [`Node::getattr`] is required. The directory methods are called on
/// the directory (`lookup`, `create`, `unlink`… get the name in it), the
/// file methods on the file. Defaults: `ENOTDIR` for looking up in or
/// listing a non-directory, `EROFS` for changes, `EINVAL` for `readlink`
/// and `open`. A method runs on a worker thread and may block; it must not
/// wait for another request of the same filesystem.
///
/// A node is `Any`, so that a method receiving another node (`rename`'s
/// target directory, `link`'s node) can downcast it to its own type:
/// `(&**node as &dyn Any).downcast_ref::<MyDir>()`.
pub trait Node: Any + Send + Sync {
    /// The node's attributes. `ino` 0 leaves `st_ino` to the library: 1
    /// for the root; for any other node a keyed hash of its identity,
    /// stable while the node lives, never 0 or 1 and never its address
    /// (the hash's key is random per [`NodeFs`]; two live nodes share a
    /// number with odds of about n²/2⁶⁵ for n nodes). Report your own
    /// number where it must survive the process (an archive's member
    /// index, a source file's `st_ino`).
    fn getattr(&self, ctx: &RequestContext<'_>) -> Result<FileAttr, Errno>;

    /// Changes attributes (`chmod`, `chown`, `truncate`, `utimensat`);
    /// `file` is the open file it came through, if any. Returns the new
    /// attributes.
    fn setattr(
        &self,
        ctx: &RequestContext<'_>,
        req: &SetattrRequest,
        file: Option<&dyn OpenFile>,
    ) -> Result<FileAttr, Errno> {
        let _ = (ctx, req, file);
        Err(Errno::EROFS)
    }

    /// The target of a symbolic link.
    fn readlink(&self, ctx: &RequestContext<'_>) -> Result<Vec<u8>, Errno> {
        let _ = ctx;
        Err(Errno::EINVAL)
    }

    /// Opens the file (`flags` as [`crate::Filesystem::open`] gets them).
    fn open(&self, ctx: &RequestContext<'_>, flags: OpenFlags) -> Result<Opened, Errno> {
        let _ = (ctx, flags);
        Err(Errno::EINVAL)
    }

    /// Directory: the child called `name` (`ENOENT` if none).
    fn lookup(&self, ctx: &RequestContext<'_>, name: &CStr) -> Result<NodeRef, Errno> {
        let _ = (ctx, name);
        Err(Errno::ENOTDIR)
    }

    /// Directory: lists the children after cookie `offset` (0: from the
    /// start), adding each with [`DirFill::add`] until it returns
    /// [`DirAdd::Full`]. `offset` is a cookie this method gave an entry
    /// (the entry to continue after), or 0. The library adds "." and ".."
    /// itself (cookies 1 and 2 on the wire) and shifts this method's
    /// cookies past them, so the cookies here start wherever you like
    /// above 0.
    fn readdir(&self, ctx: &RequestContext<'_>, offset: u64, out: &mut DirFill<'_, '_>) -> Result<(), Errno> {
        let _ = (ctx, offset, out);
        Err(Errno::ENOTDIR)
    }

    /// Directory: creates and opens the regular file `name`.
    fn create(
        &self,
        ctx: &RequestContext<'_>,
        name: &CStr,
        req: CreateRequest,
    ) -> Result<(NodeRef, Opened), Errno> {
        let _ = (ctx, name, req);
        Err(Errno::EROFS)
    }

    /// Directory: creates the node `name` (fifo, socket, device, file).
    fn mknod(&self, ctx: &RequestContext<'_>, name: &CStr, req: MknodRequest) -> Result<NodeRef, Errno> {
        let _ = (ctx, name, req);
        Err(Errno::EROFS)
    }

    /// Directory: creates the directory `name` (`mode`: permission bits).
    fn mkdir(&self, ctx: &RequestContext<'_>, name: &CStr, mode: u32) -> Result<NodeRef, Errno> {
        let _ = (ctx, name, mode);
        Err(Errno::EROFS)
    }

    /// Directory: creates the symbolic link `name` to `target`.
    fn symlink(&self, ctx: &RequestContext<'_>, name: &CStr, target: &CStr) -> Result<NodeRef, Errno> {
        let _ = (ctx, name, target);
        Err(Errno::EROFS)
    }

    /// Directory: adds `node` under `name` (a hard link). The default
    /// answers `EROFS`, as for every change (`link(2)` then fails with
    /// "Read-only file system").
    fn link(&self, ctx: &RequestContext<'_>, name: &CStr, node: &NodeRef) -> Result<(), Errno> {
        let _ = (ctx, name, node);
        Err(Errno::EROFS)
    }

    /// Directory: removes the non-directory `name`.
    fn unlink(&self, ctx: &RequestContext<'_>, name: &CStr) -> Result<(), Errno> {
        let _ = (ctx, name);
        Err(Errno::EROFS)
    }

    /// Directory: removes the empty directory `name`.
    fn rmdir(&self, ctx: &RequestContext<'_>, name: &CStr) -> Result<(), Errno> {
        let _ = (ctx, name);
        Err(Errno::EROFS)
    }

    /// Directory: moves `name` to `newname` in `newdir` (which may be this
    /// directory itself).
    fn rename(
        &self,
        ctx: &RequestContext<'_>,
        name: &CStr,
        newdir: &NodeRef,
        newname: &CStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let _ = (ctx, name, newdir, newname, flags);
        Err(Errno::EROFS)
    }

    /// Filesystem statistics (asked of the root, or of any node). The
    /// default: an empty filesystem with 255-byte names,
    /// [`Statfs::new`].
    fn statfs(&self, ctx: &RequestContext<'_>) -> Result<Statfs, Errno> {
        let _ = ctx;
        Ok(Statfs::new())
    }

    /// The value of extended attribute `name` (`ENODATA` if it has none).
    /// `ENOSYS` (the default) makes the kernel answer every xattr call
    /// `EOPNOTSUPP` from then on. The library answers the size probe and
    /// `ERANGE`.
    fn getxattr(&self, ctx: &RequestContext<'_>, name: &CStr) -> Result<Vec<u8>, Errno> {
        let _ = (ctx, name);
        Err(Errno::ENOSYS)
    }

    /// The names of its extended attributes, each followed by a NUL.
    fn listxattr(&self, ctx: &RequestContext<'_>) -> Result<Vec<u8>, Errno> {
        let _ = ctx;
        Err(Errno::ENOSYS)
    }

    /// Sets extended attribute `name` (`flags`: `XATTR_CREATE`,
    /// `XATTR_REPLACE` or 0).
    fn setxattr(&self, ctx: &RequestContext<'_>, name: &CStr, value: &[u8], flags: i32) -> Result<(), Errno> {
        let _ = (ctx, name, value, flags);
        Err(Errno::ENOSYS)
    }

    /// Removes extended attribute `name`.
    fn removexattr(&self, ctx: &RequestContext<'_>, name: &CStr) -> Result<(), Errno> {
        let _ = (ctx, name);
        Err(Errno::ENOSYS)
    }

    /// The kernel dropped its last reference to this node (FORGET). The
    /// library no longer holds it; nothing to answer.
    fn forgotten(&self) {}
}

/// An open file: what [`Node::open`] and [`Node::create`] return, kept by
/// the library until RELEASE.
pub trait OpenFile: Any + Send + Sync {
    /// READ: answer with `reply` (e.g. [`ReplyData::data`], or
    /// [`ReplyData::splice_from`] a file descriptor).
    fn read(&self, ctx: &RequestContext<'_>, req: ReadRequest, reply: ReplyData) {
        let _ = (ctx, req);
        reply.error(Errno::EINVAL);
    }

    /// WRITE: returns the count written.
    fn write(&self, ctx: &RequestContext<'_>, req: WriteRequest<'_>) -> Result<u32, Errno> {
        let _ = (ctx, req);
        Err(Errno::EINVAL)
    }

    /// FLUSH (each `close(2)`): its error is what `close` returns. Sent
    /// only for files opened [`Opened::with_flush`] (and, with writeback
    /// caching, for every file: the kernel then writes dirty pages back on
    /// close); for the others the kernel skips the round trip. Several per
    /// open, the first possibly before any data (bash's `echo x > f`):
    /// commit only what was written since the last commit, as
    /// [`Filesystem::flush`] explains.
    fn flush(&self, ctx: &RequestContext<'_>, lock_owner: LockOwner) -> Result<(), Errno> {
        let _ = (ctx, lock_owner);
        Ok(())
    }

    /// FSYNC.
    fn fsync(&self, ctx: &RequestContext<'_>, datasync: bool) -> Result<(), Errno> {
        let _ = (ctx, datasync);
        Ok(())
    }

    /// FALLOCATE (`fallocate(2)`). `ENOSYS` (the default) makes the
    /// kernel answer later calls `EOPNOTSUPP` itself.
    fn fallocate(&self, ctx: &RequestContext<'_>, req: FallocateRequest) -> Result<(), Errno> {
        let _ = (ctx, req);
        Err(Errno::ENOSYS)
    }

    /// LSEEK with `SEEK_DATA` or `SEEK_HOLE`: the offset found. `ENOSYS`
    /// (the default) makes the kernel answer such seeks itself (all data).
    fn lseek(&self, ctx: &RequestContext<'_>, req: LseekRequest) -> Result<u64, Errno> {
        let _ = (ctx, req);
        Err(Errno::ENOSYS)
    }

    /// RELEASE: the last reference is gone; the library drops the file
    /// after this returns. Not awaited by `close`, and possibly long after
    /// it: see [`Filesystem::release`].
    fn release(&self, ctx: &RequestContext<'_>) {
        let _ = ctx;
    }
}

/// An open file and how the kernel should treat it.
pub struct Opened {
    /// The file.
    pub file: Box<dyn OpenFile>,
    /// `DIRECT_IO`, `KEEP_CACHE`, … (the session may add `DIRECT_IO |
    /// PARALLEL_DIRECT_WRITES` for an `O_DIRECT` open: see
    /// [`SessionConfig::o_direct_parallel_writes`](crate::SessionConfig::o_direct_parallel_writes))
    pub flags: FopenFlags,
    /// A passthrough backing file: the kernel reads and writes it directly
    /// (see [`RequestContext::open_backing`]); the library keeps it until
    /// RELEASE.
    ///
    /// The kernel wants one backing file for all open files of an inode
    /// and no mix of passthrough and other opens, so the library decides
    /// per node: the first passthrough open's backing file serves every
    /// later open of the node while one is open (open it for reading and
    /// writing), and while the node has opens served by their
    /// [`OpenFile`], a new one is served by its `OpenFile` too (which must
    /// therefore be able to serve reads and writes itself).
    pub backing: Option<BackingFile>,
}

impl Opened {
    /// `file`, no backing file, flags `NOFLUSH` only: closing it sends no
    /// FLUSH (see [`Opened::with_flush`]).
    pub fn new(file: impl OpenFile) -> Opened {
        Opened {
            file: Box::new(file),
            flags: FopenFlags::NOFLUSH,
            backing: None,
        }
    }

    open_builders!();
}

/// How [`NodeFs`] serves.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// How long the kernel may cache names (default 1 s).
    pub entry_ttl: Duration,
    /// How long the kernel may cache attributes (default 1 s).
    pub attr_ttl: Duration,
    /// Ask for READDIRPLUS (listings carry attributes; default on).
    pub readdirplus: bool,
    /// Ask for kernel passthrough (needed by [`Opened::passthrough`]; sets
    /// a `max_stack_depth` of at least 1, so the mount itself cannot be a
    /// backing filesystem's).
    pub passthrough: bool,
    /// More capabilities to ask for at INIT.
    pub wanted: InitFlags,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            entry_ttl: Duration::from_secs(1),
            attr_ttl: Duration::from_secs(1),
            readdirplus: true,
            passthrough: false,
            wanted: InitFlags::empty(),
        }
    }
}

/// What the library keeps per open file.
struct OpenEntry {
    held: Arc<Held>,
    file: Box<dyn OpenFile>,
    passthrough: bool,
}

/// What the table holds per node: the node, and how its open files do I/O.
struct Held {
    node: NodeRef,
    io: Mutex<OpenModes>,
}

struct Shared {
    /// The root's identity (the table knows the root by number only).
    root: usize,
    /// The key of the hash that gives nodes reporting `ino` 0 their
    /// `st_ino` (see [`Node::getattr`]).
    ino_key: RandomState,
    table: InodeTable<usize, Arc<Held>>,
    files: HandleTable<Arc<OpenEntry>>,
    notifier: NotifierSlot,
}

/// Serves a tree of [`Node`]s as a [`Filesystem`]; see the
/// [module documentation](self). A clone shares the tree, the inode table
/// and the open files (keep one to look at [`NodeFs::live_nodes`] after
/// serving).
#[derive(Clone)]
pub struct NodeFs {
    shared: Arc<Shared>,
    opts: NodeOptions,
}

/// The identity of a node: its address, stable while an `Arc` is held.
/// Never shown to the kernel (see [`Shared::st_ino`]).
fn key_of(node: &NodeRef) -> usize {
    Arc::as_ptr(node) as *const () as usize
}

impl Shared {
    /// The `st_ino` of the node `key` when it reports 0: 1 for the root,
    /// else a keyed hash of its identity, never 0 or 1. Any user of an
    /// `allow_other` mount can read `st_ino`, so it must not be the
    /// address the identity is.
    fn st_ino(&self, key: usize) -> u64 {
        if key == self.root {
            return Inode::ROOT.0;
        }
        match self.ino_key.hash_one(key) {
            h @ 0..=1 => h + 2,
            h => h,
        }
    }
}

impl NodeFs {
    /// Serves the tree under `root` with [`NodeOptions::default`].
    pub fn new(root: NodeRef) -> NodeFs {
        Self::with_options(root, NodeOptions::default())
    }

    /// Serves the tree under `root`.
    pub fn with_options(root: NodeRef, opts: NodeOptions) -> NodeFs {
        NodeFs {
            shared: Arc::new(Shared {
                root: key_of(&root),
                ino_key: RandomState::new(),
                table: InodeTable::new(Arc::new(Held {
                    node: root,
                    io: Mutex::default(),
                })),
                files: HandleTable::new(),
                notifier: NotifierSlot::default(),
            }),
            opts,
        }
    }

    /// A handle for invalidating the kernel's caches of nodes.
    pub fn invalidator(&self) -> Invalidator {
        Invalidator {
            shared: self.shared.clone(),
        }
    }

    /// Nodes the kernel holds references to, the root included.
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

    /// The generation of node id `ino` (for tests; `None`: not held).
    pub fn generation(&self, ino: Inode) -> Option<u64> {
        self.shared.table.generation(ino)
    }

    fn remember_notifier(&self, ctx: &RequestContext<'_>) {
        self.shared.notifier.remember(ctx)
    }

    fn node(&self, ino: Inode) -> Result<NodeRef, Errno> {
        self.held(ino).map(|h| h.node.clone())
    }

    fn held(&self, ino: Inode) -> Result<Arc<Held>, Errno> {
        crate::layers::core::held(&self.shared.table, ino)
    }

    /// The attributes of `node`, with the library's `st_ino` if it
    /// reports none.
    fn attr_of(&self, node: &NodeRef, ctx: &RequestContext<'_>) -> Result<FileAttr, Errno> {
        let mut attr = node.getattr(ctx)?;
        if attr.ino == 0 {
            attr.ino = self.shared.st_ino(key_of(node));
        }
        Ok(attr)
    }

    /// The entry of `node`, with one lookup reference taken for the reply
    /// about to be sent.
    fn enter(&self, ctx: &RequestContext<'_>, node: NodeRef) -> Result<Entry, Errno> {
        let attr = self.attr_of(&node, ctx)?;
        let (ino, generation) = self.shared.table.acquire(key_of(&node), || {
            Arc::new(Held {
                node: node.clone(),
                io: Mutex::default(),
            })
        });
        Ok(Entry {
            ino,
            generation,
            attr,
            entry_ttl: self.opts.entry_ttl,
            attr_ttl: self.opts.attr_ttl,
        })
    }

    fn forget_one(&self, ino: Inode, n: u64) {
        if let Forgotten::Dropped(held) = self.shared.table.forget(ino, n) {
            held.node.forgotten();
        }
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<OpenEntry>, Errno> {
        crate::layers::core::open_file(&self.shared.files, fh)
    }

    fn store_open(&self, held: Arc<Held>, opened: Opened) -> Open {
        let (flags, backing) = crate::layers::core::attach_open(&held.io, opened.flags, opened.backing);
        let fh = self.shared.files.insert(Arc::new(OpenEntry {
            held,
            file: opened.file,
            passthrough: backing.is_some(),
        }));
        Open {
            fh: FileHandle(fh),
            flags,
            backing,
        }
    }

    fn new_entry(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        reply: ReplyEntry,
        make: impl FnOnce(&NodeRef) -> Result<NodeRef, Errno>,
    ) {
        reply.result(
            self.node(parent)
                .and_then(|p| make(&p))
                .and_then(|n| self.enter(ctx, n)),
        )
    }
}

impl Filesystem for NodeFs {
    fn recovery(&self) -> crate::Recovery {
        crate::Recovery::Unsupported(
            "the node layer keeps its node table and open files in this process only: a successor would \
             give the node ids the kernel holds to other nodes (not yet supported under a keeper)",
        )
    }

    fn init(&self, config: &mut InitConfig) -> Result<(), Errno> {
        config.wanted |= self.opts.wanted;
        // The layer clears set-ID bits itself (`setid`).
        setid::want(config);
        if self.opts.readdirplus {
            config.wanted |= InitFlags::DO_READDIRPLUS;
        }
        if self.opts.passthrough {
            config.wanted |= InitFlags::PASSTHROUGH;
            // Backing files on filesystems that are not themselves stacked.
            config.max_stack_depth = config.max_stack_depth.max(1);
        }
        Ok(())
    }

    fn lookup(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        self.remember_notifier(ctx);
        if let Err(e) = check_name(name) {
            return reply.error(e);
        }
        self.new_entry(ctx, parent, reply, |p| p.lookup(ctx, name))
    }

    fn forget(&self, _: &RequestContext<'_>, ino: Inode, nlookup: u64) {
        self.forget_one(ino, nlookup)
    }

    fn getattr(&self, ctx: &RequestContext<'_>, ino: Inode, _: Option<FileHandle>, reply: ReplyAttr) {
        self.remember_notifier(ctx);
        let ttl = self.opts.attr_ttl;
        reply.result(
            self.node(ino)
                .and_then(|n| self.attr_of(&n, ctx))
                .map(|a| (ttl, a)),
        )
    }

    fn setattr(&self, ctx: &RequestContext<'_>, ino: Inode, req: &SetattrRequest, reply: ReplyAttr) {
        let r = (|| {
            let node = self.node(ino)?;
            let file = match req.fh {
                Some(fh) => self.shared.files.get(fh.0),
                None => None,
            };
            let file = file.as_deref().map(|f| &*f.file);
            let mut attr = setid::setattr(ctx, req, || node.getattr(ctx), |r| node.setattr(ctx, r, file))?;
            if attr.ino == 0 {
                attr.ino = self.shared.st_ino(key_of(&node));
            }
            Ok::<_, Errno>((self.opts.attr_ttl, attr))
        })();
        reply.result(r)
    }

    fn readlink(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyData) {
        reply.result(self.node(ino).and_then(|n| n.readlink(ctx)))
    }

    fn symlink(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        target: &CStr,
        reply: ReplyEntry,
    ) {
        if let Err(e) = check_name(name) {
            return reply.error(e);
        }
        self.new_entry(ctx, parent, reply, |p| p.symlink(ctx, name, target))
    }

    fn mknod(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: MknodRequest,
        reply: ReplyEntry,
    ) {
        if let Err(e) = check_name(name) {
            return reply.error(e);
        }
        self.new_entry(ctx, parent, reply, |p| p.mknod(ctx, name, req))
    }

    fn mkdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, mode: u32, reply: ReplyEntry) {
        if let Err(e) = check_name(name) {
            return reply.error(e);
        }
        self.new_entry(ctx, parent, reply, |p| p.mkdir(ctx, name, mode))
    }

    fn unlink(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        reply.result(
            check_name(name)
                .and_then(|()| self.node(parent))
                .and_then(|p| p.unlink(ctx, name)),
        )
    }

    fn rmdir(&self, ctx: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        reply.result(
            check_name(name)
                .and_then(|()| self.node(parent))
                .and_then(|p| p.rmdir(ctx, name)),
        )
    }

    fn rename(&self, ctx: &RequestContext<'_>, req: &RenameRequest<'_>, reply: ReplyEmpty) {
        let r = (|| {
            check_name(req.name)?;
            check_name(req.newname)?;
            let from = self.node(req.parent)?;
            let to = self.node(req.newparent)?;
            from.rename(ctx, req.name, &to, req.newname, req.flags)
        })();
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
        let r = (|| {
            check_name(newname)?;
            let node = self.node(ino)?;
            self.node(newparent)?.link(ctx, newname, &node)?;
            self.enter(ctx, node)
        })();
        reply.result(r)
    }

    fn open(&self, ctx: &RequestContext<'_>, ino: Inode, flags: OpenFlags, reply: ReplyOpen) {
        self.remember_notifier(ctx);
        let r = self.held(ino).and_then(|held| {
            let opened = held.node.open(ctx, flags)?;
            if flags.bits() & libc::O_TRUNC != 0 && ctx.open_in_flags().contains(OpenInFlags::KILL_SUIDGID) {
                let file = Some(&*opened.file);
                let cleared = setid::clear(
                    ctx,
                    Change::Written,
                    None,
                    || held.node.getattr(ctx),
                    |r| held.node.setattr(ctx, r, file),
                );
                if let Err(e) = cleared {
                    opened.file.release(ctx);
                    return Err(e);
                }
            }
            Ok(self.store_open(held, opened))
        });
        reply.answer(r)
    }

    fn read(&self, ctx: &RequestContext<'_>, _: Inode, fh: FileHandle, req: ReadRequest, reply: ReplyData) {
        match self.file(fh) {
            Ok(f) => f.file.read(ctx, req, reply),
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
        on_open_file(&self.shared.files, fh, reply, |f| {
            if req.write_flags.contains(WriteFlags::KILL_SUIDGID) {
                clear_setid(ctx, Change::Written, fh, &f)?;
            }
            f.file.write(ctx, req)
        })
    }

    fn flush(&self, ctx: &RequestContext<'_>, _: Inode, fh: FileHandle, owner: LockOwner, reply: ReplyEmpty) {
        on_open_file(&self.shared.files, fh, reply, |f| f.file.flush(ctx, owner))
    }

    fn release(
        &self,
        ctx: &RequestContext<'_>,
        _: Inode,
        fh: FileHandle,
        _: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        match self.shared.files.remove(fh.0) {
            Some(f) => {
                f.file.release(ctx);
                lock(&f.held.io).detach(f.passthrough);
                reply.ok()
            }
            None => reply.error(Errno::EBADF),
        }
    }

    fn fsync(&self, ctx: &RequestContext<'_>, _: Inode, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        on_open_file(&self.shared.files, fh, reply, |f| f.file.fsync(ctx, datasync))
    }

    fn fallocate(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        fh: FileHandle,
        req: FallocateRequest,
        reply: ReplyEmpty,
    ) {
        on_open_file(&self.shared.files, fh, reply, |f| {
            f.file.fallocate(ctx, req)?;
            if clear_setid(ctx, Change::Modified, fh, &f)? {
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
        on_open_file(&self.shared.files, fh, reply, |f| f.file.lseek(ctx, req))
    }

    fn opendir(&self, ctx: &RequestContext<'_>, ino: Inode, _: OpenFlags, reply: ReplyOpen) {
        self.remember_notifier(ctx);
        match self.node(ino) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
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
        let r = (|| {
            let dir = self.node(ino)?;
            let me = self.attr_of(&dir, ctx)?.ino;
            if crate::layers::core::add_dots(&mut reply, Inode(me), offset).is_full() {
                return Ok(());
            }
            let mut fill = DirFill {
                ctx,
                fs: self,
                out: Out::Plain(&mut reply),
                full: false,
            };
            dir.readdir(ctx, offset.saturating_sub(2), &mut fill)
        })();
        reply.result(r)
    }

    fn readdirplus(
        &self,
        ctx: &RequestContext<'_>,
        ino: Inode,
        _: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let r = (|| {
            let dir = self.node(ino)?;
            let attr = self.attr_of(&dir, ctx)?;
            let me = Entry {
                ino,
                generation: 0,
                attr,
                entry_ttl: Duration::ZERO,
                attr_ttl: Duration::ZERO,
            };
            for (i, name) in [".", ".."].into_iter().enumerate().skip(offset as usize) {
                // Never counted by the kernel.
                if reply.add(&me, i as u64 + 1, name).is_full() {
                    return Ok(());
                }
            }
            let mut fill = DirFill {
                ctx,
                fs: self,
                out: Out::Plus(&mut reply),
                full: false,
            };
            dir.readdir(ctx, offset.saturating_sub(2), &mut fill)
        })();
        reply.result(r)
    }

    fn statfs(&self, ctx: &RequestContext<'_>, ino: Inode, reply: ReplyStatfs) {
        reply.result(self.node(ino).and_then(|n| n.statfs(ctx)))
    }

    fn getxattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, size: u32, reply: ReplyXattr) {
        SizedXattr(reply, size).answer(self.node(ino).and_then(|n| n.getxattr(ctx, name)))
    }

    fn listxattr(&self, ctx: &RequestContext<'_>, ino: Inode, size: u32, reply: ReplyXattr) {
        let admin = || ctx.caller().holds_capability(crate::credentials::cap::SYS_ADMIN);
        let v = self.node(ino).and_then(|n| n.listxattr(ctx));
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
        reply.result(
            self.node(ino)
                .and_then(|n| n.setxattr(ctx, name, req.value, req.flags)),
        )
    }

    fn removexattr(&self, ctx: &RequestContext<'_>, ino: Inode, name: &CStr, reply: ReplyEmpty) {
        reply.result(self.node(ino).and_then(|n| n.removexattr(ctx, name)))
    }

    fn create(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: CreateRequest,
        reply: ReplyCreate,
    ) {
        self.remember_notifier(ctx);
        let r = (|| {
            check_name(name)?;
            let (node, opened) = self.node(parent)?.create(ctx, name, req)?;
            let entry = self.enter(ctx, node.clone())?;
            let held = self.held(entry.ino)?;
            Ok::<_, Errno>((entry, self.store_open(held, opened)))
        })();
        reply.answer(r.map(|(entry, open)| Created::new(entry, open)))
    }
}

/// Clears the set-ID bits `change` drops from the node of the open file
/// `f` (handle `fh`), through the node's getattr and setattr; whether it
/// changed the mode.
fn clear_setid(
    ctx: &RequestContext<'_>,
    change: Change,
    fh: FileHandle,
    f: &OpenEntry,
) -> Result<bool, Errno> {
    let node = &f.held.node;
    let cleared = setid::clear(
        ctx,
        change,
        Some(fh),
        || node.getattr(ctx),
        |r| node.setattr(ctx, r, Some(&*f.file)),
    )?;
    Ok(cleared.is_some())
}

enum Out<'r> {
    Plain(&'r mut ReplyDirectory),
    Plus(&'r mut ReplyDirectoryPlus),
}

/// Where [`Node::readdir`] puts a directory's entries.
pub struct DirFill<'r, 'c> {
    ctx: &'r RequestContext<'c>,
    fs: &'r NodeFs,
    out: Out<'r>,
    full: bool,
}

impl DirFill<'_, '_> {
    /// Adds `name` (leading to `node`) with cookie `next`: the `offset`
    /// the kernel passes back to continue the listing after this entry
    /// (1 to [`MAX_COOKIE`]; an entry with a cookie out of that range is
    /// left out, logged, rather than sent with a cookie another entry has).
    /// Its `d_ino` is the node's `st_ino`, as `stat` reports it. Says what
    /// it did, as [`ReplyDirectory::add`] does: [`DirAdd::Full`] means the
    /// entry is not in the reply and none after it will be (stop; the
    /// kernel asks again from the last entry it got), [`DirAdd::Skipped`]
    /// an entry left out (a name the kernel would reject, a cookie out of
    /// range, or a node whose attributes cannot be read: logged),
    /// [`DirAdd::Added`] an entry sent.
    pub fn add(&mut self, name: &[u8], next: u64, node: &NodeRef) -> DirAdd {
        if self.full {
            return DirAdd::Full;
        }
        let Some(next) = crate::layers::core::wire_cookie(next, name) else {
            return DirAdd::Skipped;
        };
        let added = match &mut self.out {
            Out::Plain(reply) => {
                let attr = match self.fs.attr_of(node, self.ctx) {
                    Ok(a) => a,
                    Err(e) => return unreadable(name, e),
                };
                reply.add(Inode(attr.ino), next, attr.kind, name)
            }
            Out::Plus(reply) => {
                let entry = match self.fs.enter(self.ctx, node.clone()) {
                    Ok(e) => e,
                    Err(e) => return unreadable(name, e),
                };
                let added = reply.add(&entry, next, name);
                if !added.counts_lookup() {
                    // Not sent, or not counted by the kernel: give it back.
                    self.fs.forget_one(entry.ino, 1);
                }
                match added {
                    DirPlusAdd::Added { .. } => DirAdd::Added,
                    DirPlusAdd::Full => DirAdd::Full,
                    DirPlusAdd::Skipped => DirAdd::Skipped,
                }
            }
        };
        self.full = added.is_full();
        added
    }

    /// Whether the reply is full.
    pub fn is_full(&self) -> bool {
        self.full
    }
}

/// Logs an entry [`DirFill::add`] leaves out because its node's
/// attributes could not be read.
fn unreadable(name: &[u8], e: Errno) -> DirAdd {
    log::warn!(
        "readdir: skipping {:?}, whose attributes could not be read ({e})",
        String::from_utf8_lossy(name)
    );
    DirAdd::Skipped
}

/// A directory's children, for nodes that keep them in memory: names in
/// creation order, with listing cookies (for [`Node::readdir`] and
/// [`DirFill::add`]) that stay valid while names come and go, so a listing
/// neither skips nor repeats a name because others were added or removed.
///
/// ```
/// use fuse_session::node::Children;
///
/// let mut c = Children::new();
/// c.insert(b"b".to_vec(), 2);
/// c.insert(b"a".to_vec(), 1);
/// let first: Vec<_> = c.after(0).map(|(cookie, name, _)| (cookie, name.to_vec())).collect();
/// assert_eq!(first, [(1, b"b".to_vec()), (2, b"a".to_vec())]);
/// c.remove(b"b"); // removed while listing: "a" keeps its cookie
/// assert_eq!(c.after(1).map(|(_, n, v)| (n.to_vec(), *v)).collect::<Vec<_>>(), [(b"a".to_vec(), 1)]);
/// ```
#[derive(Clone, Debug)]
pub struct Children<T> {
    names: std::collections::BTreeMap<Vec<u8>, (u64, T)>,
    order: std::collections::BTreeMap<u64, Vec<u8>>,
    next: u64,
}

impl<T> Default for Children<T> {
    fn default() -> Self {
        Children {
            names: Default::default(),
            order: Default::default(),
            next: 0,
        }
    }
}

impl<T> Children<T> {
    /// No children.
    pub fn new() -> Self {
        Self::default()
    }

    /// The child called `name`.
    pub fn get(&self, name: &[u8]) -> Option<&T> {
        self.names.get(name).map(|(_, c)| c)
    }

    /// Whether there is a child called `name`.
    pub fn contains(&self, name: &[u8]) -> bool {
        self.names.contains_key(name)
    }

    /// Adds (or replaces) `name`; it is listed after every other child.
    /// Returns the child it replaced.
    pub fn insert(&mut self, name: Vec<u8>, child: T) -> Option<T> {
        let old = self.remove(&name);
        self.next += 1;
        self.order.insert(self.next, name.clone());
        self.names.insert(name, (self.next, child));
        old
    }

    /// Removes `name`.
    pub fn remove(&mut self, name: &[u8]) -> Option<T> {
        let (cookie, child) = self.names.remove(name)?;
        self.order.remove(&cookie);
        Some(child)
    }

    /// How many children.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The children listed after cookie `offset` (0: all), each with its
    /// own cookie (to pass as [`DirFill::add`]'s `next`), name and value.
    pub fn after(&self, offset: u64) -> impl Iterator<Item = (u64, &[u8], &T)> {
        self.order
            .range(offset.saturating_add(1)..)
            .filter_map(|(&cookie, name)| self.names.get(name).map(|(_, c)| (cookie, name.as_slice(), c)))
    }
}

/// Drops the kernel's cached state of nodes; see the
/// [module documentation](self#invalidation). Clone freely.
///
/// Each call only queues a notification and returns; nodes the kernel does
/// not hold need none (`Ok` without sending). Errors: the session has not
/// served a request yet, or the kernel lacks the notification.
#[derive(Clone)]
pub struct Invalidator {
    shared: Arc<Shared>,
}

impl Invalidator {
    /// The node id the kernel knows `node` by, if it holds it.
    pub fn ino(&self, node: &NodeRef) -> Option<Inode> {
        match key_of(node) {
            k if k == self.shared.root => Some(Inode::ROOT),
            k => self.shared.table.find(&k),
        }
    }

    /// Drops `node`'s cached attributes and content (all of it).
    pub fn content(&self, node: &NodeRef) -> Result<(), crate::notify::NotifyError> {
        self.shared.notifier.inval_content(self.ino(node))
    }

    /// Drops the cached name `name` in directory `dir` (after a change the
    /// kernel did not make: the name now leads elsewhere, or nowhere).
    pub fn entry(&self, dir: &NodeRef, name: &[u8]) -> Result<(), crate::notify::NotifyError> {
        self.shared.notifier.inval_entry(self.ino(dir), name)
    }
}

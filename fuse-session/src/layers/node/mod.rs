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
//! # The folder
//!
//! This module holds the layer's type ([`NodeFs`]) with its tables (the
//! inode table of nodes, the open files), its options, constructors and
//! accessors; one file a concern beside it: the traits a tree implements and
//! what an open returns (`filesystem.rs`), the answers to the kernel request
//! by request (`adapter.rs`, the `Filesystem` impl), the node table's
//! bookkeeping (`tree.rs`: entries given and forgotten, open files stored),
//! directory filling (`dir_fill.rs`), the children of in-memory directories
//! (`children.rs`) and the invalidator (`invalidator.rs`). It uses the
//! layers' shared core (`layers::core`, `setid`, `values`) and what a
//! filesystem implements and receives (`api/`: the request context, replies,
//! the inode and handle tables); never the serving core (`serve/`) nor
//! `recovery/`.
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

mod adapter;
mod children;
mod dir_fill;
mod filesystem;
mod invalidator;
mod tree;

pub use children::Children;
pub use dir_fill::DirFill;
pub use filesystem::{Node, OpenFile, Opened};
pub use invalidator::Invalidator;

use crate::context::RequestContext;
use crate::inodes::{HandleTable, InodeTable, OpenModes};
use crate::layers::core::NotifierSlot;
use crate::types::Inode;
use fuse_proto::flags::InitFlags;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};

pub use crate::layers::core::MAX_COOKIE;
use std::time::Duration;

/// A node of the tree, shared by the tree and the library.
pub type NodeRef = Arc<dyn Node>;

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

/// Serves a tree of [`Node`]s as a [`Filesystem`](crate::Filesystem); see the
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
}

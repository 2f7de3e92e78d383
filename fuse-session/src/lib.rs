//! Mounting, the INIT handshake and a multi-threaded session loop over
//! `/dev/fuse`, dispatching to a pluggable [`Filesystem`].
//!
//! The path of one request: a worker's [`transport::RequestSource`] receives it
//! into the worker's buffer, `fuse_proto::Request::parse_with` reads it in
//! place, `dispatch` calls the [`Filesystem`] method with a typed reply
//! handle, and the handle's answer goes back in one `writev` on the channel
//! the request came from.
//!
//! # Quick start
//!
//! A read-only filesystem with one file. Implement the [`Filesystem`]
//! methods you need (the others have sensible defaults) and hand it to
//! [`serve`], which mounts it, serves until it is unmounted or the process
//! gets Ctrl-C (SIGINT), SIGTERM or SIGHUP, and unmounts.
//!
//! ```no_run
//! use fuse_session::reply::{ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry};
//! use fuse_session::{Entry, Errno, FileAttr, FileHandle, FileKind, Filesystem, Inode};
//! use fuse_session::{MountOptions, ReadRequest, RequestContext};
//! use std::{ffi::CStr, process::ExitCode, time::Duration};
//!
//! const TEXT: &[u8] = b"Hello, world!\n";
//! const FILE: Inode = Inode(2);
//! const TTL: Duration = Duration::from_secs(60);
//!
//! fn attr(ino: Inode) -> Option<FileAttr> {
//!     match ino {
//!         Inode::ROOT => Some(FileAttr::fixed(1, FileKind::Directory, 0o555)),
//!         FILE => Some(FileAttr::fixed(2, FileKind::RegularFile, 0o444).with_size(TEXT.len() as u64)),
//!         _ => None,
//!     }
//! }
//!
//! struct Hello;
//!
//! impl Filesystem for Hello {
//!     fn lookup(&self, _: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
//!         match (parent, name.to_bytes(), attr(FILE)) {
//!             (Inode::ROOT, b"hello", Some(a)) => reply.entry(&Entry::new(FILE, a, TTL)),
//!             _ => reply.error(Errno::ENOENT),
//!         }
//!     }
//!
//!     fn getattr(&self, _: &RequestContext<'_>, ino: Inode, _: Option<FileHandle>, reply: ReplyAttr) {
//!         reply.result(attr(ino).map(|a| (TTL, a)).ok_or(Errno::ENOENT));
//!     }
//!
//!     fn read(&self, _: &RequestContext<'_>, _: Inode, _: FileHandle, req: ReadRequest, reply: ReplyData) {
//!         let start = (req.offset as usize).min(TEXT.len());
//!         let end = start.saturating_add(req.size as usize).min(TEXT.len());
//!         reply.data(&TEXT[start..end]); // shorter than asked: end of file
//!     }
//!
//!     fn readdir(&self, _: &RequestContext<'_>, _: Inode, _: FileHandle, offset: u64, mut reply: ReplyDirectory) {
//!         let entries = [(Inode::ROOT, FileKind::Directory, "."), (Inode::ROOT, FileKind::Directory, ".."), (FILE, FileKind::RegularFile, "hello")];
//!         for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
//!             if reply.add(ino, i as u64 + 1, kind, name).is_full() {
//!                 break;
//!             }
//!         }
//!         reply.ok();
//!     }
//! }
//!
//! fn main() -> ExitCode {
//!     if let Err(e) = run() {
//!         eprintln!("hello: {e}"); // its Display text: "hello: mountpoint /mnt/hello does not exist"
//!         return ExitCode::FAILURE;
//!     }
//!     ExitCode::SUCCESS
//! }
//!
//! fn run() -> Result<(), Box<dyn std::error::Error>> {
//!     let opts = MountOptions { read_only: true, auto_unmount: true, ..MountOptions::default() };
//!     fuse_session::serve(Hello, "/mnt/hello", &opts)?;
//!     Ok(())
//! }
//! ```
//!
//! Things worth knowing before going further (each method's documentation
//! says more):
//! - Print errors with `{e}`, as `main` does above: their `Display` text
//!   says what is wrong and what to do about it. A `main` that returns the
//!   error prints its `Debug` form instead (`Error: Mount(MountpointMissing
//!   { path: … })`).
//! - The library logs through the [`log`](https://docs.rs/log) crate; install
//!   a logger (`env_logger::init()`) to see its messages, errors included.
//! - A file whose size is not known when `stat` asks (generated content)
//!   must be opened with `FopenFlags::DIRECT_IO`, or reads stop at the size
//!   in its attributes.
//! - Nodes in replies of LOOKUP, CREATE, MKDIR… are counted by the kernel
//!   (lookup counts) until FORGET; see [`filesystem`].
//! - [`spawn`] serves in the background; its handle unmounts when dropped.
//!   [`MountOptions::auto_unmount`] unmounts even if the process is killed.
//! - The raw kernel structs stay reachable: [`proto::abi`], and `*_raw`
//!   methods on the reply handles.
//! - A filesystem can be tested without mounting it (no root, no
//!   `/dev/fuse`): the `testing` feature serves it on a fake kernel and
//!   checks every reply against the protocol's rules (`docs/testing.md`).
#![deny(missing_docs)]

mod api;
pub mod layers;
pub mod mount;
mod recovery;
mod serve;
#[cfg(feature = "testing")]
pub mod testing;
mod wire;

// The modules keep the paths they had before they were grouped by concern
// (`fuse_session::reply`, `crate::conn`): users, examples and the rest of
// the crate name them here.
pub use api::{attr, backing, context, credentials, filesystem, init, inodes, notify, ops, reply, types};
pub use recovery::{fault, fdstore, handover, journal, keeper, kept_tree, region, service, vault};
use serve::{conn, dispatch, interrupt, pool, ring_worker, share, worker};
pub use serve::{deferred, session, stats, umask};
pub use wire::transport;
use wire::{buffer, payload, recv_pipe, signal, splice};

pub use attr::{FileAttr, FileKind, Statfs};
pub use backing::{BackingError, BackingFile};
pub use context::{MustFinish, RequestContext};
pub use credentials::{ActingAs, Caller, ProcCredentials};
pub use deferred::{RefuseReason, Refused, Wait};
pub use filesystem::{Filesystem, Recovery};
/// The kernel ABI crate, for the raw structs and flags.
pub use fuse_proto as proto;
pub use fuse_proto::Errno;
pub use fuse_proto::flags::{FopenFlags, InitFlags};
pub use init::{InitConfig, Negotiated};
pub use layers::{asyncfs, node, path};
pub use mount::{Mount, MountError, MountOptions};
pub use notify::Notifier;
pub use ops::{
    AccessMode, CopyFileRangeRequest, CreateRequest, FallocateRequest, IoctlRequest, LockRequest,
    LseekRequest, MknodRequest, OpenFlags, PollRequest, ReadRequest, ReleaseRequest, RenameFlags,
    RenameRequest, SetattrRequest, SetxattrRequest, StatxRequest, TimeOrNow, WriteData, WriteRequest,
};
pub use reply::{DirAdd, DirPlusAdd};
pub use serve::run::{serve, serve_with, spawn};
pub use session::{
    RunningSession, Session, SessionConfig, SessionError, SessionHandle, SessionReport, StartHook, StartStep,
};
pub use stats::HandlerPanic;
pub use stats::{OpStats, Stats, TransportStats};
pub use transport::{Transport, TransportInfo};
pub use types::{Entry, FileHandle, Inode, Lock, LockOwner, PollHandle};

//! fuse-wire: the Linux FUSE wire protocol, spoken on `/dev/fuse` directly,
//! without libfuse.
//!
//! This facade re-exports the user-facing API of [`session`] at its root
//! (the [`Filesystem`] trait, typed attributes and requests, reply handles
//! in [`reply`], [`serve`] and [`spawn`]), and the two crates of the
//! workspace: [`proto`] (the kernel ABI, no I/O) and [`session`] (mounting
//! and the multi-threaded session loop).
//!
//! # Quick start
//!
//! A read-only filesystem with one file. Implement the [`Filesystem`]
//! methods you need (the others have sensible defaults) and hand it to
//! [`serve`], which mounts it, serves until it is unmounted or the process
//! gets Ctrl-C (SIGINT), SIGTERM or SIGHUP, and unmounts.
//!
//! ```no_run
//! use fuse_wire::reply::{ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry};
//! use fuse_wire::{Entry, Errno, FileAttr, FileHandle, FileKind, Filesystem, Inode};
//! use fuse_wire::{MountOptions, ReadRequest, RequestContext};
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
//!     fuse_wire::serve(Hello, "/mnt/hello", &opts)?;
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
//!   (lookup counts) until FORGET; see [`session::filesystem`].
//! - [`spawn`] serves in the background; its handle unmounts when dropped.
//!   [`MountOptions::auto_unmount`] unmounts even if the process is killed.
//! - The raw kernel structs stay reachable: [`proto::abi`], and `*_raw`
//!   methods on the reply handles.
//! - A filesystem can be tested without mounting it (no root, no
//!   `/dev/fuse`): the `testing` feature serves it on a fake kernel and
//!   checks every reply against the protocol's rules (`docs/testing.md`).
#![forbid(unsafe_code)]

/// The README's code, compiled as a doctest so that it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The test kit's guide, compiled and run as a doctest: its first example
/// is a test file a user can paste into their own crate.
#[doc = include_str!("../docs/testing.md")]
#[cfg(doctest)]
pub struct TestingDoctests;

// Both crates are modules here, their items inlined, rather than re-exported
// crates: `cargo doc --no-deps -p fuse-wire` and docs.rs then render every
// page the facade's documentation links to (`session::filesystem`,
// `session::WriteData`...) under `fuse_wire`, and the paths are the same.

pub mod proto {
    //! The kernel ABI without I/O (the `fuse-proto` crate): the
    //! `#[repr(C)]` structs of `include/uapi/linux/fuse.h` in [`abi`], the
    //! opcode table in [`opcode`], the flags in [`flags`], zero-copy parsing
    //! of requests in [`request`] and encoding of replies in [`reply`].
    //!
    //! A filesystem served through [`serve`](crate::serve) rarely needs it
    //! beyond the flag types; it is there for the raw structs and for
    //! speaking the protocol without the session loop.
    #[doc(inline)]
    pub use fuse_proto::*;
}

pub mod session {
    //! Mounting, the INIT handshake and the multi-threaded session loop
    //! (the `fuse-session` crate). Its user-facing items are also at the
    //! crate root; its modules hold the details they refer to:
    //!
    //! - [`filesystem`]: the [`Filesystem`] trait, with what the kernel sends
    //!   when, lookup counts, caching and the defaults of every method;
    //! - [`reply`]: the typed reply handles; [`ops`]: the typed requests,
    //!   [`WriteData`] among them;
    //! - [`init`]: what INIT negotiates ([`init::DEFAULT_WANTED`]);
    //! - [`mount`]: mounting and [`MountOptions`]; [`session`](mod@session):
    //!   [`Session`] and [`SessionConfig`]; [`transport`]: `/dev/fuse` and
    //!   FUSE-over-io_uring;
    //! - [`node`] and [`path`]: the layers that keep node ids for you;
    //! - [`asyncfs`]: async filesystems, whose futures INTERRUPT cancels;
    //! - [`notify`], [`stats`], [`credentials`], [`backing`]: notifications,
    //!   statistics, acting as the caller, kernel passthrough.
    pub use crate::proto;
    #[doc(inline)]
    pub use fuse_session::*;
}

pub use fuse_session::{
    AccessMode, CopyFileRangeRequest, CreateRequest, DirAdd, DirPlusAdd, Entry, Errno, FallocateRequest,
    FileAttr, FileHandle, FileKind, Filesystem, FopenFlags, InitConfig, InitFlags, Inode, IoctlRequest, Lock,
    LockOwner, LockRequest, LseekRequest, MknodRequest, MountOptions, MustFinish, OpenFlags, PollHandle,
    PollRequest, ReadRequest, Recovery, ReleaseRequest, RenameFlags, RenameRequest, RequestContext,
    RunningSession, Session, SessionConfig, SessionError, SessionReport, SetattrRequest, SetxattrRequest,
    Statfs, StatxRequest, TimeOrNow, WriteRequest, reply, serve, serve_with, spawn,
};
pub use fuse_session::{asyncfs, inodes, node, path};

/// The test kit (the `testing` feature): a filesystem served on an
/// in-process fake kernel, typed requests as any caller, and the protocol
/// checker. See `docs/testing.md`.
#[cfg(feature = "testing")]
#[doc(inline)]
pub use fuse_session::testing;

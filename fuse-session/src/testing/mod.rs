//! A test kit for filesystem authors (the `testing` feature): serve a
//! [`Filesystem`](crate::Filesystem), or a filesystem of the node or path
//! layer, on an in-process fake kernel (no root, no mount, no `/dev/fuse`),
//! send it typed requests as the kernel would, as any caller, and get
//! typed replies back, while a [`Checker`] watches every request and reply
//! for what breaks the protocol's rules.
//!
//! - [`TestKernel`]: the session on the fake kernel, INIT at the
//!   [`Setup`]'s minor and capabilities, one method per request
//!   ([`TestKernel::lookup`], [`TestKernel::list_dir`]…), raw requests
//!   with [`TestKernel::send`], INTERRUPT, FORGET, and
//!   [`TestKernel::finish`], which forgets what the kernel holds, ends the
//!   session and reports every [`Violation`];
//! - [`Checker`] and its [`Rule`]s, also usable on its own on the bytes of
//!   another server's conversation;
//! - [`battery`]: POSIX scenarios with their expected results, run
//!   through a [`TestKernel`], races of two threads among them; what the
//!   filesystem does not implement, or refuses by design
//!   ([`battery::Battery::refuses`]), is reported as unsupported, not as
//!   a failure.
//! - [`explorer`]: random request sequences, deterministic from a seed,
//!   compared with a model of POSIX, a difference shrunk and printed as a
//!   test to paste.
//!
//! Nothing hides a failure: the battery's differences and a handler's
//! panic are violations too, [`Report`] is `#[must_use]` and prints as
//! the readable report under `unwrap()`.
//!
//! `docs/testing.md` teaches it, and lists each rule with the kernel
//! behaviour it protects.
//!
//! ```
//! # extern crate fuse_session as fuse_wire; // these docs are fuse_wire::testing's
//! use fuse_wire::node::{DirFill, Node, NodeFs, NodeRef};
//! use fuse_wire::testing::TestKernel;
//! use fuse_wire::{Errno, FileAttr, FileKind, Inode, RequestContext};
//! use std::ffi::CStr;
//! use std::sync::Arc;
//!
//! /// An empty read-only directory.
//! struct Empty;
//!
//! impl Node for Empty {
//!     fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
//!         Ok(FileAttr::fixed(0, FileKind::Directory, 0o555))
//!     }
//!     fn lookup(&self, _: &RequestContext<'_>, _: &CStr) -> Result<NodeRef, Errno> {
//!         Err(Errno::ENOENT)
//!     }
//!     fn readdir(&self, _: &RequestContext<'_>, _: u64, _: &mut DirFill<'_, '_>) -> Result<(), Errno> {
//!         Ok(()) // the layer lists "." and ".." itself
//!     }
//! }
//!
//! let k = TestKernel::start(NodeFs::new(Arc::new(Empty))).unwrap();
//! assert_eq!(k.lookup(Inode::ROOT, "missing").unwrap_err(), Errno::ENOENT);
//! let names: Vec<String> = k.list_dir(Inode::ROOT, 4096).unwrap().iter().map(|e| e.name_lossy()).collect();
//! assert_eq!(names, [".", ".."]);
//! k.finish().unwrap(); // no protocol violation
//! ```

pub mod battery;
mod checker;
pub mod explorer;
mod kernel;
mod ops;
mod wire;

pub use checker::{Answer, Checker, Rule, Violation};
pub use kernel::{
    CheckerGuard, DEFAULT_TIMEOUT, KERNEL_OFFERS, KitError, LookupCounts, Pending, Report, Setup, TestKernel,
};
pub use ops::MAX_LISTING_CALLS;
pub use wire::{Caller, DirEntry, DirEntryPlus, ReplyBody, Xattr, decode_dir, decode_dir_plus};

//! The layers above the raw [`Filesystem`](crate::Filesystem) trait: each
//! implements it for a filesystem written in another shape, and answers the
//! kernel for it.
//!
//! - [`node`]: a tree of objects ([`node::Node`]), the library keeping node
//!   ids, lookup counts and open files;
//! - [`path`]: methods on paths ([`path::PathFilesystem`]), the library
//!   keeping the paths;
//! - [`asyncfs`]: `async` methods returning their answers
//!   ([`asyncfs::AsyncFilesystem`]), run on an executor, cancelled by
//!   INTERRUPT.
//!
//! They share one adapter core (`core`): the answers they give as values
//! ([`Open`](asyncfs::Open), directory entries, xattr values, results on
//! open files) turned into replies in one place, the checks of names and
//! handles the kernel sends, and the notifier their invalidators use.
//! The node and path layers also clear set-ID bits for the filesystems
//! they serve (`setid`), which lets the session give their `O_DIRECT` opens
//! parallel direct writes.
//! `docs/layers.md` compares them.

pub mod asyncfs;
pub(crate) mod core;
pub mod node;
pub mod path;
pub(crate) mod setid;
pub mod values;

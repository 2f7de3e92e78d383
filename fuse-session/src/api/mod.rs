//! What a filesystem implements and receives: the [`Filesystem`](crate::Filesystem)
//! trait, the typed operations and their reply handles, the request context
//! and the caller's credentials, attributes and typed values, notifications,
//! backing files, the inode table of the layers, and what INIT negotiated.
//!
//! May use: `wire/` and `mount/`. The reply handles and the request context
//! also reach into the serving core they belong to (`serve/`: the worker a
//! request came from, its interrupt slot, deferred replies) and the request
//! side of recovery (the journal, fault points); those arrows up are named
//! in `scripts/layers.rules`, each with its reason.

pub mod attr;
pub mod backing;
pub mod context;
pub mod credentials;
pub mod filesystem;
pub mod init;
pub mod inodes;
pub mod notify;
pub mod ops;
pub mod reply;
pub mod types;

//! Keeping a mount across the daemon's crash or upgrade: the keeper process,
//! systemd's file-descriptor store and a service built on it, handing a
//! connection over, the vault of deposited descriptors, shared memory that
//! outlives the daemon, the journal of requests in flight, and fault
//! injection to prove that a crash at any point loses nothing.
//!
//! May use: every folder below it (`serve/`, `api/`, `mount/`, `wire/`).
//! The journal and the fault points are also used from below, by the
//! dispatch path and the reply handles (named in `scripts/layers.rules`).

pub mod fault;
pub mod fdstore;
pub mod handover;
pub mod journal;
pub mod keeper;
pub mod kept_tree;
pub mod region;
pub mod service;
pub mod vault;

//! Helpers for the differential security suite (`tests/security.rs`): a
//! scratch tmpfs holding the plain directory and the daemon's source, the
//! `passthrough_ll` daemon started directly or in its own pid namespace (and
//! stopped, with its connection aborted through fusectl when it is stuck),
//! callers with unusual credentials, and the runner that mounts one
//! configuration once, runs every check on the plain directory and through
//! the mount, and reports each step that differs.
//!
//! Use with `mod common; mod posix_support; mod security_support;`.
#![allow(dead_code)]

pub mod callers;
pub mod daemon;
pub mod ops;
pub mod suite;

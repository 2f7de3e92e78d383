//! The Linux FUSE kernel ABI at protocol 7.45 (Linux 6.18), without I/O.
//!
//! - [`abi`]: every `#[repr(C)]` struct of `include/uapi/linux/fuse.h`, as
//!   zerocopy types with their C names and checked layouts;
//! - [`opcode`]: the one opcode table;
//! - [`flags`]: bit flags per field, notification codes;
//! - [`consts`]: versions, limits, device ioctl numbers;
//! - [`errno`]: [`Errno`], every Linux error number by name;
//! - [`version`]: sizes that depend on the negotiated minor (7.12 … 7.45);
//! - [`request`]: zero-copy parsing of what the kernel sends;
//! - [`reply`]: encoding of replies and notifications into iovec-ready parts,
//!   directory record packing;
//! - [`ext`]: opt-in extensions outside the upstream ABI (atomic open).
//!
//! The crate is `no_std`; the `alloc` feature adds conveniences that allocate,
//! `std` (default) implements `std::error::Error` for the error types.
#![no_std]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

pub mod abi;
pub mod consts;
pub mod errno;
pub mod ext;
pub mod flags;
pub mod opcode;
pub mod reply;
pub mod request;
pub mod version;

pub use errno::Errno;
pub use opcode::{Opcode, UnknownOpcode};
pub use reply::{DirentWriter, Reply};
pub use request::{Operation, ParseConfig, ParseError, Request};

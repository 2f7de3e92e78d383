//! Why a buffer is not a valid request: [`ParseError`], naming the opcode
//! and what was expected.

use crate::opcode::Opcode;

/// Why a buffer is not a valid request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Fewer bytes than a `fuse_in_header`.
    #[error("request of {got} bytes is shorter than the 40-byte fuse_in_header")]
    ShortHeader {
        /// Bytes received.
        got: usize,
    },
    /// `fuse_in_header.len` disagrees with the number of bytes received.
    #[error("fuse_in_header.len says {header_len} bytes but {buffer_len} were received")]
    LengthMismatch {
        /// The header's `len`.
        header_len: u32,
        /// Bytes received.
        buffer_len: usize,
    },
    /// The opcode is not in the table.
    #[error("unknown opcode {opcode} (unique {unique})")]
    UnknownOpcode {
        /// The number received.
        opcode: u32,
        /// The request's unique, to answer ENOSYS.
        unique: u64,
    },
    /// The body is shorter than the opcode's argument struct.
    #[error("{opcode}: body of {got} bytes is shorter than the {expected} bytes of {what}")]
    ShortBody {
        /// The opcode.
        opcode: Opcode,
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        expected: usize,
        /// Bytes available.
        got: usize,
    },
    /// A name argument has no terminating NUL inside the body.
    #[error("{opcode}: {what} is not NUL-terminated within the request")]
    MissingNul {
        /// The opcode.
        opcode: Opcode,
        /// Which name.
        what: &'static str,
    },
    /// A payload's declared size disagrees with the bytes present.
    #[error("{opcode}: {what} declares {declared} bytes but {got} follow")]
    PayloadMismatch {
        /// The opcode.
        opcode: Opcode,
        /// Which payload.
        what: &'static str,
        /// The size the argument struct declares.
        declared: u64,
        /// Bytes present.
        got: usize,
    },
    /// `total_extlen` points past the end of the request.
    #[error("total_extlen of {extlen_bytes} bytes exceeds the {available} bytes after the header")]
    ExtensionOutOfBounds {
        /// `total_extlen * 8`.
        extlen_bytes: usize,
        /// Bytes after the header.
        available: usize,
    },
    /// A request delivered in two parts (FUSE over io_uring) whose first part
    /// (`op_in`) is not exactly the opcode's first argument.
    #[error("{opcode}: the first-argument area holds {got} bytes but the opcode takes {expected} there")]
    FirstArgMismatch {
        /// The opcode.
        opcode: Opcode,
        /// Bytes of the first argument the opcode reads.
        expected: usize,
        /// Bytes the kernel put there.
        got: usize,
    },
    /// An extension record is malformed.
    #[error("malformed request extension at byte {offset}: {reason}")]
    BadExtension {
        /// Offset within the extension area.
        offset: usize,
        /// What is wrong.
        reason: &'static str,
    },
}

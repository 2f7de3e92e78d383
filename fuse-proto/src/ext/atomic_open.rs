//! Atomic lookup+open: the out-of-tree extension of the DDN patch series
//! (Dharmendra Singh 2022, Bernd Schubert 2023), never merged upstream.
//!
//! # Wire (last revision, v10, October 2023)
//! The kernel sends opcode [`OPCODE`] (53) from `->atomic_open()` for a
//! dentry it has not looked up, with `nodeid` = the parent directory. The body
//! is byte for byte that of CREATE: `fuse_create_in` + name + NUL (+ the
//! creation extensions when `O_CREAT`). The reply is that of CREATE:
//! `fuse_entry_out` + `fuse_open_out`, with [`FOPEN_FILE_CREATED`] in
//! `open_flags` when the file was created by this call. A reply of ENOSYS
//! makes that kernel fall back for good to LOOKUP then OPEN/CREATE.
//!
//! # Collisions
//! Every number the series ever used was later given to an upstream feature:
//!
//! | revision | number | now upstream |
//! |---|---|---|
//! | v1, v2 | opcode 51 [`V1_OPCODE_ATOMIC_OPEN`], INIT bit 34 [`V1_INIT_DO_ATOMIC_OPEN`] | TMPFILE (7.37), CREATE_SUPP_GROUP (7.38) |
//! | v3–v5 | opcode 51 [`V3_OPCODE_CREATE_EXT`], opcode 52 [`V3_OPCODE_ATOMIC_OPEN`], FOPEN bit 6 [`V3_FOPEN_FILE_CREATED`] | TMPFILE, STATX (7.39), PARALLEL_DIRECT_WRITES (7.38) |
//! | v6–v9 | opcode 52 [`V6_OPCODE_OPEN_ATOMIC`], FOPEN bit 7 | STATX, PASSTHROUGH (7.40) |
//! | v10 | opcode 53 [`OPCODE`], FOPEN bit 7 [`FOPEN_FILE_CREATED`] | COPY_FILE_RANGE_64 (7.45), PASSTHROUGH |
//!
//! Hence the parser decodes opcode 53 as atomic open only when the session
//! explicitly enabled it (`ParseConfig::atomic_open`) **and** the negotiated
//! minor is below 45; otherwise 53 is COPY_FILE_RANGE_64. A kernel carrying the
//! v10 patches negotiates at most 7.39-era minors, so the rule is safe.
//! Because [`FOPEN_FILE_CREATED`] equals `FOPEN_PASSTHROUGH`, a session with
//! atomic open enabled must not use passthrough; the session layer refuses that
//! combination.

/// Opcode of `FUSE_OPEN_ATOMIC` in v10.
pub const OPCODE: u32 = 53;
/// `FOPEN_FILE_CREATED` in v6–v10: the reply's open flag saying the file was created.
pub const FOPEN_FILE_CREATED: u32 = 1 << 7;
/// v1/v2 `FUSE_ATOMIC_OPEN` opcode.
pub const V1_OPCODE_ATOMIC_OPEN: u32 = 51;
/// v1/v2 INIT flag `FUSE_DO_ATOMIC_OPEN` (`1 << 34`).
pub const V1_INIT_DO_ATOMIC_OPEN: u64 = 1 << 34;
/// v3–v5 `FUSE_CREATE_EXT` / `FUSE_ATOMIC_CREATE` opcode.
pub const V3_OPCODE_CREATE_EXT: u32 = 51;
/// v3–v5 `FUSE_ATOMIC_OPEN` opcode.
pub const V3_OPCODE_ATOMIC_OPEN: u32 = 52;
/// v3–v5 `FOPEN_FILE_CREATED` (`1 << 6`).
pub const V3_FOPEN_FILE_CREATED: u32 = 1 << 6;
/// v6–v9 `FUSE_OPEN_ATOMIC` opcode.
pub const V6_OPCODE_OPEN_ATOMIC: u32 = 52;

/// The highest negotiated minor with which opcode 53 may mean atomic open.
pub const MAX_MINOR: u32 = 44;

/// Whether a session with these settings decodes opcode 53 as atomic open.
pub const fn decodes(enabled: bool, minor: u32) -> bool {
    enabled && minor <= MAX_MINOR
}

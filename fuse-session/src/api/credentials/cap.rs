//! Capability numbers (from `linux/capability.h`) that filesystems check.

/// Change file owners and groups.
pub const CHOWN: u32 = 0;
/// Bypass read, write and search permission checks.
pub const DAC_OVERRIDE: u32 = 1;
/// Bypass read permission on files and read/search on directories.
pub const DAC_READ_SEARCH: u32 = 2;
/// Bypass checks that need the caller to own the file.
pub const FOWNER: u32 = 3;
/// Keep set-ID bits when writing or changing the owner.
pub const FSETID: u32 = 4;
/// Change the filesystem uid (`setfsuid`).
pub const SETUID: u32 = 7;
/// Change the filesystem gid and the groups.
pub const SETGID: u32 = 6;
/// Set the immutable and append-only flags.
pub const LINUX_IMMUTABLE: u32 = 9;
/// Administrative operations (`trusted.*` attributes among them).
pub const SYS_ADMIN: u32 = 21;
/// Override resource limits and reserved space.
pub const SYS_RESOURCE: u32 = 24;
/// Create device nodes.
pub const MKNOD: u32 = 27;

//! Protocol minors and the sizes that depend on them.
//!
//! The kernel shrinks some structs for old minors (`fuse_adjust_compat()` and
//! friends); both the parser and the encoder ask here which size applies.
//! Everything is a function of the negotiated minor of major 7.

use crate::abi;
use core::mem::size_of;

/// `FUSE_COMPAT_ENTRY_OUT_SIZE`: `fuse_entry_out` before 7.9.
pub const COMPAT_ENTRY_OUT_SIZE: usize = 120;
/// `FUSE_COMPAT_ATTR_OUT_SIZE`: `fuse_attr_out` before 7.9.
pub const COMPAT_ATTR_OUT_SIZE: usize = 96;
/// `FUSE_COMPAT_MKNOD_IN_SIZE`: `fuse_mknod_in` before 7.12.
pub const COMPAT_MKNOD_IN_SIZE: usize = 8;
/// `FUSE_COMPAT_WRITE_IN_SIZE`: `fuse_write_in` before 7.9.
pub const COMPAT_WRITE_IN_SIZE: usize = 24;
/// `FUSE_COMPAT_STATFS_SIZE`: `fuse_statfs_out` before 7.4.
pub const COMPAT_STATFS_SIZE: usize = 48;
/// `FUSE_COMPAT_SETXATTR_IN_SIZE`: `fuse_setxattr_in` without SETXATTR_EXT.
pub const COMPAT_SETXATTR_IN_SIZE: usize = 8;
/// `FUSE_COMPAT_INIT_OUT_SIZE`: `fuse_init_out` before 7.5.
pub const COMPAT_INIT_OUT_SIZE: usize = 8;
/// `FUSE_COMPAT_22_INIT_OUT_SIZE`: `fuse_init_out` before 7.23.
pub const COMPAT_22_INIT_OUT_SIZE: usize = 24;
/// `fuse_init_in` before 7.36 (no `flags2`, no reserved words).
pub const COMPAT_INIT_IN_SIZE: usize = 16;
/// `fuse_create_in` before 7.12: the kernel sent a `fuse_open_in`.
pub const COMPAT_CREATE_IN_SIZE: usize = 8;

/// Bytes of `fuse_entry_out` the kernel expects at `minor`.
pub const fn entry_out_size(minor: u32) -> usize {
    if minor < 9 {
        COMPAT_ENTRY_OUT_SIZE
    } else {
        size_of::<abi::EntryOut>()
    }
}

/// Bytes of `fuse_attr_out` the kernel expects at `minor`.
pub const fn attr_out_size(minor: u32) -> usize {
    if minor < 9 {
        COMPAT_ATTR_OUT_SIZE
    } else {
        size_of::<abi::AttrOut>()
    }
}

/// Bytes of `fuse_statfs_out` the kernel expects at `minor`.
pub const fn statfs_out_size(minor: u32) -> usize {
    if minor < 4 {
        COMPAT_STATFS_SIZE
    } else {
        size_of::<abi::StatfsOut>()
    }
}

/// Bytes of `fuse_init_out` to send to a kernel of `minor`.
pub const fn init_out_size(minor: u32) -> usize {
    if minor < 5 {
        COMPAT_INIT_OUT_SIZE
    } else if minor < 23 {
        COMPAT_22_INIT_OUT_SIZE
    } else {
        size_of::<abi::InitOut>()
    }
}

/// Bytes of `fuse_init_in` a kernel of `minor` sends.
pub const fn init_in_size(minor: u32) -> usize {
    if minor < 36 {
        COMPAT_INIT_IN_SIZE
    } else {
        size_of::<abi::InitIn>()
    }
}

/// Bytes of `fuse_write_in` before the data at `minor`.
pub const fn write_in_size(minor: u32) -> usize {
    if minor < 9 {
        COMPAT_WRITE_IN_SIZE
    } else {
        size_of::<abi::WriteIn>()
    }
}

/// Bytes of `fuse_mknod_in` at `minor`.
pub const fn mknod_in_size(minor: u32) -> usize {
    if minor < 12 {
        COMPAT_MKNOD_IN_SIZE
    } else {
        size_of::<abi::MknodIn>()
    }
}

/// Bytes of `fuse_create_in` at `minor`.
pub const fn create_in_size(minor: u32) -> usize {
    if minor < 12 {
        COMPAT_CREATE_IN_SIZE
    } else {
        size_of::<abi::CreateIn>()
    }
}

/// Bytes of `fuse_setxattr_in`, depending on whether SETXATTR_EXT was negotiated.
pub const fn setxattr_in_size(setxattr_ext: bool) -> usize {
    if setxattr_ext {
        size_of::<abi::SetxattrIn>()
    } else {
        COMPAT_SETXATTR_IN_SIZE
    }
}

/// Whether GETATTR carries a `fuse_getattr_in` (since 7.9).
pub const fn getattr_has_body(minor: u32) -> bool {
    minor >= 9
}

/// Whether `fuse_in_header.total_extlen` is meaningful (since 7.38).
pub const fn has_request_extensions(minor: u32) -> bool {
    minor >= 38
}

/// Whether an open reply's `FOPEN_PARALLEL_DIRECT_WRITES` means anything
/// (since 7.38, Linux 6.2; older kernels ignore the bit).
pub const fn has_parallel_direct_writes(minor: u32) -> bool {
    minor >= 38
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compat_sizes_by_minor() {
        assert_eq!(entry_out_size(8), 120);
        assert_eq!(entry_out_size(9), 128);
        assert_eq!(attr_out_size(8), 96);
        assert_eq!(attr_out_size(45), 104);
        assert_eq!(init_out_size(4), 8);
        assert_eq!(init_out_size(22), 24);
        assert_eq!(init_out_size(23), 64);
        assert_eq!(init_in_size(35), 16);
        assert_eq!(init_in_size(36), 64);
        assert_eq!(write_in_size(8), 24);
        assert_eq!(write_in_size(12), 40);
        assert_eq!(mknod_in_size(11), 8);
        assert_eq!(mknod_in_size(12), 16);
        assert_eq!(statfs_out_size(3), 48);
        assert_eq!(setxattr_in_size(false), 8);
        assert_eq!(setxattr_in_size(true), 16);
    }
}

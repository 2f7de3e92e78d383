//! virtio-fs DAX mappings and SYNCFS.
//!
//! Layouts of `include/uapi/linux/fuse.h` at protocol 7.45; each type names its C struct.

#[allow(unused_imports)]
use super::*;

abi_struct! {
    /// Body of SETUPMAPPING (virtio-fs DAX).
    "fuse_setupmapping_in" SetupmappingIn = 40 {
        fh: u64 = "fh",
        foffset: u64 = "foffset",
        len: u64 = "len",
        flags: u64 = "flags",
        moffset: u64 = "moffset",
    }
}

abi_struct! {
    /// Body of REMOVEMAPPING, followed by `count` `fuse_removemapping_one`.
    "fuse_removemapping_in" RemovemappingIn = 4 {
        count: u32 = "count",
    }
}

abi_struct! {
    /// One range of a REMOVEMAPPING.
    "fuse_removemapping_one" RemovemappingOne = 16 {
        moffset: u64 = "moffset",
        len: u64 = "len",
    }
}

abi_struct! {
    /// Body of SYNCFS.
    "fuse_syncfs_in" SyncfsIn = 8 {
        padding: u64 = "padding",
    }
}

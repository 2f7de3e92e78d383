//! Directory entries and name operations: LOOKUP replies, FORGET, MKNOD, MKDIR, RENAME, LINK.
//!
//! Layouts of `include/uapi/linux/fuse.h` at protocol 7.45; each type names its C struct.

#[allow(unused_imports)]
use super::*;

abi_struct! {
    /// Reply to LOOKUP, MKNOD, MKDIR, SYMLINK, LINK, and first part of CREATE.
    "fuse_entry_out" EntryOut = 128 {
        nodeid: u64 = "nodeid",
        generation: u64 = "generation",
        entry_valid: u64 = "entry_valid",
        attr_valid: u64 = "attr_valid",
        entry_valid_nsec: u32 = "entry_valid_nsec",
        attr_valid_nsec: u32 = "attr_valid_nsec",
        attr: Attr = "attr",
    }
}

abi_struct! {
    /// Body of FORGET.
    "fuse_forget_in" ForgetIn = 8 {
        nlookup: u64 = "nlookup",
    }
}

abi_struct! {
    /// One inode of a BATCH_FORGET.
    "fuse_forget_one" ForgetOne = 16 {
        nodeid: u64 = "nodeid",
        nlookup: u64 = "nlookup",
    }
}

abi_struct! {
    /// Body of BATCH_FORGET, followed by `count` `fuse_forget_one`.
    "fuse_batch_forget_in" BatchForgetIn = 8 {
        count: u32 = "count",
        dummy: u32 = "dummy",
    }
}

abi_struct! {
    /// Body of MKNOD (16 bytes since 7.12, 8 before).
    "fuse_mknod_in" MknodIn = 16 {
        mode: u32 = "mode",
        rdev: u32 = "rdev",
        umask: u32 = "umask",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Body of MKDIR.
    "fuse_mkdir_in" MkdirIn = 8 {
        mode: u32 = "mode",
        umask: u32 = "umask",
    }
}

abi_struct! {
    /// Body of RENAME.
    "fuse_rename_in" RenameIn = 8 {
        newdir: u64 = "newdir",
    }
}

abi_struct! {
    /// Body of RENAME2 (since 7.23).
    "fuse_rename2_in" Rename2In = 16 {
        newdir: u64 = "newdir",
        flags: u32 = "flags",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Body of LINK.
    "fuse_link_in" LinkIn = 8 {
        oldnodeid: u64 = "oldnodeid",
    }
}

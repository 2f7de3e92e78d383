//! Opening and closing: OPEN, CREATE, RELEASE, FLUSH.
//!
//! Layouts of `include/uapi/linux/fuse.h` at protocol 7.45; each type names its C struct.

#[allow(unused_imports)]
use super::*;

abi_struct! {
    /// Body of OPEN and OPENDIR.
    "fuse_open_in" OpenIn = 8 {
        flags: u32 = "flags",
        open_flags: u32 = "open_flags",
    }
}

abi_struct! {
    /// Body of CREATE and TMPFILE.
    "fuse_create_in" CreateIn = 16 {
        flags: u32 = "flags",
        mode: u32 = "mode",
        umask: u32 = "umask",
        open_flags: u32 = "open_flags",
    }
}

abi_struct! {
    /// Reply to OPEN, OPENDIR, and second part of CREATE.
    "fuse_open_out" OpenOut = 16 {
        fh: u64 = "fh",
        open_flags: u32 = "open_flags",
        backing_id: i32 = "backing_id",
    }
}

abi_struct! {
    /// Body of RELEASE and RELEASEDIR.
    "fuse_release_in" ReleaseIn = 24 {
        fh: u64 = "fh",
        flags: u32 = "flags",
        release_flags: u32 = "release_flags",
        lock_owner: u64 = "lock_owner",
    }
}

abi_struct! {
    /// Body of FLUSH.
    "fuse_flush_in" FlushIn = 24 {
        fh: u64 = "fh",
        unused: u32 = "unused",
        padding: u32 = "padding",
        lock_owner: u64 = "lock_owner",
    }
}

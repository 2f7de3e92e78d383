//! POSIX and BSD locks: GETLK, SETLK, SETLKW.
//!
//! Layouts of `include/uapi/linux/fuse.h` at protocol 7.45; each type names its C struct.

#[allow(unused_imports)]
use super::*;

abi_struct! {
    /// A byte-range lock.
    "fuse_file_lock" FileLock = 24 {
        start: u64 = "start",
        end: u64 = "end",
        r#type: u32 = "type",
        pid: u32 = "pid",
    }
}

abi_struct! {
    /// Body of GETLK, SETLK and SETLKW.
    "fuse_lk_in" LkIn = 48 {
        fh: u64 = "fh",
        owner: u64 = "owner",
        lk: FileLock = "lk",
        lk_flags: u32 = "lk_flags",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Reply to GETLK.
    "fuse_lk_out" LkOut = 24 {
        lk: FileLock = "lk",
    }
}

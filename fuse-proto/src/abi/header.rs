//! Request and reply headers, and the INTERRUPT request body.
//!
//! Layouts of `include/uapi/linux/fuse.h` at protocol 7.45; each type names its C struct.

#[allow(unused_imports)]
use super::*;

abi_struct! {
    /// Header of every request the kernel sends.
    "fuse_in_header" InHeader = 40 {
        len: u32 = "len",
        opcode: u32 = "opcode",
        unique: u64 = "unique",
        nodeid: u64 = "nodeid",
        uid: u32 = "uid",
        gid: u32 = "gid",
        pid: u32 = "pid",
        total_extlen: u16 = "total_extlen",
        padding: u16 = "padding",
    }
}

abi_struct! {
    /// Header of every reply and notification written to the kernel.
    "fuse_out_header" OutHeader = 16 {
        len: u32 = "len",
        error: i32 = "error",
        unique: u64 = "unique",
    }
}

abi_struct! {
    /// Body of INTERRUPT: the unique of the request to interrupt.
    "fuse_interrupt_in" InterruptIn = 8 {
        unique: u64 = "unique",
    }
}

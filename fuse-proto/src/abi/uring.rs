//! FUSE over io_uring: ring entry header and the command of REGISTER / COMMIT_AND_FETCH (since 7.42).
//!
//! Layouts of `include/uapi/linux/fuse.h` at protocol 7.45; each type names its C struct.

#[allow(unused_imports)]
use super::*;

abi_struct! {
    /// Per-entry in/out data of an io_uring ring entry.
    "fuse_uring_ent_in_out" UringEntInOut = 32 {
        flags: u64 = "flags",
        commit_id: u64 = "commit_id",
        payload_sz: u32 = "payload_sz",
        padding: u32 = "padding",
        reserved: u64 = "reserved",
    }
}

abi_struct! {
    /// Header buffer of an io_uring ring entry.
    "fuse_uring_req_header" UringReqHeader = 288 {
        in_out: [u8; 128] = "in_out",
        op_in: [u8; 128] = "op_in",
        ring_ent_in_out: UringEntInOut = "ring_ent_in_out",
    }
}

abi_struct! {
    /// Command payload in the SQE of REGISTER and COMMIT_AND_FETCH.
    "fuse_uring_cmd_req" UringCmdReq = 24 {
        flags: u64 = "flags",
        commit_id: u64 = "commit_id",
        qid: u16 = "qid",
        padding: [u8; 6] = "padding",
    }
}

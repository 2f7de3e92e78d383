//! The INIT handshake (FUSE and CUSE).
//!
//! Layouts of `include/uapi/linux/fuse.h` at protocol 7.45; each type names its C struct.

#[allow(unused_imports)]
use super::*;

abi_struct! {
    /// Body of INIT (64 bytes since 7.36, 16 before).
    "fuse_init_in" InitIn = 64 {
        major: u32 = "major",
        minor: u32 = "minor",
        max_readahead: u32 = "max_readahead",
        flags: u32 = "flags",
        flags2: u32 = "flags2",
        unused: [u32; 11] = "unused",
    }
}

abi_struct! {
    /// Reply to INIT (shorter for old minors).
    "fuse_init_out" InitOut = 64 {
        major: u32 = "major",
        minor: u32 = "minor",
        max_readahead: u32 = "max_readahead",
        flags: u32 = "flags",
        max_background: u16 = "max_background",
        congestion_threshold: u16 = "congestion_threshold",
        max_write: u32 = "max_write",
        time_gran: u32 = "time_gran",
        max_pages: u16 = "max_pages",
        map_alignment: u16 = "map_alignment",
        flags2: u32 = "flags2",
        max_stack_depth: u32 = "max_stack_depth",
        request_timeout: u16 = "request_timeout",
        unused: [u16; 11] = "unused",
    }
}

abi_struct! {
    /// Body of CUSE_INIT.
    "cuse_init_in" CuseInitIn = 16 {
        major: u32 = "major",
        minor: u32 = "minor",
        unused: u32 = "unused",
        flags: u32 = "flags",
    }
}

abi_struct! {
    /// Reply to CUSE_INIT, followed by the device info strings.
    "cuse_init_out" CuseInitOut = 72 {
        major: u32 = "major",
        minor: u32 = "minor",
        unused: u32 = "unused",
        flags: u32 = "flags",
        max_read: u32 = "max_read",
        max_write: u32 = "max_write",
        dev_major: u32 = "dev_major",
        dev_minor: u32 = "dev_minor",
        spare: [u32; 10] = "spare",
    }
}

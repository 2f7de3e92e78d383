//! File data: READ, WRITE, FSYNC, FALLOCATE, LSEEK, COPY_FILE_RANGE, BMAP.
//!
//! Layouts of `include/uapi/linux/fuse.h` at protocol 7.45; each type names its C struct.

#[allow(unused_imports)]
use super::*;

abi_struct! {
    /// Body of READ, READDIR and READDIRPLUS.
    "fuse_read_in" ReadIn = 40 {
        fh: u64 = "fh",
        offset: u64 = "offset",
        size: u32 = "size",
        read_flags: u32 = "read_flags",
        lock_owner: u64 = "lock_owner",
        flags: u32 = "flags",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Body of WRITE, followed by the data (40 bytes since 7.9, 24 before).
    "fuse_write_in" WriteIn = 40 {
        fh: u64 = "fh",
        offset: u64 = "offset",
        size: u32 = "size",
        write_flags: u32 = "write_flags",
        lock_owner: u64 = "lock_owner",
        flags: u32 = "flags",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Reply to WRITE and COPY_FILE_RANGE.
    "fuse_write_out" WriteOut = 8 {
        size: u32 = "size",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Body of FSYNC and FSYNCDIR.
    "fuse_fsync_in" FsyncIn = 16 {
        fh: u64 = "fh",
        fsync_flags: u32 = "fsync_flags",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Body of FALLOCATE.
    "fuse_fallocate_in" FallocateIn = 32 {
        fh: u64 = "fh",
        offset: u64 = "offset",
        length: u64 = "length",
        mode: u32 = "mode",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Body of LSEEK.
    "fuse_lseek_in" LseekIn = 24 {
        fh: u64 = "fh",
        offset: u64 = "offset",
        whence: u32 = "whence",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Reply to LSEEK.
    "fuse_lseek_out" LseekOut = 8 {
        offset: u64 = "offset",
    }
}

abi_struct! {
    /// Body of COPY_FILE_RANGE and COPY_FILE_RANGE_64.
    "fuse_copy_file_range_in" CopyFileRangeIn = 56 {
        fh_in: u64 = "fh_in",
        off_in: u64 = "off_in",
        nodeid_out: u64 = "nodeid_out",
        fh_out: u64 = "fh_out",
        off_out: u64 = "off_out",
        len: u64 = "len",
        flags: u64 = "flags",
    }
}

abi_struct! {
    /// Reply to COPY_FILE_RANGE_64 (since 7.45).
    "fuse_copy_file_range_out" CopyFileRangeOut = 8 {
        bytes_copied: u64 = "bytes_copied",
    }
}

abi_struct! {
    /// Body of BMAP.
    "fuse_bmap_in" BmapIn = 16 {
        block: u64 = "block",
        blocksize: u32 = "blocksize",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Reply to BMAP.
    "fuse_bmap_out" BmapOut = 8 {
        block: u64 = "block",
    }
}

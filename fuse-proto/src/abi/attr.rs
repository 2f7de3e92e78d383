//! Attributes: GETATTR, SETATTR, STATX, STATFS and ACCESS.
//!
//! Layouts of `include/uapi/linux/fuse.h` at protocol 7.45; each type names its C struct.

#[allow(unused_imports)]
use super::*;

abi_struct! {
    /// Inode attributes as the kernel caches them.
    "fuse_attr" Attr = 88 {
        ino: u64 = "ino",
        size: u64 = "size",
        blocks: u64 = "blocks",
        atime: u64 = "atime",
        mtime: u64 = "mtime",
        ctime: u64 = "ctime",
        atimensec: u32 = "atimensec",
        mtimensec: u32 = "mtimensec",
        ctimensec: u32 = "ctimensec",
        mode: u32 = "mode",
        nlink: u32 = "nlink",
        uid: u32 = "uid",
        gid: u32 = "gid",
        rdev: u32 = "rdev",
        blksize: u32 = "blksize",
        flags: u32 = "flags",
    }
}

abi_struct! {
    /// Reply to GETATTR and SETATTR.
    "fuse_attr_out" AttrOut = 104 {
        attr_valid: u64 = "attr_valid",
        attr_valid_nsec: u32 = "attr_valid_nsec",
        dummy: u32 = "dummy",
        attr: Attr = "attr",
    }
}

abi_struct! {
    /// Body of GETATTR (since 7.9).
    "fuse_getattr_in" GetattrIn = 16 {
        getattr_flags: u32 = "getattr_flags",
        dummy: u32 = "dummy",
        fh: u64 = "fh",
    }
}

abi_struct! {
    /// Body of SETATTR; `valid` says which fields to apply.
    "fuse_setattr_in" SetattrIn = 88 {
        valid: u32 = "valid",
        padding: u32 = "padding",
        fh: u64 = "fh",
        size: u64 = "size",
        lock_owner: u64 = "lock_owner",
        atime: u64 = "atime",
        mtime: u64 = "mtime",
        ctime: u64 = "ctime",
        atimensec: u32 = "atimensec",
        mtimensec: u32 = "mtimensec",
        ctimensec: u32 = "ctimensec",
        mode: u32 = "mode",
        unused4: u32 = "unused4",
        uid: u32 = "uid",
        gid: u32 = "gid",
        unused5: u32 = "unused5",
    }
}

abi_struct! {
    /// A timestamp inside `fuse_statx`.
    "fuse_sx_time" SxTime = 16 {
        tv_sec: i64 = "tv_sec",
        tv_nsec: u32 = "tv_nsec",
        reserved: i32 = "__reserved",
    }
}

abi_struct! {
    /// Extended attributes in the layout of `struct statx`.
    "fuse_statx" Statx = 256 {
        mask: u32 = "mask",
        blksize: u32 = "blksize",
        attributes: u64 = "attributes",
        nlink: u32 = "nlink",
        uid: u32 = "uid",
        gid: u32 = "gid",
        mode: u16 = "mode",
        spare0: [u16; 1] = "__spare0",
        ino: u64 = "ino",
        size: u64 = "size",
        blocks: u64 = "blocks",
        attributes_mask: u64 = "attributes_mask",
        atime: SxTime = "atime",
        btime: SxTime = "btime",
        ctime: SxTime = "ctime",
        mtime: SxTime = "mtime",
        rdev_major: u32 = "rdev_major",
        rdev_minor: u32 = "rdev_minor",
        dev_major: u32 = "dev_major",
        dev_minor: u32 = "dev_minor",
        spare2: [u64; 14] = "__spare2",
    }
}

abi_struct! {
    /// Body of STATX (since 7.39).
    "fuse_statx_in" StatxIn = 24 {
        getattr_flags: u32 = "getattr_flags",
        reserved: u32 = "reserved",
        fh: u64 = "fh",
        sx_flags: u32 = "sx_flags",
        sx_mask: u32 = "sx_mask",
    }
}

abi_struct! {
    /// Reply to STATX.
    "fuse_statx_out" StatxOut = 288 {
        attr_valid: u64 = "attr_valid",
        attr_valid_nsec: u32 = "attr_valid_nsec",
        flags: u32 = "flags",
        spare: [u64; 2] = "spare",
        stat: Statx = "stat",
    }
}

abi_struct! {
    /// Filesystem statistics.
    "fuse_kstatfs" Kstatfs = 80 {
        blocks: u64 = "blocks",
        bfree: u64 = "bfree",
        bavail: u64 = "bavail",
        files: u64 = "files",
        ffree: u64 = "ffree",
        bsize: u32 = "bsize",
        namelen: u32 = "namelen",
        frsize: u32 = "frsize",
        padding: u32 = "padding",
        spare: [u32; 6] = "spare",
    }
}

abi_struct! {
    /// Reply to STATFS.
    "fuse_statfs_out" StatfsOut = 80 {
        st: Kstatfs = "st",
    }
}

abi_struct! {
    /// Body of ACCESS.
    "fuse_access_in" AccessIn = 8 {
        mask: u32 = "mask",
        padding: u32 = "padding",
    }
}

//! IOCTL and POLL bodies, and the backing-file map of the passthrough device ioctls.
//!
//! Layouts of `include/uapi/linux/fuse.h` at protocol 7.45; each type names its C struct.

#[allow(unused_imports)]
use super::*;

abi_struct! {
    /// Body of IOCTL, followed by the input data.
    "fuse_ioctl_in" IoctlIn = 32 {
        fh: u64 = "fh",
        flags: u32 = "flags",
        cmd: u32 = "cmd",
        arg: u64 = "arg",
        in_size: u32 = "in_size",
        out_size: u32 = "out_size",
    }
}

abi_struct! {
    /// One iovec of an unrestricted IOCTL retry.
    "fuse_ioctl_iovec" IoctlIovec = 16 {
        base: u64 = "base",
        len: u64 = "len",
    }
}

abi_struct! {
    /// Reply to IOCTL, followed by output data or iovecs.
    "fuse_ioctl_out" IoctlOut = 16 {
        result: i32 = "result",
        flags: u32 = "flags",
        in_iovs: u32 = "in_iovs",
        out_iovs: u32 = "out_iovs",
    }
}

abi_struct! {
    /// Body of POLL.
    "fuse_poll_in" PollIn = 24 {
        fh: u64 = "fh",
        kh: u64 = "kh",
        flags: u32 = "flags",
        events: u32 = "events",
    }
}

abi_struct! {
    /// Reply to POLL.
    "fuse_poll_out" PollOut = 8 {
        revents: u32 = "revents",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Argument of the FUSE_DEV_IOC_BACKING_OPEN ioctl (since 7.40).
    "fuse_backing_map" BackingMap = 16 {
        fd: i32 = "fd",
        flags: u32 = "flags",
        padding: u64 = "padding",
    }
}

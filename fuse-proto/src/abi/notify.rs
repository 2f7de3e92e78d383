//! Notifications from the filesystem to the kernel, and the NOTIFY_REPLY body.
//!
//! Layouts of `include/uapi/linux/fuse.h` at protocol 7.45; each type names its C struct.

#[allow(unused_imports)]
use super::*;

abi_struct! {
    /// Notification POLL: wake the pollers of a kernel handle.
    "fuse_notify_poll_wakeup_out" NotifyPollWakeupOut = 8 {
        kh: u64 = "kh",
    }
}

abi_struct! {
    /// Notification INVAL_INODE.
    "fuse_notify_inval_inode_out" NotifyInvalInodeOut = 24 {
        ino: u64 = "ino",
        off: i64 = "off",
        len: i64 = "len",
    }
}

abi_struct! {
    /// Notification INVAL_ENTRY, followed by the name and a NUL.
    "fuse_notify_inval_entry_out" NotifyInvalEntryOut = 16 {
        parent: u64 = "parent",
        namelen: u32 = "namelen",
        flags: u32 = "flags",
    }
}

abi_struct! {
    /// Notification DELETE, followed by the name and a NUL.
    "fuse_notify_delete_out" NotifyDeleteOut = 24 {
        parent: u64 = "parent",
        child: u64 = "child",
        namelen: u32 = "namelen",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Notification STORE, followed by the data.
    "fuse_notify_store_out" NotifyStoreOut = 24 {
        nodeid: u64 = "nodeid",
        offset: u64 = "offset",
        size: u32 = "size",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Notification RETRIEVE.
    "fuse_notify_retrieve_out" NotifyRetrieveOut = 32 {
        notify_unique: u64 = "notify_unique",
        nodeid: u64 = "nodeid",
        offset: u64 = "offset",
        size: u32 = "size",
        padding: u32 = "padding",
    }
}

abi_struct! {
    /// Body of NOTIFY_REPLY, the kernel's answer to RETRIEVE, followed by the data.
    "fuse_notify_retrieve_in" NotifyRetrieveIn = 40 {
        dummy1: u64 = "dummy1",
        offset: u64 = "offset",
        size: u32 = "size",
        dummy2: u32 = "dummy2",
        dummy3: u64 = "dummy3",
        dummy4: u64 = "dummy4",
    }
}

abi_struct! {
    /// Notification PRUNE, followed by `count` node ids (since 7.45).
    "fuse_notify_prune_out" NotifyPruneOut = 16 {
        count: u32 = "count",
        padding: u32 = "padding",
        spare: u64 = "spare",
    }
}

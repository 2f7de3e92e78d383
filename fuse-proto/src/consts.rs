//! Protocol constants: versions, limits, special ids and the `/dev/fuse` ioctl numbers.

/// `FUSE_KERNEL_VERSION`: the protocol major.
pub const KERNEL_VERSION: u32 = 7;
/// `FUSE_KERNEL_MINOR_VERSION`: the newest minor this crate speaks.
pub const KERNEL_MINOR_VERSION: u32 = 45;
/// The oldest minor this crate negotiates.
pub const MIN_MINOR_VERSION: u32 = 12;
/// `FUSE_ROOT_ID`: the node id of the root directory.
pub const ROOT_ID: u64 = 1;
/// `FUSE_MIN_READ_BUFFER`: the smallest buffer a device read may use.
pub const MIN_READ_BUFFER: usize = 8192;
/// `FUSE_IOCTL_MAX_IOV`: most iovecs in an unrestricted ioctl retry.
pub const IOCTL_MAX_IOV: usize = 256;
/// `CUSE_INIT_INFO_MAX`: most bytes of CUSE device info.
pub const CUSE_INIT_INFO_MAX: usize = 4096;
/// `FUSE_UNIQUE_RESEND`: set in `unique` of a request the kernel re-sent after NOTIFY_RESEND.
pub const UNIQUE_RESEND: u64 = 1 << 63;
/// Bit 0 of `unique` marks an INTERRUPT request (`FUSE_INT_REQ_BIT`, kernel-internal).
pub const INT_REQ_BIT: u64 = 1;
/// `FUSE_INVALID_UIDGID`: uid or gid without a mapping in an idmapped mount.
pub const INVALID_UIDGID: u32 = u32::MAX;
/// `FUSE_MAX_NR_SECCTX`: extension types 0..=31 are security contexts.
pub const MAX_NR_SECCTX: u32 = 31;
/// `FUSE_EXT_GROUPS`: the supplementary-groups extension type.
pub const EXT_GROUPS: u32 = 32;
/// `FUSE_NAME_OFFSET`: where the name starts in a `fuse_dirent`.
pub const NAME_OFFSET: usize = 24;
/// `FUSE_NAME_OFFSET_DIRENTPLUS`: where the name starts in a `fuse_direntplus`.
pub const NAME_OFFSET_DIRENTPLUS: usize = 152;
/// The kernel's longest name when `max_pages` is 1 (`FUSE_NAME_LOW_MAX`).
pub const NAME_LOW_MAX: usize = 1024;
/// `FUSE_URING_IN_OUT_HEADER_SZ`.
pub const URING_IN_OUT_HEADER_SZ: usize = 128;
/// `FUSE_URING_OP_IN_OUT_SZ`.
pub const URING_OP_IN_OUT_SZ: usize = 128;
/// Largest errno the kernel accepts in a reply (errors must lie in `(-512, 0]`).
pub const MAX_ERRNO: i32 = 511;

/// `enum fuse_uring_cmd`: the `cmd_op` of an io_uring SQE.
pub mod uring_cmd {
    /// `FUSE_IO_URING_CMD_INVALID`.
    pub const INVALID: u32 = 0;
    /// `FUSE_IO_URING_CMD_REGISTER`: register a ring entry's buffers.
    pub const REGISTER: u32 = 1;
    /// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: commit a reply, fetch the next request.
    pub const COMMIT_AND_FETCH: u32 = 2;
}

/// The `/dev/fuse` ioctls (`FUSE_DEV_IOC_MAGIC` = 229), with their numbers as
/// `_IOR`/`_IOW`/`_IO` compute them on Linux.
pub mod dev_ioc {
    /// `FUSE_DEV_IOC_MAGIC`.
    pub const MAGIC: u8 = 229;
    /// `FUSE_DEV_IOC_CLONE` = `_IOR(229, 0, uint32_t)`: bind a new fd to a session.
    pub const CLONE: u32 = 0x8004_E500;
    /// `FUSE_DEV_IOC_BACKING_OPEN` = `_IOW(229, 1, struct fuse_backing_map)`.
    pub const BACKING_OPEN: u32 = 0x4010_E501;
    /// `FUSE_DEV_IOC_BACKING_CLOSE` = `_IOW(229, 2, uint32_t)`.
    pub const BACKING_CLOSE: u32 = 0x4004_E502;
    /// `FUSE_DEV_IOC_SYNC_INIT` = `_IO(229, 3)` (Linux 6.18, no minor bump).
    pub const SYNC_INIT: u32 = 0x0000_E503;

    const fn ioc(dir: u32, nr: u32, size: u32) -> u32 {
        (dir << 30) | (size << 16) | ((MAGIC as u32) << 8) | nr
    }
    const _: () = assert!(CLONE == ioc(2, 0, 4));
    const _: () = assert!(BACKING_OPEN == ioc(1, 1, 16));
    const _: () = assert!(BACKING_CLOSE == ioc(1, 2, 4));
    const _: () = assert!(SYNC_INIT == ioc(0, 3, 0));
}

//! Kernel passthrough backing files (`FUSE_DEV_IOC_BACKING_OPEN`/`CLOSE`).
//!
//! A [`BackingFile`] is a refcounted backing id: clone it for every open
//! file that uses the same backing file; the id is closed in the kernel when
//! the last clone is dropped. Files whose open completed keep working, but an
//! open whose reply named the id is only complete once the kernel has looked
//! the id up, after the reply was written: hold a clone until that file's
//! RELEASE (for example in the inode, as long as it has open files).

use crate::transport::ReplySink;
use fuse_proto::abi::BackingMap;
use fuse_proto::consts::dev_ioc;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;

/// Why a backing file could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum BackingError {
    /// PASSTHROUGH was not negotiated.
    #[error(
        "kernel passthrough is not enabled on this session (negotiate PASSTHROUGH with max_stack_depth 1 or 2 \
         and without the writeback cache)"
    )]
    NotNegotiated,
    /// The transport has no device fd.
    #[error("this transport has no /dev/fuse fd to register backing files on")]
    NoDevice,
    /// The kernel refused with EPERM.
    #[error("registering a backing file needs CAP_SYS_ADMIN in the initial user namespace")]
    NeedsCapSysAdmin,
    /// The kernel refused with ELOOP.
    #[error(
        "the backing file's filesystem is stacked too deep for this session's max_stack_depth \
         (use 2 for files on overlayfs or another FUSE passthrough filesystem)"
    )]
    StackTooDeep,
    /// The kernel refused with EOPNOTSUPP.
    #[error("the kernel was built without CONFIG_FUSE_PASSTHROUGH")]
    NotSupported,
    /// Not a regular file (EINVAL / EISDIR).
    #[error("only regular files can back a passthrough open ({0})")]
    NotRegular(std::io::Error),
    /// Any other error.
    #[error("FUSE_DEV_IOC_BACKING_OPEN failed: {0}")]
    Other(std::io::Error),
}

struct Inner {
    id: i32,
    chan: Arc<dyn ReplySink>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let Some(fd) = self.chan.raw_fd() else { return };
        let id: u32 = self.id as u32;
        // Closing needs CAP_SYS_ADMIN, which a thread acting as a caller
        // has put down.
        let _as_daemon = crate::credentials::as_daemon();
        // SAFETY: BACKING_CLOSE reads one u32 through the pointer, which points
        // at a live local; `fd` belongs to the channel we hold a reference to.
        let r = unsafe { libc::ioctl(fd, dev_ioc::BACKING_CLOSE as libc::Ioctl, &id as *const u32) };
        if r < 0 {
            log::warn!(
                "closing backing id {}: {}",
                self.id,
                std::io::Error::last_os_error()
            );
        }
    }
}

/// A registered backing file (refcounted backing id).
#[derive(Clone)]
pub struct BackingFile(Arc<Inner>);

impl std::fmt::Debug for BackingFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BackingFile").field(&self.0.id).finish()
    }
}

impl BackingFile {
    pub(crate) fn open(chan: &Arc<dyn ReplySink>, file: BorrowedFd<'_>) -> Result<Self, BackingError> {
        let fd = chan.raw_fd().ok_or(BackingError::NoDevice)?;
        let map = BackingMap {
            fd: file.as_raw_fd(),
            flags: 0,
            padding: 0,
        };
        // The kernel keeps this thread's credentials for the backing file
        // and runs every passed-through write with them: registered with
        // credentials under which a write clears set-ID bits as a write by
        // an unprivileged caller does (the daemon never sees those writes
        // to clear them itself).
        let r = crate::credentials::as_backing_registrar(|| {
            // SAFETY: BACKING_OPEN reads a 16-byte fuse_backing_map through the
            // pointer, which points at a live, initialised local of that type.
            let r = unsafe {
                libc::ioctl(
                    fd,
                    dev_ioc::BACKING_OPEN as libc::Ioctl,
                    &map as *const BackingMap,
                )
            };
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(r)
            }
        })
        .and_then(|r| r);
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                return Err(match e.raw_os_error() {
                    Some(libc::EPERM) => BackingError::NeedsCapSysAdmin,
                    Some(libc::ELOOP) => BackingError::StackTooDeep,
                    Some(libc::EOPNOTSUPP) => BackingError::NotSupported,
                    Some(libc::EINVAL | libc::EISDIR) => BackingError::NotRegular(e),
                    _ => BackingError::Other(e),
                });
            }
        };
        Ok(BackingFile(Arc::new(Inner {
            id: r,
            chan: chan.clone(),
        })))
    }

    /// The kernel's backing id.
    pub fn id(&self) -> i32 {
        self.0.id
    }
}

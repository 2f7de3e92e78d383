//! The answers about an open file's contents and state: WRITE, locks,
//! BMAP, IOCTL, POLL, LSEEK and COPY_FILE_RANGE.

use super::{ReplyBmap, ReplyCopy, ReplyIoctl, ReplyLock, ReplyLseek, ReplyPoll, ReplyWrite};
use crate::types::Lock;
use fuse_proto::abi::{BmapOut, CopyFileRangeOut, IoctlOut, LkOut, LseekOut, PollOut, WriteOut};
use fuse_proto::flags::IoctlFlags;
use fuse_proto::{Errno, Opcode, Reply};

impl ReplyWrite {
    /// The count written or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<u32, E>) {
        match r {
            Ok(n) => self.written(n),
            Err(e) => self.error(e),
        }
    }

    /// `size` bytes were written.
    pub fn written(self, size: u32) {
        let u = self.core.unique;
        self.core
            .send(&Reply::with_struct(u, &WriteOut { size, padding: 0 }));
    }
}

impl ReplyLock {
    /// The lock or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<Lock, E>) {
        match r {
            Ok(l) => self.lock(l),
            Err(e) => self.error(e),
        }
    }

    /// The conflicting lock, or one of type `F_UNLCK` if none.
    pub fn lock(self, lock: Lock) {
        let u = self.core.unique;
        self.core.send(&Reply::with_struct(u, &LkOut { lk: lock.into() }));
    }
}

impl ReplyBmap {
    /// The device block.
    pub fn block(self, block: u64) {
        let u = self.core.unique;
        self.core.send(&Reply::with_struct(u, &BmapOut { block }));
    }
}

impl ReplyIoctl {
    /// The ioctl's result and output data.
    pub fn ioctl(self, result: i32, data: &[u8]) {
        let out = IoctlOut {
            result,
            flags: 0,
            in_iovs: 0,
            out_iovs: 0,
        };
        match Reply::ioctl(self.core.unique, &out, data) {
            Ok(r) => self.core.send(&r),
            Err(_) => self.core.error(Errno::EIO),
        }
    }

    /// Ask the kernel to retry an unrestricted ioctl with these iovecs
    /// (`fuse_ioctl_iovec` arrays: input then output).
    pub fn retry(self, in_iovs: &[fuse_proto::abi::IoctlIovec], out_iovs: &[fuse_proto::abi::IoctlIovec]) {
        use zerocopy::IntoBytes;
        let out = IoctlOut {
            result: 0,
            flags: IoctlFlags::RETRY.bits(),
            in_iovs: in_iovs.len() as u32,
            out_iovs: out_iovs.len() as u32,
        };
        let mut iovs = Vec::with_capacity(in_iovs.len() + out_iovs.len());
        iovs.extend_from_slice(in_iovs);
        iovs.extend_from_slice(out_iovs);
        match Reply::ioctl(self.core.unique, &out, iovs.as_bytes()) {
            Ok(r) => self.core.send(&r),
            Err(_) => self.core.error(Errno::EIO),
        }
    }
}

impl ReplyPoll {
    /// The ready events.
    pub fn revents(self, revents: u32) {
        let u = self.core.unique;
        self.core
            .send(&Reply::with_struct(u, &PollOut { revents, padding: 0 }));
    }
}

impl ReplyLseek {
    /// The offset or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<u64, E>) {
        match r {
            Ok(o) => self.offset(o),
            Err(e) => self.error(e),
        }
    }

    /// The resulting offset.
    pub fn offset(self, offset: u64) {
        let u = self.core.unique;
        self.core.send(&Reply::with_struct(u, &LseekOut { offset }));
    }
}

impl ReplyCopy {
    /// The count copied or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<u64, E>) {
        match r {
            Ok(n) => self.copied(n),
            Err(e) => self.error(e),
        }
    }

    /// `copied` bytes were copied. COPY_FILE_RANGE can only report 32 bits,
    /// so larger counts are reported as `u32::MAX` rounded down to a page
    /// (the caller sees a short copy and continues).
    pub fn copied(self, copied: u64) {
        let u = self.core.unique;
        if self.core.opcode == Opcode::CopyFileRange64 {
            self.core
                .send(&Reply::with_struct(u, &CopyFileRangeOut { bytes_copied: copied }));
        } else {
            let size = u32::try_from(copied).unwrap_or(!4095);
            self.core
                .send(&Reply::with_struct(u, &WriteOut { size, padding: 0 }));
        }
    }
}

//! Open files and directories: the handle table and directory streams.
//!
//! A handle owns the descriptor of one OPEN/OPENDIR/CREATE. Handles live in
//! a sharded map keyed by the file handle number the kernel echoes back, so
//! reads and writes on different files never meet on a lock, and reads and
//! writes on the same file share nothing but the shard's brief lookup (the
//! I/O itself is positional: `pread`/`pwrite`, no per-file lock).

use crate::inodes::InodeData;
use crate::sys;
use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

const SHARDS: usize = 64;

type Shard = HashMap<u64, Arc<Handle>>;

/// One open file or directory.
pub struct Handle {
    pub fd: OwnedFd,
    pub inode: Arc<InodeData>,
    /// Counted in the inode's passthrough opens (released on drop).
    pub passthrough: bool,
    /// The directory stream (directories only; created on first READDIR).
    pub dir: Mutex<Option<DirStream>>,
}

impl Handle {
    pub fn new(fd: OwnedFd, inode: Arc<InodeData>, passthrough: bool) -> Self {
        Self {
            fd,
            inode,
            passthrough,
            dir: Mutex::new(None),
        }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn dir(&self) -> MutexGuard<'_, Option<DirStream>> {
        self.dir.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if self.passthrough {
            let mut pt = self.inode.passthrough();
            pt.opens = pt.opens.saturating_sub(1);
            if pt.opens == 0 {
                // Closes the backing id in the kernel (files still open keep working).
                pt.backing = None;
            }
        }
    }
}

/// Sharded map from file handle to [`Handle`].
pub struct HandleTable {
    shards: Box<[Mutex<Shard>]>,
    next: AtomicU64,
}

impl HandleTable {
    pub fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            next: AtomicU64::new(1),
        }
    }

    fn shard(&self, fh: u64) -> MutexGuard<'_, Shard> {
        self.shards[(fh % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub fn insert(&self, h: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.shard(fh).insert(fh, Arc::new(h));
        fh
    }

    pub fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        self.shard(fh).get(&fh).cloned()
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        self.shard(fh).remove(&fh)
    }

    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }
}

/// One record of `getdents64`.
pub struct DirRecord<'a> {
    pub ino: u64,
    /// Cookie of the position after this record (telldir value).
    pub next: i64,
    pub typ: u8,
    /// The name with its NUL.
    pub name: &'a CStr,
    len: usize,
}

/// A directory stream over `getdents64`, positioned by the kernel's
/// cookies (the `d_off` values): a READDIR at another offset seeks first.
pub struct DirStream {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Cookie of the next unread record (0: the beginning).
    pos: i64,
    eof: bool,
}

impl DirStream {
    pub fn new() -> Self {
        Self {
            buf: vec![0; 32 * 1024],
            start: 0,
            end: 0,
            pos: 0,
            eof: false,
        }
    }

    /// Moves to cookie `offset` unless already there.
    pub fn seek(&mut self, fd: BorrowedFd<'_>, offset: i64) -> io::Result<()> {
        if offset == self.pos {
            return Ok(());
        }
        sys::lseek(fd, offset, libc::SEEK_SET)?;
        self.start = 0;
        self.end = 0;
        self.pos = offset;
        self.eof = false;
        Ok(())
    }

    /// The next record without consuming it; `None` at the end.
    pub fn peek(&mut self, fd: BorrowedFd<'_>) -> io::Result<Option<DirRecord<'_>>> {
        if self.start >= self.end {
            if self.eof {
                return Ok(None);
            }
            let n = sys::getdents64(fd, &mut self.buf)?;
            if n == 0 {
                self.eof = true;
                return Ok(None);
            }
            self.start = 0;
            self.end = n;
        }
        parse_record(&self.buf[self.start..self.end])
            .map(Some)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))
    }

    /// Consumes the record [`DirStream::peek`] returned (its length and cookie).
    pub fn advance(&mut self, len: usize, next: i64) {
        self.start += len;
        self.pos = next;
    }
}

impl DirRecord<'_> {
    pub fn len(&self) -> usize {
        self.len
    }
}

/// Parses one `struct linux_dirent64` at the start of `b`: d_ino (u64),
/// d_off (i64), d_reclen (u16), d_type (u8), then the NUL-terminated name.
fn parse_record(b: &[u8]) -> Option<DirRecord<'_>> {
    const NAME: usize = 19;
    if b.len() < NAME + 1 {
        return None;
    }
    let ino = u64::from_ne_bytes(b[0..8].try_into().ok()?);
    let next = i64::from_ne_bytes(b[8..16].try_into().ok()?);
    let reclen = u16::from_ne_bytes(b[16..18].try_into().ok()?) as usize;
    if reclen < NAME + 1 || reclen > b.len() {
        return None;
    }
    let typ = b[18];
    let name = CStr::from_bytes_until_nul(&b[NAME..reclen]).ok()?;
    Some(DirRecord {
        ino,
        next,
        typ,
        name,
        len: reclen,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirent_records_parse_and_reject_garbage() {
        let mut rec = vec![0u8; 24];
        rec[0..8].copy_from_slice(&7u64.to_ne_bytes());
        rec[8..16].copy_from_slice(&99i64.to_ne_bytes());
        rec[16..18].copy_from_slice(&24u16.to_ne_bytes());
        rec[18] = libc::DT_REG;
        rec[19..22].copy_from_slice(b"abc");
        let r = parse_record(&rec).unwrap();
        assert_eq!((r.ino, r.next, r.typ, r.len()), (7, 99, libc::DT_REG, 24));
        assert_eq!(r.name.to_bytes(), b"abc");
        rec[16..18].copy_from_slice(&200u16.to_ne_bytes());
        assert!(parse_record(&rec).is_none());
        assert!(parse_record(&rec[..10]).is_none());
    }
}

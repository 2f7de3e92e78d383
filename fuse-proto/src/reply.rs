//! Reply and notification encoding into iovec-ready parts, and directory
//! record packing.
//!
//! A [`Reply`] is the `fuse_out_header` plus the fixed out structs, kept inline
//! (at most 304 bytes, copied from the caller's structs and cut to the size the
//! negotiated minor expects), followed by up to two borrowed payload slices
//! (read data, xattr value, a name and its NUL). [`Reply::parts`] yields them
//! for one `writev`; payload bytes are never concatenated or copied here.
//! Error codes are checked against the range the kernel accepts.

use crate::abi::*;
use crate::flags::{InvalEntryFlags, NotifyCode};
use crate::version;
use core::mem::size_of;
use zerocopy::{Immutable, IntoBytes};

/// Why a reply could not be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The errno is outside `1..=511`, which the kernel would reject.
    #[error("errno {0} is outside 1..=511, the range the kernel accepts")]
    InvalidErrno(i32),
    /// The message would exceed `u32::MAX` bytes.
    #[error("reply of {0} bytes does not fit the 32-bit length field")]
    TooLong(usize),
    /// A name is empty, contains `/` or NUL, or is too long.
    #[error("invalid name: {0}")]
    InvalidName(&'static str),
}

pub use crate::errno::Errno;

const HEAD_MAX: usize = size_of::<OutHeader>() + size_of::<StatxOut>();
static NUL: [u8; 1] = [0];

/// One message to the kernel: header and fixed structs inline, payload borrowed.
#[derive(Clone)]
pub struct Reply<'a> {
    head: [u8; HEAD_MAX],
    head_len: usize,
    payload: [&'a [u8]; 2],
}

impl core::fmt::Debug for Reply<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Reply")
            .field("header", &self.header())
            .field("len", &self.len())
            .finish()
    }
}

impl<'a> Reply<'a> {
    fn build(unique: u64, error: i32, fixed: &[&[u8]], payload: [&'a [u8]; 2]) -> Result<Self, EncodeError> {
        let mut head = [0u8; HEAD_MAX];
        let mut at = size_of::<OutHeader>();
        for part in fixed {
            head[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        let total = at + payload[0].len() + payload[1].len();
        let len = u32::try_from(total).map_err(|_| EncodeError::TooLong(total))?;
        let h = OutHeader { len, error, unique };
        head[..size_of::<OutHeader>()].copy_from_slice(h.as_bytes());
        Ok(Self {
            head,
            head_len: at,
            payload,
        })
    }

    fn fixed(unique: u64, fixed: &[&[u8]]) -> Self {
        // Fixed parts are bounded by HEAD_MAX, so the length always fits.
        match Self::build(unique, 0, fixed, [&[], &[]]) {
            Ok(r) => r,
            Err(_) => unreachable!("fixed replies are at most HEAD_MAX bytes"),
        }
    }

    /// An error reply: header only, `error = -errno`.
    pub fn error(unique: u64, errno: Errno) -> Reply<'static> {
        Reply::fixed_static(unique, -errno.get())
    }

    fn fixed_static(unique: u64, error: i32) -> Reply<'static> {
        let mut r = Reply::fixed(unique, &[]);
        r.head[4..8].copy_from_slice(&error.to_ne_bytes());
        r
    }

    /// A success reply with no body (UNLINK, RELEASE, FSYNC, …).
    pub fn empty(unique: u64) -> Reply<'static> {
        Reply::fixed(unique, &[])
    }

    /// A success reply whose body is `data` (READ, READLINK, GETXATTR value,
    /// LISTXATTR names, READDIR records).
    pub fn data(unique: u64, data: &'a [u8]) -> Result<Self, EncodeError> {
        Self::build(unique, 0, &[], [data, &[]])
    }

    /// A success reply whose body is one out struct, sent whole.
    pub fn with_struct<T: IntoBytes + Immutable>(unique: u64, out: &T) -> Self {
        const { assert!(size_of::<T>() <= HEAD_MAX - size_of::<OutHeader>()) };
        Self::fixed(unique, &[out.as_bytes()])
    }

    /// LOOKUP, MKNOD, MKDIR, SYMLINK, LINK: `fuse_entry_out`, shortened for minor < 9.
    pub fn entry(unique: u64, out: &EntryOut, minor: u32) -> Self {
        Self::fixed(unique, &[&out.as_bytes()[..version::entry_out_size(minor)]])
    }

    /// GETATTR, SETATTR: `fuse_attr_out`, shortened for minor < 9.
    pub fn attr(unique: u64, out: &AttrOut, minor: u32) -> Self {
        Self::fixed(unique, &[&out.as_bytes()[..version::attr_out_size(minor)]])
    }

    /// CREATE, TMPFILE (and atomic open): `fuse_entry_out` + `fuse_open_out`.
    pub fn create(unique: u64, entry: &EntryOut, open: &OpenOut, minor: u32) -> Self {
        Self::fixed(
            unique,
            &[
                &entry.as_bytes()[..version::entry_out_size(minor)],
                open.as_bytes(),
            ],
        )
    }

    /// OPEN, OPENDIR: `fuse_open_out`.
    pub fn open(unique: u64, out: &OpenOut) -> Self {
        Self::with_struct(unique, out)
    }

    /// STATFS: `fuse_statfs_out`, shortened for minor < 4.
    pub fn statfs(unique: u64, out: &StatfsOut, minor: u32) -> Self {
        Self::fixed(unique, &[&out.as_bytes()[..version::statfs_out_size(minor)]])
    }

    /// INIT: `fuse_init_out`, shortened for the kernel's minor (8 bytes before
    /// 7.5, 24 before 7.23).
    pub fn init(unique: u64, out: &InitOut, kernel_minor: u32) -> Self {
        Self::fixed(unique, &[&out.as_bytes()[..version::init_out_size(kernel_minor)]])
    }

    /// CUSE_INIT: `cuse_init_out` followed by the device info strings.
    pub fn cuse_init(unique: u64, out: &CuseInitOut, info: &'a [u8]) -> Result<Self, EncodeError> {
        Self::build(unique, 0, &[out.as_bytes()], [info, &[]])
    }

    /// IOCTL: `fuse_ioctl_out` followed by output data (or iovecs on retry).
    pub fn ioctl(unique: u64, out: &IoctlOut, data: &'a [u8]) -> Result<Self, EncodeError> {
        Self::build(unique, 0, &[out.as_bytes()], [data, &[]])
    }

    /// The `fuse_out_header`.
    pub fn header(&self) -> OutHeader {
        let mut h = OutHeader::default();
        h.as_mut_bytes()
            .copy_from_slice(&self.head[..size_of::<OutHeader>()]);
        h
    }

    /// Total bytes, equal to the header's `len`.
    pub fn len(&self) -> usize {
        self.head_len + self.payload[0].len() + self.payload[1].len()
    }

    /// Never true: every message has a header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Header and fixed structs, contiguous.
    pub fn head(&self) -> &[u8] {
        &self.head[..self.head_len]
    }

    /// The borrowed payload slices (empty ones included).
    pub fn payload(&self) -> [&'a [u8]; 2] {
        self.payload
    }

    /// The non-empty parts in order, ready for `writev`: at most three.
    pub fn parts(&self) -> impl Iterator<Item = &[u8]> {
        [self.head(), self.payload[0], self.payload[1]]
            .into_iter()
            .filter(|p| !p.is_empty())
    }

    /// Copies the whole message into `out` (for transports that need one
    /// buffer); returns the bytes written, or `None` if `out` is too small.
    pub fn copy_to(&self, out: &mut [u8]) -> Option<usize> {
        let n = self.len();
        let dst = out.get_mut(..n)?;
        let mut at = 0;
        for p in self.parts() {
            dst[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        Some(n)
    }

    /// The whole message as one vector (tests, logging).
    #[cfg(feature = "alloc")]
    pub fn to_vec(&self) -> alloc::vec::Vec<u8> {
        let mut v = alloc::vec::Vec::with_capacity(self.len());
        for p in self.parts() {
            v.extend_from_slice(p);
        }
        v
    }

    fn notify(code: NotifyCode, fixed: &[&[u8]], payload: [&'a [u8]; 2]) -> Result<Self, EncodeError> {
        Self::build(0, code as i32, fixed, payload)
    }
}

fn check_name(name: &[u8]) -> Result<u32, EncodeError> {
    if name.is_empty() {
        return Err(EncodeError::InvalidName("empty"));
    }
    if name.contains(&0) {
        return Err(EncodeError::InvalidName("contains NUL"));
    }
    if name.len() > 4095 {
        return Err(EncodeError::InvalidName("longer than 4095 bytes"));
    }
    Ok(name.len() as u32)
}

/// Notifications: messages with `unique = 0` and the code in `error`.
pub mod notify {
    use super::*;

    /// POLL: wake the pollers of kernel handle `kh`.
    pub fn poll_wakeup(kh: u64) -> Reply<'static> {
        Reply::notify(
            NotifyCode::Poll,
            &[NotifyPollWakeupOut { kh }.as_bytes()],
            [&[], &[]],
        )
        .unwrap_or_else(|_| unreachable!())
    }

    /// INVAL_INODE: drop attributes of `ino` and, if `off >= 0`, cached data
    /// from `off` for `len` bytes (`len <= 0`: to the end).
    pub fn inval_inode(ino: u64, off: i64, len: i64) -> Reply<'static> {
        Reply::notify(
            NotifyCode::InvalInode,
            &[NotifyInvalInodeOut { ino, off, len }.as_bytes()],
            [&[], &[]],
        )
        .unwrap_or_else(|_| unreachable!())
    }

    /// INVAL_ENTRY: drop (or with `EXPIRE_ONLY` just expire) `name` in `parent`.
    pub fn inval_entry<'a>(
        parent: u64,
        name: &'a [u8],
        flags: InvalEntryFlags,
    ) -> Result<Reply<'a>, EncodeError> {
        let namelen = check_name(name)?;
        let out = NotifyInvalEntryOut {
            parent,
            namelen,
            flags: flags.bits(),
        };
        Reply::notify(NotifyCode::InvalEntry, &[out.as_bytes()], [name, &NUL])
    }

    /// DELETE: `name` in `parent`, which pointed at `child`, is gone.
    pub fn delete<'a>(parent: u64, child: u64, name: &'a [u8]) -> Result<Reply<'a>, EncodeError> {
        let namelen = check_name(name)?;
        let out = NotifyDeleteOut {
            parent,
            child,
            namelen,
            padding: 0,
        };
        Reply::notify(NotifyCode::Delete, &[out.as_bytes()], [name, &NUL])
    }

    /// STORE: put `data` into the page cache of `nodeid` at `offset`.
    pub fn store(nodeid: u64, offset: u64, data: &[u8]) -> Result<Reply<'_>, EncodeError> {
        let size = u32::try_from(data.len()).map_err(|_| EncodeError::TooLong(data.len()))?;
        let out = NotifyStoreOut {
            nodeid,
            offset,
            size,
            padding: 0,
        };
        Reply::notify(NotifyCode::Store, &[out.as_bytes()], [data, &[]])
    }

    /// RETRIEVE: ask for `size` cached bytes of `nodeid` at `offset`; the kernel
    /// answers with a NOTIFY_REPLY request whose unique is `notify_unique`.
    pub fn retrieve(notify_unique: u64, nodeid: u64, offset: u64, size: u32) -> Reply<'static> {
        let out = NotifyRetrieveOut {
            notify_unique,
            nodeid,
            offset,
            size,
            padding: 0,
        };
        Reply::notify(NotifyCode::Retrieve, &[out.as_bytes()], [&[], &[]]).unwrap_or_else(|_| unreachable!())
    }

    /// RESEND: the kernel re-queues every request already read (since 7.40).
    pub fn resend() -> Reply<'static> {
        Reply::notify(NotifyCode::Resend, &[], [&[], &[]]).unwrap_or_else(|_| unreachable!())
    }

    /// INC_EPOCH: cached entries from older epochs become invalid (since 7.44).
    pub fn inc_epoch() -> Reply<'static> {
        Reply::notify(NotifyCode::IncEpoch, &[], [&[], &[]]).unwrap_or_else(|_| unreachable!())
    }

    /// PRUNE: try to evict the unused inodes `nodeids` (since 7.45). The ids
    /// are borrowed as they lie in memory (host byte order, as the kernel reads them).
    pub fn prune(nodeids: &[u64]) -> Result<Reply<'_>, EncodeError> {
        let count = u32::try_from(nodeids.len()).map_err(|_| EncodeError::TooLong(nodeids.len()))?;
        let out = NotifyPruneOut {
            count,
            padding: 0,
            spare: 0,
        };
        Reply::notify(NotifyCode::Prune, &[out.as_bytes()], [nodeids.as_bytes(), &[]])
    }
}

/// Why a directory record was not added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DirentError {
    /// The record does not fit in the remaining space; send what is there.
    #[error("directory record does not fit in the reply buffer")]
    Full,
    /// The name is empty, longer than 1024 bytes, or contains `/` or NUL,
    /// all of which the kernel rejects with EIO.
    #[error("invalid directory entry name")]
    InvalidName,
}

/// Packs `fuse_dirent` / `fuse_direntplus` records into a caller's buffer,
/// each padded with zeros to 8 bytes.
pub struct DirentWriter<'b> {
    buf: &'b mut [u8],
    len: usize,
}

/// The longest name the kernel accepts in a directory record (`FUSE_NAME_MAX`).
pub const DIRENT_NAME_MAX: usize = 1024;

/// Size of a READDIR record with a name of `namelen` bytes (`FUSE_DIRENT_SIZE`).
pub const fn dirent_size(namelen: usize) -> usize {
    (crate::consts::NAME_OFFSET + namelen).next_multiple_of(8)
}

/// Size of a READDIRPLUS record (`FUSE_DIRENTPLUS_SIZE`).
pub const fn direntplus_size(namelen: usize) -> usize {
    (crate::consts::NAME_OFFSET_DIRENTPLUS + namelen).next_multiple_of(8)
}

impl<'b> DirentWriter<'b> {
    /// Writes into `buf`; usually `buf` is as long as the request's `size`.
    pub fn new(buf: &'b mut [u8]) -> Self {
        Self { buf, len: 0 }
    }

    fn check(name: &[u8]) -> Result<u32, DirentError> {
        if name.is_empty() || name.len() > DIRENT_NAME_MAX || name.contains(&b'/') || name.contains(&0) {
            return Err(DirentError::InvalidName);
        }
        Ok(name.len() as u32)
    }

    fn put(&mut self, fixed: &[&[u8]], name: &[u8], total: usize) -> Result<(), DirentError> {
        let dst = self
            .buf
            .get_mut(self.len..self.len + total)
            .ok_or(DirentError::Full)?;
        let mut at = 0;
        for f in fixed {
            dst[at..at + f.len()].copy_from_slice(f);
            at += f.len();
        }
        dst[at..at + name.len()].copy_from_slice(name);
        dst[at + name.len()..].fill(0);
        self.len += total;
        Ok(())
    }

    /// Adds a READDIR record. `off` is the cookie the kernel passes back to
    /// continue after this entry; `typ` is the `S_IFMT` bits shifted right by 12.
    pub fn add(&mut self, ino: u64, off: u64, typ: u32, name: &[u8]) -> Result<(), DirentError> {
        let namelen = Self::check(name)?;
        let d = Dirent {
            ino,
            off,
            namelen,
            r#type: typ,
        };
        self.put(&[d.as_bytes()], name, dirent_size(name.len()))
    }

    /// Adds a READDIRPLUS record with the entry (lookup count +1 in the kernel
    /// unless `entry.nodeid` is 0).
    pub fn add_plus(&mut self, entry: &EntryOut, off: u64, typ: u32, name: &[u8]) -> Result<(), DirentError> {
        let namelen = Self::check(name)?;
        let d = Dirent {
            ino: entry.attr.ino,
            off,
            namelen,
            r#type: typ,
        };
        self.put(
            &[entry.as_bytes(), d.as_bytes()],
            name,
            direntplus_size(name.len()),
        )
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The packed records.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

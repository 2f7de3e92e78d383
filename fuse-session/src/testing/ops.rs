//! Typed requests of the [`TestKernel`]: one method per operation, its
//! arguments as the kernel fills them in, its reply decoded (the
//! `fuse_proto::abi` struct, the data, or the records) or the error.
//!
//! Names are bytes (`"f"`, `b"f"`, or an `OsStr`'s bytes): the kernel sends
//! any bytes but `/` and NUL.

use super::kernel::TestKernel;
use super::wire::{self, DirEntry, DirEntryPlus, ReplyBody, Xattr};
use crate::filesystem::Filesystem;
use crate::types::{FileHandle, Inode};
use fuse_proto::abi::{
    AccessIn, AttrOut, CreateIn, EntryOut, FallocateIn, FlushIn, FsyncIn, GetattrIn, GetxattrIn, LinkIn,
    LseekIn, MkdirIn, MknodIn, OpenIn, OpenOut, ReadIn, ReleaseIn, Rename2In, RenameIn, SetattrIn,
    SetxattrIn, StatfsOut, WriteIn,
};
use fuse_proto::flags::{GetattrFlags, InitFlags, SetattrValid};
use fuse_proto::{Errno, Opcode, version};
use zerocopy::IntoBytes;

/// How many READDIR calls one listing may take before the kit calls it
/// endless.
pub const MAX_LISTING_CALLS: usize = 100_000;

macro_rules! expect {
    ($r:expr, $pat:pat => $v:expr) => {
        match $r? {
            $pat => Ok($v),
            _ => Err(Errno::EIO),
        }
    };
}

impl<F: Filesystem> TestKernel<F> {
    /// LOOKUP `name` in `parent`. A negative entry (node id 0, cached
    /// for its `entry_valid`) is `ENOENT`, as callers see it.
    pub fn lookup(&self, parent: Inode, name: impl AsRef<[u8]>) -> Result<EntryOut, Errno> {
        let n = wire::name(name.as_ref());
        match self.call(Opcode::Lookup, parent.0, &[&n])? {
            ReplyBody::Entry(e) if e.nodeid == 0 => Err(Errno::ENOENT),
            ReplyBody::Entry(e) => Ok(e),
            _ => Err(Errno::EIO),
        }
    }

    /// GETATTR of `node` (through `fh` if given, as `fstat` does).
    pub fn getattr(&self, node: Inode, fh: Option<FileHandle>) -> Result<AttrOut, Errno> {
        let arg = GetattrIn {
            getattr_flags: if fh.is_some() { GetattrFlags::FH.bits() } else { 0 },
            dummy: 0,
            fh: fh.map_or(0, |f| f.0),
        };
        let body: &[u8] = if version::getattr_has_body(self.minor()) {
            arg.as_bytes()
        } else {
            &[]
        };
        expect!(self.call(Opcode::Getattr, node.0, &[body]), ReplyBody::Attr(a) => a)
    }

    /// SETATTR of `node` with the kernel's `fuse_setattr_in` (its `valid`
    /// bits say which fields apply).
    pub fn setattr(&self, node: Inode, arg: &SetattrIn) -> Result<AttrOut, Errno> {
        expect!(self.call(Opcode::Setattr, node.0, &[arg.as_bytes()]), ReplyBody::Attr(a) => a)
    }

    /// `truncate(2)`: SETATTR of the size (through `fh` if given, as `ftruncate`).
    pub fn truncate(&self, node: Inode, size: u64, fh: Option<FileHandle>) -> Result<AttrOut, Errno> {
        let mut valid = SetattrValid::SIZE;
        if fh.is_some() {
            valid |= SetattrValid::FH;
        }
        let arg = SetattrIn {
            valid: valid.bits(),
            fh: fh.map_or(0, |f| f.0),
            size,
            ..SetattrIn::default()
        };
        self.setattr(node, &arg)
    }

    /// `chmod(2)`: SETATTR of the permission bits.
    pub fn chmod(&self, node: Inode, mode: u32) -> Result<AttrOut, Errno> {
        let arg = SetattrIn {
            valid: SetattrValid::MODE.bits(),
            mode,
            ..SetattrIn::default()
        };
        self.setattr(node, &arg)
    }

    /// `chown(2)`: SETATTR of the owner and group (`None`: unchanged).
    pub fn chown(&self, node: Inode, uid: Option<u32>, gid: Option<u32>) -> Result<AttrOut, Errno> {
        let mut valid = SetattrValid::empty();
        valid.set(SetattrValid::UID, uid.is_some());
        valid.set(SetattrValid::GID, gid.is_some());
        let arg = SetattrIn {
            valid: valid.bits(),
            uid: uid.unwrap_or(0),
            gid: gid.unwrap_or(0),
            ..SetattrIn::default()
        };
        self.setattr(node, &arg)
    }

    /// OPEN of `node` with the `open(2)` `flags` the kernel passes on
    /// (`O_RDONLY`, `O_RDWR | O_TRUNC`, …: without `O_CREAT`, `O_EXCL`
    /// and `O_NOCTTY`, which it keeps).
    pub fn open(&self, node: Inode, flags: i32) -> Result<OpenOut, Errno> {
        let arg = OpenIn {
            flags: flags as u32,
            open_flags: 0,
        };
        expect!(self.call(Opcode::Open, node.0, &[arg.as_bytes()]), ReplyBody::Open(o) => o)
    }

    /// OPENDIR of `node`.
    pub fn opendir(&self, node: Inode) -> Result<OpenOut, Errno> {
        let arg = OpenIn {
            flags: (libc::O_RDONLY | libc::O_DIRECTORY) as u32,
            open_flags: 0,
        };
        expect!(self.call(Opcode::Opendir, node.0, &[arg.as_bytes()]), ReplyBody::Open(o) => o)
    }

    /// CREATE `name` in `parent` with `mode` (type bits included, e.g.
    /// `S_IFREG | 0o644`) and open `flags` (`O_CREAT` is added); umask 0.
    pub fn create(
        &self,
        parent: Inode,
        name: impl AsRef<[u8]>,
        mode: u32,
        flags: i32,
    ) -> Result<(EntryOut, OpenOut), Errno> {
        let arg = CreateIn {
            flags: (flags | libc::O_CREAT) as u32,
            mode,
            umask: 0,
            open_flags: 0,
        };
        let n = wire::name(name.as_ref());
        let size = version::create_in_size(self.minor());
        expect!(self.call(Opcode::Create, parent.0, &[&arg.as_bytes()[..size], &n]), ReplyBody::Created(e, o) => (e, o))
    }

    /// MKNOD `name` in `parent` (`mode` with its type bits, `rdev` for devices).
    pub fn mknod(
        &self,
        parent: Inode,
        name: impl AsRef<[u8]>,
        mode: u32,
        rdev: u32,
    ) -> Result<EntryOut, Errno> {
        let arg = MknodIn {
            mode,
            rdev,
            umask: 0,
            padding: 0,
        };
        let n = wire::name(name.as_ref());
        let size = version::mknod_in_size(self.minor());
        expect!(self.call(Opcode::Mknod, parent.0, &[&arg.as_bytes()[..size], &n]), ReplyBody::Entry(e) => e)
    }

    /// MKDIR `name` in `parent` with permission bits `mode`.
    pub fn mkdir(&self, parent: Inode, name: impl AsRef<[u8]>, mode: u32) -> Result<EntryOut, Errno> {
        let arg = MkdirIn { mode, umask: 0 };
        let n = wire::name(name.as_ref());
        expect!(self.call(Opcode::Mkdir, parent.0, &[arg.as_bytes(), &n]), ReplyBody::Entry(e) => e)
    }

    /// SYMLINK `name` in `parent` pointing at `target`.
    pub fn symlink(
        &self,
        parent: Inode,
        name: impl AsRef<[u8]>,
        target: impl AsRef<[u8]>,
    ) -> Result<EntryOut, Errno> {
        let (n, t) = (wire::name(name.as_ref()), wire::name(target.as_ref()));
        expect!(self.call(Opcode::Symlink, parent.0, &[&n, &t]), ReplyBody::Entry(e) => e)
    }

    /// READLINK of `node`.
    pub fn readlink(&self, node: Inode) -> Result<Vec<u8>, Errno> {
        expect!(self.call(Opcode::Readlink, node.0, &[]), ReplyBody::Data(d) => d)
    }

    /// LINK: a new name `name` in `parent` for `node`.
    pub fn link(&self, node: Inode, parent: Inode, name: impl AsRef<[u8]>) -> Result<EntryOut, Errno> {
        let arg = LinkIn { oldnodeid: node.0 };
        let n = wire::name(name.as_ref());
        expect!(self.call(Opcode::Link, parent.0, &[arg.as_bytes(), &n]), ReplyBody::Entry(e) => e)
    }

    /// UNLINK `name` in `parent`.
    pub fn unlink(&self, parent: Inode, name: impl AsRef<[u8]>) -> Result<(), Errno> {
        let n = wire::name(name.as_ref());
        expect!(self.call(Opcode::Unlink, parent.0, &[&n]), ReplyBody::Empty => ())
    }

    /// RMDIR `name` in `parent`.
    pub fn rmdir(&self, parent: Inode, name: impl AsRef<[u8]>) -> Result<(), Errno> {
        let n = wire::name(name.as_ref());
        expect!(self.call(Opcode::Rmdir, parent.0, &[&n]), ReplyBody::Empty => ())
    }

    /// RENAME `name` in `parent` to `newname` in `newparent`; with
    /// `flags` (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`) it is RENAME2.
    pub fn rename(
        &self,
        parent: Inode,
        name: impl AsRef<[u8]>,
        newparent: Inode,
        newname: impl AsRef<[u8]>,
        flags: u32,
    ) -> Result<(), Errno> {
        let (n, nn) = (wire::name(name.as_ref()), wire::name(newname.as_ref()));
        let r = if flags == 0 {
            let arg = RenameIn { newdir: newparent.0 };
            self.call(Opcode::Rename, parent.0, &[arg.as_bytes(), &n, &nn])
        } else {
            let arg = Rename2In {
                newdir: newparent.0,
                flags,
                padding: 0,
            };
            self.call(Opcode::Rename2, parent.0, &[arg.as_bytes(), &n, &nn])
        };
        expect!(r, ReplyBody::Empty => ())
    }

    /// READ of `size` bytes at `offset` through `fh`.
    pub fn read(&self, node: Inode, fh: FileHandle, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let arg = ReadIn {
            fh: fh.0,
            offset,
            size,
            flags: libc::O_RDWR as u32,
            ..ReadIn::default()
        };
        expect!(self.call(Opcode::Read, node.0, &[arg.as_bytes()]), ReplyBody::Data(d) => d)
    }

    /// WRITE of `data` at `offset` through `fh`; the bytes written.
    pub fn write(&self, node: Inode, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let arg = WriteIn {
            fh: fh.0,
            offset,
            size: data.len() as u32,
            flags: libc::O_RDWR as u32,
            ..WriteIn::default()
        };
        let size = version::write_in_size(self.minor());
        expect!(self.call(Opcode::Write, node.0, &[&arg.as_bytes()[..size], data]), ReplyBody::Written(n) => n)
    }

    /// FLUSH of `fh` (each `close(2)` of a descriptor sends one).
    pub fn flush(&self, node: Inode, fh: FileHandle) -> Result<(), Errno> {
        let arg = FlushIn {
            fh: fh.0,
            ..FlushIn::default()
        };
        expect!(self.call(Opcode::Flush, node.0, &[arg.as_bytes()]), ReplyBody::Empty => ())
    }

    /// FSYNC of `fh` (`datasync`: `fdatasync(2)`).
    pub fn fsync(&self, node: Inode, fh: FileHandle, datasync: bool) -> Result<(), Errno> {
        let arg = FsyncIn {
            fh: fh.0,
            fsync_flags: u32::from(datasync),
            padding: 0,
        };
        expect!(self.call(Opcode::Fsync, node.0, &[arg.as_bytes()]), ReplyBody::Empty => ())
    }

    /// RELEASE of `fh` (the last reference to an open file went away).
    pub fn release(&self, node: Inode, fh: FileHandle) -> Result<(), Errno> {
        let arg = ReleaseIn {
            fh: fh.0,
            flags: libc::O_RDWR as u32,
            ..ReleaseIn::default()
        };
        expect!(self.call(Opcode::Release, node.0, &[arg.as_bytes()]), ReplyBody::Empty => ())
    }

    /// RELEASEDIR of `fh`.
    pub fn releasedir(&self, node: Inode, fh: FileHandle) -> Result<(), Errno> {
        let arg = ReleaseIn {
            fh: fh.0,
            flags: (libc::O_RDONLY | libc::O_DIRECTORY) as u32,
            ..ReleaseIn::default()
        };
        expect!(self.call(Opcode::Releasedir, node.0, &[arg.as_bytes()]), ReplyBody::Empty => ())
    }

    fn readdir_in(fh: FileHandle, offset: u64, size: u32) -> ReadIn {
        ReadIn {
            fh: fh.0,
            offset,
            size,
            flags: (libc::O_RDONLY | libc::O_DIRECTORY) as u32,
            ..ReadIn::default()
        }
    }

    /// One READDIR of `dir` through `fh` from cookie `offset`, with a
    /// `size`-byte buffer (the kernel uses a page).
    pub fn readdir(
        &self,
        dir: Inode,
        fh: FileHandle,
        offset: u64,
        size: u32,
    ) -> Result<Vec<DirEntry>, Errno> {
        let arg = Self::readdir_in(fh, offset, size);
        expect!(self.call(Opcode::Readdir, dir.0, &[arg.as_bytes()]), ReplyBody::Dir(d) => d)
    }

    /// One READDIRPLUS (each record with a node id other than 0, but `.`
    /// and `..`, is a lookup the kernel now holds).
    pub fn readdirplus(
        &self,
        dir: Inode,
        fh: FileHandle,
        offset: u64,
        size: u32,
    ) -> Result<Vec<DirEntryPlus>, Errno> {
        let arg = Self::readdir_in(fh, offset, size);
        expect!(self.call(Opcode::Readdirplus, dir.0, &[arg.as_bytes()]), ReplyBody::DirPlus(d) => d)
    }

    /// A whole listing as `ls` reads it: OPENDIR, READDIR calls of `size`
    /// bytes each continuing from the last cookie until an empty reply,
    /// RELEASEDIR. A listing that breaks the cookie rules or takes more
    /// than [`MAX_LISTING_CALLS`] calls stops there (a violation).
    pub fn list_dir(&self, dir: Inode, size: u32) -> Result<Vec<DirEntry>, Errno> {
        self.listing(
            dir,
            size,
            |k, fh, off| k.readdir(dir, fh, off, size),
            |e| e.offset,
        )
    }

    /// [`TestKernel::list_dir`] with READDIRPLUS (the kernel uses it when
    /// READDIRPLUS was negotiated).
    pub fn list_dir_plus(&self, dir: Inode, size: u32) -> Result<Vec<DirEntryPlus>, Errno> {
        self.listing(
            dir,
            size,
            |k, fh, off| k.readdirplus(dir, fh, off, size),
            |e| e.dirent.offset,
        )
    }

    fn listing<T>(
        &self,
        dir: Inode,
        _size: u32,
        call: impl Fn(&Self, FileHandle, u64) -> Result<Vec<T>, Errno>,
        cookie: impl Fn(&T) -> u64,
    ) -> Result<Vec<T>, Errno> {
        let fh = FileHandle(self.opendir(dir)?.fh);
        let mut all = Vec::new();
        let mut offset = 0;
        let mut r = Ok(());
        for calls in 0.. {
            if calls == MAX_LISTING_CALLS {
                self.checker().violate(
                    super::checker::Rule::ReaddirCookie,
                    format!("READDIR of node {}", dir.0),
                    format!("the listing did not end after {MAX_LISTING_CALLS} calls"),
                );
                break;
            }
            match call(self, fh, offset) {
                Ok(batch) if batch.is_empty() => break,
                Ok(batch) => {
                    offset = batch.last().map_or(offset, &cookie);
                    all.extend(batch);
                    if self.checker().pass_broken(dir.0, fh.0) {
                        break;
                    }
                }
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
        }
        let released = self.releasedir(dir, fh);
        r?;
        released?;
        Ok(all)
    }

    /// SETXATTR `name` = `value` on `node` (`flags`: `XATTR_CREATE`,
    /// `XATTR_REPLACE`).
    pub fn setxattr(
        &self,
        node: Inode,
        name: impl AsRef<[u8]>,
        value: &[u8],
        flags: u32,
    ) -> Result<(), Errno> {
        let arg = SetxattrIn {
            size: value.len() as u32,
            flags,
            setxattr_flags: 0,
            padding: 0,
        };
        let ext = self.negotiated().flags.contains(InitFlags::SETXATTR_EXT);
        let size = version::setxattr_in_size(ext);
        let n = wire::name(name.as_ref());
        expect!(self.call(Opcode::Setxattr, node.0, &[&arg.as_bytes()[..size], &n, value]), ReplyBody::Empty => ())
    }

    /// GETXATTR `name` of `node`; `size` 0 asks for the size needed.
    pub fn getxattr(&self, node: Inode, name: impl AsRef<[u8]>, size: u32) -> Result<Xattr, Errno> {
        let arg = GetxattrIn { size, padding: 0 };
        let n = wire::name(name.as_ref());
        expect!(self.call(Opcode::Getxattr, node.0, &[arg.as_bytes(), &n]), ReplyBody::Xattr(x) => x)
    }

    /// LISTXATTR of `node`; `size` 0 asks for the size needed.
    pub fn listxattr(&self, node: Inode, size: u32) -> Result<Xattr, Errno> {
        let arg = GetxattrIn { size, padding: 0 };
        expect!(self.call(Opcode::Listxattr, node.0, &[arg.as_bytes()]), ReplyBody::Xattr(x) => x)
    }

    /// REMOVEXATTR `name` of `node`.
    pub fn removexattr(&self, node: Inode, name: impl AsRef<[u8]>) -> Result<(), Errno> {
        let n = wire::name(name.as_ref());
        expect!(self.call(Opcode::Removexattr, node.0, &[&n]), ReplyBody::Empty => ())
    }

    /// STATFS of `node`'s filesystem.
    pub fn statfs(&self, node: Inode) -> Result<StatfsOut, Errno> {
        expect!(self.call(Opcode::Statfs, node.0, &[]), ReplyBody::Statfs(s) => s)
    }

    /// ACCESS of `node` for `mask` (`R_OK | W_OK | X_OK`, or `F_OK`).
    pub fn access(&self, node: Inode, mask: i32) -> Result<(), Errno> {
        let arg = AccessIn {
            mask: mask as u32,
            padding: 0,
        };
        expect!(self.call(Opcode::Access, node.0, &[arg.as_bytes()]), ReplyBody::Empty => ())
    }

    /// FALLOCATE through `fh` (`mode`: `FALLOC_FL_*`).
    pub fn fallocate(
        &self,
        node: Inode,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: u32,
    ) -> Result<(), Errno> {
        let arg = FallocateIn {
            fh: fh.0,
            offset,
            length,
            mode,
            padding: 0,
        };
        expect!(self.call(Opcode::Fallocate, node.0, &[arg.as_bytes()]), ReplyBody::Empty => ())
    }

    /// LSEEK through `fh` (`whence`: `SEEK_DATA`, `SEEK_HOLE`; the kernel
    /// answers the others itself).
    pub fn lseek(&self, node: Inode, fh: FileHandle, offset: u64, whence: u32) -> Result<u64, Errno> {
        let arg = LseekIn {
            fh: fh.0,
            offset,
            whence,
            padding: 0,
        };
        expect!(self.call(Opcode::Lseek, node.0, &[arg.as_bytes()]), ReplyBody::Offset(o) => o)
    }
}

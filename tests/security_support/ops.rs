//! The operations the checks are made of: system calls returning
//! `Result<_, errno>` for the log, and setup helpers that panic (setup is
//! done as root, through the filesystem under test, and must work).

use crate::posix_support::{Fd, chk, cpath, ioe, set_mode, set_owner};
use std::ffi::CString;
use std::fs;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------
// setup

/// Creates file `p` holding `data`, then gives it `uid:gid` and `mode`
/// (in that order: a chown clears set-ID bits).
pub fn mkfile(p: &Path, mode: u32, uid: u32, gid: u32, data: &[u8]) -> PathBuf {
    fs::write(p, data).unwrap_or_else(|e| panic!("setup: create {}: {e}", p.display()));
    set_owner(p, uid, gid);
    set_mode(p, mode);
    p.to_path_buf()
}

/// Creates directory `p` with `uid:gid` and `mode`.
pub fn mkdirp(p: &Path, mode: u32, uid: u32, gid: u32) -> PathBuf {
    fs::create_dir(p).unwrap_or_else(|e| panic!("setup: mkdir {}: {e}", p.display()));
    set_owner(p, uid, gid);
    set_mode(p, mode);
    p.to_path_buf()
}

// ---------------------------------------------------------------------------
// reading the state

/// The content as text.
pub fn text(p: &Path) -> Result<String, i32> {
    ioe(fs::read(p)).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The permission bits and type, in octal (`lstat`).
pub fn mode_of(p: &Path) -> Result<String, i32> {
    crate::posix_support::stat(p, false).map(|s| format!("{:o}", s.st_mode))
}

/// `(uid, gid)` (`lstat`).
pub fn owner_of(p: &Path) -> Result<(u32, u32), i32> {
    crate::posix_support::stat(p, false).map(|s| (s.st_uid, s.st_gid))
}

/// `(mtime seconds, nanoseconds)` (`lstat`).
pub fn mtime_of(p: &Path) -> Result<(i64, i64), i32> {
    crate::posix_support::stat(p, false).map(|s| (s.st_mtime, s.st_mtime_nsec))
}

/// The sorted names in a directory.
pub fn names_in(dir: &Path) -> Result<Vec<String>, i32> {
    let mut v: Vec<String> = ioe(fs::read_dir(dir))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()
        .map_err(|e| e.raw_os_error().unwrap_or(-1))?;
    v.sort();
    Ok(v)
}

// ---------------------------------------------------------------------------
// system calls

fn c(p: &Path) -> CString {
    cpath(p)
}

/// `open(2)` then `write(2)` of `data` at the start (or the end with `O_APPEND`).
pub fn open_write(p: &Path, flags: i32, data: &[u8]) -> Result<i64, i32> {
    let fd = crate::posix_support::open(p, flags, 0)?;
    crate::posix_support::write(&fd, data)
}

/// `close(2)`, with its result (a flush error shows here).
pub fn close(fd: Fd) -> Result<i64, i32> {
    let raw = fd.0;
    std::mem::forget(fd);
    // SAFETY: `raw` was owned by `fd`, which is forgotten: closed once.
    chk(unsafe { libc::close(raw) } as i64)
}

pub fn mkdir(p: &Path, mode: u32) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::mkdir(cp.as_ptr(), mode) } as i64)
}

pub fn rmdir(p: &Path) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::rmdir(cp.as_ptr()) } as i64)
}

pub fn unlink(p: &Path) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::unlink(cp.as_ptr()) } as i64)
}

pub fn mknod(p: &Path, mode: u32, dev: u64) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::mknod(cp.as_ptr(), mode, dev) } as i64)
}

pub fn link(a: &Path, b: &Path) -> Result<i64, i32> {
    let (ca, cb) = (c(a), c(b));
    // SAFETY: valid C strings.
    chk(unsafe { libc::linkat(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), 0) } as i64)
}

pub fn symlink(target: &str, p: &Path) -> Result<i64, i32> {
    let ct = CString::new(target).expect("no NUL");
    let cp = c(p);
    // SAFETY: valid C strings.
    chk(unsafe { libc::symlink(ct.as_ptr(), cp.as_ptr()) } as i64)
}

pub fn readlink(p: &Path) -> Result<String, i32> {
    ioe(fs::read_link(p)).map(|t| t.to_string_lossy().into_owned())
}

pub fn rename(a: &Path, b: &Path) -> Result<i64, i32> {
    rename2(a, b, 0)
}

pub fn rename2(a: &Path, b: &Path, flags: u32) -> Result<i64, i32> {
    let (ca, cb) = (c(a), c(b));
    // SAFETY: valid C strings.
    chk(unsafe { libc::renameat2(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), flags) } as i64)
}

pub fn chmod(p: &Path, mode: u32) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::chmod(cp.as_ptr(), mode) } as i64)
}

/// `chown(2)` (`u32::MAX`: leave as is); `lchown(2)` unless `follow`.
pub fn chown(p: &Path, uid: u32, gid: u32, follow: bool) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe {
        if follow {
            libc::chown(cp.as_ptr(), uid, gid)
        } else {
            libc::lchown(cp.as_ptr(), uid, gid)
        }
    } as i64)
}

pub fn fchmod(fd: &Fd, mode: u32) -> Result<i64, i32> {
    // SAFETY: plain call on an fd we own.
    chk(unsafe { libc::fchmod(fd.0, mode) } as i64)
}

pub fn fchown(fd: &Fd, uid: u32, gid: u32) -> Result<i64, i32> {
    // SAFETY: plain call on an fd we own.
    chk(unsafe { libc::fchown(fd.0, uid, gid) } as i64)
}

pub fn truncate(p: &Path, len: i64) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::truncate(cp.as_ptr(), len) } as i64)
}

pub fn ftruncate(fd: &Fd, len: i64) -> Result<i64, i32> {
    // SAFETY: plain call on an fd we own.
    chk(unsafe { libc::ftruncate(fd.0, len) } as i64)
}

pub fn fsync(fd: &Fd) -> Result<i64, i32> {
    // SAFETY: plain call on an fd we own.
    chk(unsafe { libc::fsync(fd.0) } as i64)
}

pub fn fdatasync(fd: &Fd) -> Result<i64, i32> {
    // SAFETY: plain call on an fd we own.
    chk(unsafe { libc::fdatasync(fd.0) } as i64)
}

pub fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

/// `utimensat(2)`; `None` means "now".
pub fn utimens(p: &Path, times: Option<[libc::timespec; 2]>, follow: bool) -> Result<i64, i32> {
    let cp = c(p);
    let flags = if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
    let ptr = times.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: valid C string; `ptr` is null or points at two timespecs.
    chk(unsafe { libc::utimensat(libc::AT_FDCWD, cp.as_ptr(), ptr, flags) } as i64)
}

/// `futimens(2)`; `None` means "now".
pub fn futimens(fd: &Fd, times: Option<[libc::timespec; 2]>) -> Result<i64, i32> {
    let ptr = times.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: `ptr` is null or points at two timespecs.
    chk(unsafe { libc::futimens(fd.0, ptr) } as i64)
}

/// `access(2)` (real ids).
pub fn access(p: &Path, mode: i32) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::access(cp.as_ptr(), mode) } as i64)
}

/// `faccessat(2)` with `AT_EACCESS` (effective ids).
pub fn eaccess(p: &Path, mode: i32) -> Result<i64, i32> {
    let cp = c(p);
    // SAFETY: valid C string.
    chk(unsafe { libc::faccessat(libc::AT_FDCWD, cp.as_ptr(), mode, libc::AT_EACCESS) } as i64)
}

/// `getxattr(2)`, the value as text.
pub fn getx(p: &Path, name: &str) -> Result<String, i32> {
    let (cp, cn) = (c(p), CString::new(name).expect("no NUL"));
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C strings; `buf` is valid for its length.
    let n =
        chk(unsafe { libc::getxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) } as i64)?;
    buf.truncate(n as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// `setxattr(2)` (`lsetxattr` unless `follow`).
pub fn setx(p: &Path, name: &str, val: &[u8], follow: bool) -> Result<i64, i32> {
    let (cp, cn) = (c(p), CString::new(name).expect("no NUL"));
    // SAFETY: valid C strings and value.
    let r = unsafe {
        if follow {
            libc::setxattr(cp.as_ptr(), cn.as_ptr(), val.as_ptr().cast(), val.len(), 0)
        } else {
            libc::lsetxattr(cp.as_ptr(), cn.as_ptr(), val.as_ptr().cast(), val.len(), 0)
        }
    };
    chk(r as i64)
}

pub fn removex(p: &Path, name: &str) -> Result<i64, i32> {
    let (cp, cn) = (c(p), CString::new(name).expect("no NUL"));
    // SAFETY: valid C strings.
    chk(unsafe { libc::removexattr(cp.as_ptr(), cn.as_ptr()) } as i64)
}

/// `listxattr(2)`: every name, sorted, except `security.*` (labels an LSM
/// may add on one filesystem and not the other).
pub fn listx(p: &Path) -> Result<Vec<String>, i32> {
    let cp = c(p);
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid C string and buffer.
    let n = chk(unsafe { libc::listxattr(cp.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) } as i64)?;
    buf.truncate(n as usize);
    let mut names: Vec<String> = buf
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty() && !s.starts_with(b"security."))
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// POSIX ACL tags.
pub const ACL_USER_OBJ: u16 = 0x01;
pub const ACL_USER: u16 = 0x02;
pub const ACL_GROUP_OBJ: u16 = 0x04;
pub const ACL_MASK: u16 = 0x10;
pub const ACL_OTHER: u16 = 0x20;
/// The id of entries that name nobody.
pub const ACL_UNDEFINED: u32 = u32::MAX;

/// A `system.posix_acl_access` value (version 2) of `(tag, perm, id)`
/// entries, which must be in the kernel's order (by tag, then id).
pub fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// The mode as `stat -c %a` sees it: `statx(2)` asking for the mode alone,
/// which a kernel answers from its attribute cache while that is valid
/// (`lstat` asks for more and may refresh it).
pub fn mode_only_of(p: &Path) -> Result<String, i32> {
    let cp = c(p);
    // SAFETY: an all-zero `statx` is a valid value to be overwritten.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and a live statx buffer.
    chk(unsafe {
        libc::statx(
            libc::AT_FDCWD,
            cp.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MODE,
            &mut st,
        )
    } as i64)?;
    Ok(format!("{:o}", st.stx_mode))
}

/// `fallocate(2)`.
pub fn fallocate(fd: &Fd, mode: i32, off: i64, len: i64) -> Result<i64, i32> {
    // SAFETY: plain system call on a descriptor we own.
    chk(unsafe { libc::fallocate(fd.0, mode, off, len) } as i64)
}

/// `copy_file_range(2)` of `len` bytes from the start of `from` to the
/// start of `to`.
pub fn copy_range(from: &Fd, to: &Fd, len: usize) -> Result<i64, i32> {
    let (mut a, mut b) = (0i64, 0i64);
    // SAFETY: both offsets are live for the call; descriptors we own.
    chk(unsafe { libc::copy_file_range(from.0, &mut a, to.0, &mut b, len, 0) } as i64)
}

/// An `O_DIRECT` write of one aligned 4 KiB block at offset 0.
pub fn direct_write(p: &Path) -> Result<i64, i32> {
    let fd = crate::posix_support::open(p, libc::O_WRONLY | libc::O_DIRECT, 0)?;
    let layout = std::alloc::Layout::from_size_align(4096, 4096).expect("layout");
    // SAFETY: a non-zero size; freed below with the same layout.
    let buf = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!buf.is_null(), "out of memory");
    // SAFETY: `buf` is valid for 4096 bytes.
    let r = chk(unsafe { libc::pwrite(fd.0, buf.cast(), 4096, 0) } as i64);
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(buf, layout) };
    r
}

/// A `security.capability` value (revision 2, effective) granting
/// `CAP_NET_RAW`.
pub fn file_caps() -> Vec<u8> {
    let mut v = Vec::with_capacity(20);
    v.extend_from_slice(&(0x0200_0000u32 | 1).to_le_bytes());
    v.extend_from_slice(&(1u32 << 13).to_le_bytes()); // permitted, low: CAP_NET_RAW (13)
    v.extend_from_slice(&0u32.to_le_bytes()); // inheritable, low
    v.extend_from_slice(&0u32.to_le_bytes()); // permitted, high
    v.extend_from_slice(&0u32.to_le_bytes()); // inheritable, high
    v
}

/// How many bytes of `security.capability` the file has (`Err`: the errno,
/// `ENODATA` when it has none).
pub fn caps_len(p: &Path) -> Result<i64, i32> {
    let (cp, cn) = (c(p), CString::new("security.capability").expect("no NUL"));
    let mut buf = [0u8; 64];
    // SAFETY: valid C strings; `buf` is valid for its length.
    chk(unsafe { libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) } as i64)
}

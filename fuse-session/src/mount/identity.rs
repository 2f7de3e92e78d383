//! Which mount is ours: the identity of a mount taken right after mounting,
//! and the questions asked of the mountpoint before unmounting.
//!
//! A path names whatever is mounted on top of it *now*. After `umount -l`
//! of our mount and a new mount on the same directory, or with another
//! filesystem mounted over ours, "unmount the mountpoint" would hit someone
//! else's mount. So right after mounting, the mountpoint (which then shows
//! our root) is opened `O_PATH` and `statx(2)` gives the mount's id:
//! `STATX_MNT_ID_UNIQUE` (Linux 6.8+, never reused) when the kernel has it,
//! else `STATX_MNT_ID` (Linux 5.8+, reused once a mount is freed, so it is
//! compared together with the superblock's device number). At unmount time
//! the same is asked of the path's topmost mount; only when the answers match
//! is the mount ours.
//!
//! `statx` is called with `AT_STATX_DONT_SYNC` and no attribute besides the
//! mount id: FUSE then answers from the inode it has in memory and sends no
//! request, so this works before INIT is served and on a dead connection.
//!
//! [`of_fd`] and [`open_top`] are plain system calls on caller-provided
//! memory, so the `auto_unmount` watchdog (a forked child of a
//! multi-threaded process, which must not allocate) uses them too.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The identity of one mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MountIdentity {
    /// `STATX_MNT_ID_UNIQUE` (Linux 6.8+): never reused while the system runs.
    pub unique: Option<u64>,
    /// `STATX_MNT_ID`, the id of `/proc/self/mountinfo`: reused after the
    /// mount is freed.
    pub id: u64,
    /// The superblock's device number (`stx_dev_major`, `stx_dev_minor`).
    pub dev: (u32, u32),
}

impl MountIdentity {
    /// Whether `other` is the same mount. With unique ids on both sides they
    /// decide; otherwise the reusable id and the device number must both match.
    pub fn is(&self, other: &MountIdentity) -> bool {
        match (self.unique, other.unique) {
            (Some(a), Some(b)) => a == b,
            _ => self.id == other.id && self.dev == other.dev,
        }
    }
}

impl std::fmt::Display for MountIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "mount id {}", self.id)?;
        if let Some(u) = self.unique {
            write!(f, " (unique {u})")?;
        }
        write!(f, ", device {}:{}", self.dev.0, self.dev.1)
    }
}

/// `statx(2)` without glibc's emulation, so that a kernel without it says
/// `ENOSYS` instead of an answer with no mount id. Returns the errno on failure.
fn statx(
    dirfd: libc::c_int,
    path: &CStr,
    flags: libc::c_int,
    mask: libc::c_uint,
) -> Result<libc::statx, i32> {
    // SAFETY: statx is plain data; the kernel fills it.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` a valid, exclusively borrowed
    // out buffer of the size the kernel expects; no other memory is passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_statx,
            dirfd,
            path.as_ptr(),
            flags,
            mask,
            &mut st as *mut libc::statx,
        )
    };
    if rc == 0 { Ok(st) } else { Err(errno()) }
}

/// The current thread's errno.
pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// The identity of the mount `fd` (an `O_PATH` fd) belongs to. Async-signal-safe.
///
/// `Err(errno)`; `ENOSYS` also when the kernel reports no mount id
/// (before Linux 5.8).
pub(crate) fn of_fd(fd: BorrowedFd<'_>) -> Result<MountIdentity, i32> {
    let empty = c"";
    let flags = libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC;
    let fd = fd.as_raw_fd();
    // A process the filesystem does not let in (not the mount owner, no
    // allow_other) gets EACCES for any attribute but nothing at all; the
    // mount id and device are still filled in then.
    let ask = |mask| match statx(fd, empty, flags, mask) {
        Err(libc::EACCES) => statx(fd, empty, flags, 0),
        other => other,
    };
    let st = ask(libc::STATX_MNT_ID_UNIQUE)?;
    let dev = (st.stx_dev_major, st.stx_dev_minor);
    let unique = (st.stx_mask & libc::STATX_MNT_ID_UNIQUE != 0).then_some(st.stx_mnt_id);
    let plain = ask(libc::STATX_MNT_ID)?;
    if plain.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(libc::ENOSYS);
    }
    Ok(MountIdentity {
        unique,
        id: plain.stx_mnt_id,
        dev,
    })
}

/// Opens the topmost mount's root at `path` (`O_PATH`, the last component
/// not followed if it is a symlink). Async-signal-safe.
pub(crate) fn open_top(path: &CStr) -> Result<OwnedFd, i32> {
    // SAFETY: `path` is NUL-terminated; O_PATH opens nothing of the
    // filesystem itself (no FUSE OPEN is sent).
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The topmost mount at `path`: its root opened `O_PATH`, and its identity.
pub(crate) fn top_at(path: &CStr) -> io::Result<(OwnedFd, MountIdentity)> {
    let fd = open_top(path).map_err(io::Error::from_raw_os_error)?;
    let id = of_fd(std::os::fd::AsFd::as_fd(&fd)).map_err(io::Error::from_raw_os_error)?;
    Ok((fd, id))
}

/// The topmost mount whose root `path` is, if it is one (its mount id
/// differs from its parent directory's): mounting there would stack on it.
/// `None` for a plain directory, or when it cannot be told.
pub(crate) fn mount_root_at(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let here = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let up = std::ffi::CString::new(path.join("..").as_os_str().as_bytes()).ok()?;
    let (_, a) = top_at(&here).ok()?;
    let (_, b) = top_at(&up).ok()?;
    (!a.is(&b)).then_some(a.id)
}

/// Where a mount that is no longer the topmost at our mountpoint went.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Whereabouts {
    /// Still mounted on the mountpoint, below another mount.
    Covered,
    /// Still in this mount namespace, on another directory (`mount --move`).
    Elsewhere(PathBuf),
    /// Not in this mount namespace any more: unmounted (maybe lazily, and
    /// maybe still alive for whoever holds files open in it).
    Gone,
}

/// Where `ours` is now, per `/proc/self/mountinfo`, given that `top`, the
/// topmost mount at `path`, is not ours.
///
/// mountinfo lists only the reusable id, so a listed mount with our id and
/// device is taken for ours; the one exception is `top` itself, which may
/// carry both again once ours was freed (it was just found not to be ours).
pub(crate) fn whereabouts(ours: &MountIdentity, top: &MountIdentity, path: &Path) -> Whereabouts {
    if ours.id == top.id && ours.dev == top.dev {
        return Whereabouts::Gone;
    }
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Whereabouts::Gone;
    };
    let want_dev = format!("{}:{}", ours.dev.0, ours.dev.1);
    for line in info.lines() {
        let Some(m) = MountinfoLine::parse(line) else {
            continue;
        };
        if m.id == ours.id && m.dev == want_dev {
            return if Path::new(&m.mountpoint) == path {
                Whereabouts::Covered
            } else {
                Whereabouts::Elsewhere(PathBuf::from(m.mountpoint))
            };
        }
    }
    Whereabouts::Gone
}

/// `fstype source (mount id N)` of the mount with reusable id `id`, for log
/// lines; `mount id N` if it is not listed.
pub(crate) fn describe(id: u64) -> String {
    std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .filter_map(MountinfoLine::parse)
                .find(|m| m.id == id)
                .map(|m| format!("{} {} (mount id {id})", m.fstype, m.source))
        })
        .unwrap_or_else(|| format!("mount id {id}"))
}

/// Whether the mount with reusable id `id` is a FUSE mount (`fuse`,
/// `fuse.*`, `fuseblk`, `fuseblk.*`); `None` if it is not listed.
pub(crate) fn is_fuse(id: u64) -> Option<bool> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .filter_map(MountinfoLine::parse)
        .find(|m| m.id == id)
        .map(|m| {
            let t = m.fstype.as_str();
            t == "fuse" || t == "fuseblk" || t.starts_with("fuse.") || t.starts_with("fuseblk.")
        })
}

/// The fields of one `/proc/self/mountinfo` line that are used here.
struct MountinfoLine {
    id: u64,
    dev: String,
    mountpoint: String,
    fstype: String,
    source: String,
}

impl MountinfoLine {
    fn parse(line: &str) -> Option<MountinfoLine> {
        let (left, right) = line.split_once(" - ")?;
        let mut l = left.split(' ');
        let id = l.next()?.parse().ok()?;
        let _parent = l.next()?;
        let dev = l.next()?.to_string();
        let _root = l.next()?;
        let mountpoint = unescape_mountinfo(l.next()?);
        let mut r = right.split(' ');
        let fstype = r.next()?.to_string();
        let source = unescape_mountinfo(r.next().unwrap_or(""));
        Some(MountinfoLine {
            id,
            dev,
            mountpoint,
            fstype,
            source,
        })
    }
}

/// Undoes the octal escapes (`\040` for space, …) of mountinfo paths.
pub(crate) fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mountinfo("/tmp/a\\040b\\011c\\134d"), "/tmp/a b\tc\\d");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/end\\04"), "/end\\04");
    }

    #[test]
    fn mountinfo_lines_parse() {
        let m = MountinfoLine::parse(
            "36 35 98:0 /mnt1 /mnt/a\\040b rw,noatime master:1 - fuse.memfs memfs rw,user_id=0",
        )
        .unwrap();
        assert_eq!((m.id, m.dev.as_str()), (36, "98:0"));
        assert_eq!(m.mountpoint, "/mnt/a b");
        assert_eq!((m.fstype.as_str(), m.source.as_str()), ("fuse.memfs", "memfs"));
        assert!(MountinfoLine::parse("garbage").is_none());
    }

    #[test]
    fn identity_of_the_root_directory() {
        let (_fd, a) = top_at(c"/").unwrap();
        let (_fd, b) = top_at(c"/").unwrap();
        assert!(a.is(&b));
        let other = MountIdentity {
            unique: a.unique.map(|u| u + 1),
            id: a.id + 1,
            ..a
        };
        assert!(!a.is(&other));
        assert_eq!(whereabouts(&other, &a, Path::new("/")), Whereabouts::Gone);
        assert_eq!(whereabouts(&a, &other, Path::new("/")), Whereabouts::Covered);
        // The top carrying our reusable id and device again is not ours.
        let reused = MountIdentity {
            unique: a.unique.map(|u| u + 1),
            ..a
        };
        assert_eq!(whereabouts(&a, &reused, Path::new("/")), Whereabouts::Gone);
        assert_eq!(is_fuse(a.id), Some(false));
    }
}

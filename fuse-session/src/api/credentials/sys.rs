//! The system calls behind credentials: the daemon's own, captured once
//! ([`Daemon`]), `capget(2)`/`capset(2)`, `setfsuid(2)`/`setfsgid(2)` and
//! the thread's supplementary groups.

use super::cap;
use std::io;
use std::sync::OnceLock;

/// The daemon's own credentials, captured once.
pub(super) struct Daemon {
    pub(super) fsuid: u32,
    pub(super) fsgid: u32,
    pub(super) groups: Vec<u32>,
    pub(super) effective: u64,
    pub(super) permitted: u64,
    pub(super) inheritable: u64,
}

impl Daemon {
    pub(super) fn get() -> io::Result<&'static Daemon> {
        static ME: OnceLock<Result<Daemon, i32>> = OnceLock::new();
        ME.get_or_init(|| {
            let (effective, permitted, inheritable) =
                capget().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
            Ok(Daemon {
                fsuid: setfsuid(u32::MAX),
                fsgid: setfsgid(u32::MAX),
                groups: getgroups().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?,
                effective,
                permitted,
                inheritable,
            })
        })
        .as_ref()
        .map_err(|e| io::Error::from_raw_os_error(*e))
    }

    pub(super) fn can_switch(&self) -> bool {
        let need = (1 << cap::SETUID) | (1 << cap::SETGID);
        self.effective & need == need
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;

pub(super) fn capget() -> io::Result<(u64, u64, u64)> {
    capget_pid(0)
}

/// The effective capabilities of thread `pid` (numbered in this process's
/// pid namespace).
pub(super) fn capget_of(pid: u32) -> io::Result<u64> {
    let pid = i32::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    if pid == 0 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    capget_pid(pid).map(|(e, _, _)| e)
}

fn capget_pid(pid: i32) -> io::Result<(u64, u64, u64)> {
    let mut h = CapHeader {
        version: CAP_VERSION_3,
        pid,
    };
    let mut d = [CapData::default(); 2];
    // SAFETY: the kernel writes two `__user_cap_data_struct`s (version 3)
    // into `d` and reads the header; both live for the call.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut h as *mut CapHeader, d.as_mut_ptr()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let join = |lo: u32, hi: u32| (lo as u64) | ((hi as u64) << 32);
    Ok((
        join(d[0].effective, d[1].effective),
        join(d[0].permitted, d[1].permitted),
        join(d[0].inheritable, d[1].inheritable),
    ))
}

/// Sets this *thread's* capability sets (capset acts on the calling thread).
pub(super) fn capset(effective: u64, permitted: u64, inheritable: u64) -> io::Result<()> {
    let mut h = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let split = |v: u64| (v as u32, (v >> 32) as u32);
    let (e0, e1) = split(effective);
    let (p0, p1) = split(permitted);
    let (i0, i1) = split(inheritable);
    let d = [
        CapData {
            effective: e0,
            permitted: p0,
            inheritable: i0,
        },
        CapData {
            effective: e1,
            permitted: p1,
            inheritable: i1,
        },
    ];
    // SAFETY: the kernel reads the header and two data structs that live
    // for the call.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut h as *mut CapHeader, d.as_ptr()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Sets this thread's filesystem uid; returns the previous one.
pub(super) fn setfsuid(uid: u32) -> u32 {
    // SAFETY: setfsuid has no memory effects; it changes this thread's creds.
    unsafe { libc::setfsuid(uid) as u32 }
}

/// Sets this thread's filesystem gid; returns the previous one.
pub(super) fn setfsgid(gid: u32) -> u32 {
    // SAFETY: setfsgid has no memory effects; it changes this thread's creds.
    unsafe { libc::setfsgid(gid) as u32 }
}

/// Sets the supplementary groups of *this thread only* (the raw system call;
/// the C library's `setgroups` changes every thread of the process).
pub(super) fn setgroups_thread(groups: &[u32]) -> io::Result<()> {
    // SAFETY: the kernel reads `groups.len()` gids from the live slice.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub(super) fn getgroups() -> io::Result<Vec<u32>> {
    // SAFETY: with size 0 the call only counts the groups.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut v = vec![0; n as usize];
    // SAFETY: `v` has room for `n` gids.
    let n = unsafe { libc::getgroups(n, v.as_mut_ptr()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    v.truncate(n as usize);
    Ok(v)
}

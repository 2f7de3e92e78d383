//! A thread acting as a request's caller, and back as the daemon: the
//! guards [`ActingAs`] and [`AsDaemon`], the daemon's credentials while
//! it registers a backing file, and what each thread remembers of them.

use super::sys::{Daemon, capget, capset, getgroups, setfsgid, setfsuid, setgroups_thread};
use super::{ALL_CAPS, Caller, KERNEL_CHECKED_CAPS, cap};
use std::io;

impl Caller {
    /// Makes the current thread act as the caller until the guard drops:
    /// fsuid and fsgid, and (never more than the daemon has):
    ///
    /// - when the kernel checks permissions (`default_permissions`): the
    ///   capabilities that stand for its decision (see
    ///   [`Caller::capabilities`] for what is known of the caller itself);
    ///   the kernel has refused what the caller may not do, with everything
    ///   it knows of the caller, and the daemon's groups are kept;
    /// - otherwise: the caller's supplementary groups and effective
    ///   capabilities as far as they can be known, so that the source
    ///   filesystem checks the request as the caller.
    ///
    /// Nothing changes for the kernel's own requests, for a caller with
    /// the daemon's own identity and capabilities, or for a request of an
    /// idmapped mount that names no caller (uid or gid
    /// `FUSE_INVALID_UIDGID`: every request but the creates, once
    /// `ALLOW_IDMAP` is granted), which the kernel has checked. Nested calls on a thread
    /// already acting as a caller do nothing.
    ///
    /// A daemon that cannot change its credentials (no `CAP_SETUID` and
    /// `CAP_SETGID`) serves callers of its own uid as itself, and others only
    /// when the kernel checks permissions; otherwise this answers `EACCES`,
    /// since the request would run with another user's rights.
    pub fn act_as(&self) -> io::Result<ActingAs> {
        let noop = Ok(ActingAs { saved: None });
        if ACTING.get() || self.is_kernel_request() {
            return noop;
        }
        if self.is_unmapped() {
            // An idmapped mount's request other than a create: the kernel
            // names no caller (`FUSE_INVALID_UIDGID`), having checked the
            // request itself with the caller's ids mapped through the mount
            // (`ALLOW_IDMAP` needs `default_permissions`). There is no one
            // else to act as; without kernel checks nobody may pass.
            return if self.policy.kernel_checks {
                noop
            } else {
                Err(io::Error::from_raw_os_error(libc::EACCES))
            };
        }
        let me = Daemon::get()?;
        let (groups, caps) = if self.policy.kernel_checks {
            let caps = if self.uid == 0 {
                ALL_CAPS
            } else {
                KERNEL_CHECKED_CAPS
            };
            (None, caps & me.effective)
        } else {
            let k = self.known();
            (Some(k.groups.as_slice()), k.caps & me.effective)
        };
        if self.uid == me.fsuid && self.gid == me.fsgid && caps == me.effective {
            return noop;
        }
        if !me.can_switch() {
            if self.uid == me.fsuid || self.policy.kernel_checks {
                return noop;
            }
            return Err(io::Error::from_raw_os_error(libc::EACCES));
        }
        let switch_groups = caps != me.effective && groups.is_some_and(|g| g != me.groups.as_slice());
        if switch_groups {
            setgroups_thread(groups.unwrap_or(&[]))?;
        }
        let guard = ActingAs {
            saved: Some(Saved {
                groups: switch_groups,
                caps: true,
            }),
        };
        ACTING.set(true);
        setfsgid(self.gid);
        setfsuid(self.uid);
        // setfs[ug]id report failure only by not changing: check.
        if setfsgid(u32::MAX) != self.gid || setfsuid(u32::MAX) != self.uid {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        set_effective(caps, me)?;
        CALLER_IDS.set(Some((self.uid, self.gid, caps)));
        Ok(guard)
    }
}

thread_local! {
    /// Whether this thread acts as a caller now.
    static ACTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// What an [`ActingAs`] changed and restores.
#[derive(Debug)]
struct Saved {
    groups: bool,
    caps: bool,
}

/// The current thread acting as a caller; back to the daemon's own
/// credentials when dropped.
#[derive(Debug)]
#[must_use = "the thread acts as the caller only while the guard lives"]
pub struct ActingAs {
    saved: Option<Saved>,
}

impl ActingAs {
    /// Whether the thread's credentials were changed (false for requests
    /// served with the daemon's own).
    pub fn switched(&self) -> bool {
        self.saved.is_some()
    }

    /// Back to the daemon's own credentials until the returned guard drops
    /// (see [`as_daemon`]).
    pub fn as_daemon(&self) -> AsDaemon {
        as_daemon()
    }
}

/// Whether the current thread acts as a caller now (inside
/// [`Caller::act_as`]).
pub fn acting_as_caller() -> bool {
    ACTING.get()
}

/// Back to the daemon's own fsuid, fsgid and capabilities until the
/// returned guard drops, for what the daemon does on its own behalf while
/// serving a caller: descriptors later shared by other callers, say. Does
/// nothing on a thread that does not act as a caller.
pub fn as_daemon() -> AsDaemon {
    let active = ACTING.get();
    if active {
        restore();
    }
    AsDaemon { active }
}

fn restore() {
    let Ok(me) = Daemon::get() else { return };
    setfsuid(me.fsuid);
    setfsgid(me.fsgid);
    if let Err(e) = set_effective(me.effective, me) {
        log::error!("restoring the worker's capabilities: {e}");
    }
    ACTING.set(false);
}

impl Drop for ActingAs {
    fn drop(&mut self) {
        let Some(s) = self.saved.take() else { return };
        let Ok(me) = Daemon::get() else { return };
        setfsuid(me.fsuid);
        setfsgid(me.fsgid);
        if s.caps
            && let Err(e) = set_effective(me.effective, me)
        {
            log::error!("restoring the worker's capabilities: {e}");
        }
        if s.groups
            && let Err(e) = setgroups_thread(&me.groups)
        {
            log::error!("restoring the worker's groups: {e}");
        }
        ACTING.set(false);
    }
}

/// The daemon's own credentials for a while; the caller's again when dropped.
#[derive(Debug)]
#[must_use = "the thread acts as the daemon only while the guard lives"]
pub struct AsDaemon {
    active: bool,
}

impl Drop for AsDaemon {
    fn drop(&mut self) {
        if !self.active {
            return;
        }
        // Re-entering cannot fail in ways the first entry did not: the
        // groups are still set (only ids and capabilities were put back),
        // and the ids and capabilities were accepted before.
        if let Some((uid, gid, caps)) = CALLER_IDS.get() {
            setfsgid(gid);
            setfsuid(uid);
            if let Ok(me) = Daemon::get()
                && let Err(e) = set_effective(caps, me)
            {
                log::error!("re-entering the caller's capabilities: {e}");
            }
            ACTING.set(true);
        }
    }
}

thread_local! {
    /// The (fsuid, fsgid, capabilities) of the caller this thread acts as,
    /// for [`AsDaemon`] to return to.
    static CALLER_IDS: std::cell::Cell<Option<(u32, u32, u64)>> = const { std::cell::Cell::new(None) };
}

/// A gid no file is expected to have: the group of the credentials a
/// backing file is registered with.
const NO_GROUP: u32 = u32::MAX - 1;

/// Runs `f` (the registration of a passthrough backing file) with the
/// credentials the kernel should keep for it.
///
/// The kernel keeps the registering thread's credentials and runs every
/// passed-through write with them, whoever the writer is. So they must not
/// make the write keep set-ID bits that a plain write would clear: no
/// `CAP_FSETID`, and no membership in the file's group (a set-group-ID file
/// without group execute keeps its bit for writers in its group). The
/// thread gets no supplementary groups and an fsgid no file has;
/// `CAP_SYS_ADMIN`, which the registration needs, stays.
pub(crate) fn as_backing_registrar<T>(f: impl FnOnce() -> T) -> io::Result<T> {
    let (eff, perm, inh) = capget()?;
    let groups = getgroups()?;
    let fsgid = setfsgid(u32::MAX);
    let bit = 1u64 << cap::FSETID;
    capset(eff & !bit, perm, inh)?;
    let restore_caps = || {
        if let Err(e) = capset(eff, perm, inh) {
            log::error!("restoring capabilities after registering a backing file: {e}");
        }
    };
    if let Err(e) = setgroups_thread(&[]) {
        restore_caps();
        return Err(e);
    }
    setfsgid(NO_GROUP);
    let r = f();
    setfsgid(fsgid);
    if let Err(e) = setgroups_thread(&groups) {
        log::error!("restoring groups after registering a backing file: {e}");
    }
    restore_caps();
    Ok(r)
}

/// Sets this thread's effective capabilities to `caps` (within the
/// daemon's permitted set), if they differ from what the thread has.
fn set_effective(caps: u64, me: &Daemon) -> io::Result<()> {
    let (cur, _, _) = capget()?;
    if cur == caps {
        return Ok(());
    }
    capset(caps & me.permitted, me.permitted, me.inheritable)
}

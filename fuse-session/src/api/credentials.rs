//! Who sent a request, beyond the header's uid and gid: the caller's
//! supplementary groups and effective capabilities, and a guard that makes the
//! current thread act with exactly those credentials while it serves the
//! request.
//!
//! The kernel sends only the caller's fsuid, fsgid and a pid numbered in the
//! connection's pid namespace (0 when the caller is outside it, and for the
//! kernel's own requests). Everything else is read from `/proc/PID/status`,
//! which is only meaningful when the `/proc` this process sees numbers pids
//! in the connection's pid namespace. The rule this module implements
//! (docs/security.md states it for users):
//!
//! - A request runs as its caller or is refused; pid 0 never means root by
//!   itself.
//! - What cannot be known about a caller is denied, not granted: unknown
//!   supplementary groups are none (apart from the group the kernel itself
//!   vouches for in a create, `CREATE_SUPP_GROUP`), unknown capabilities are
//!   none. Each such case is logged once per session, not per request.
//! - Requests with uid 0, gid 0 and pid 0 are the kernel's own (RELEASE,
//!   FORGET, writeback WRITEs); they run with the daemon's full credentials.
//! - With `default_permissions` the kernel has checked the caller's
//!   capabilities itself before sending the request, so root callers are not
//!   looked up in `/proc` (that keeps their requests free of extra system
//!   calls); without it they are, and a root caller with dropped capabilities
//!   is served with only the capabilities it has.

mod acting;
pub mod cap;
mod sys;

pub(crate) use acting::as_backing_registrar;
pub use acting::{ActingAs, AsDaemon, acting_as_caller, as_daemon};
use std::cell::OnceCell;
use std::sync::atomic::{AtomicU8, Ordering};
use sys::{Daemon, capget_of};

/// Whether the `/proc` this process sees can tell about the connection's
/// callers, decided once per session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcCredentials {
    /// Check at session start that `/proc` numbers pids as this process's
    /// own pid namespace does, and assume the connection was made in that
    /// namespace (true when the session mounted itself).
    Auto,
    /// Trust `/proc` without checking (the embedding program knows better).
    Trust,
    /// Never read `/proc`: groups and capabilities of callers stay unknown
    /// (denied).
    Never,
}

/// The session-wide part of the rule, fixed at INIT.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallerPolicy {
    /// `Err(why)` when `/proc` cannot be trusted for this connection.
    pub(crate) proc: Result<(), &'static str>,
    /// The kernel checks permissions itself (`default_permissions`).
    pub(crate) kernel_checks: bool,
}

impl CallerPolicy {
    pub(crate) fn new(mode: ProcCredentials, handed_over: bool, kernel_checks: bool) -> Self {
        let proc = match mode {
            ProcCredentials::Trust => Ok(()),
            ProcCredentials::Never => Err("reading callers from /proc is turned off"),
            ProcCredentials::Auto if handed_over => {
                Err("the /dev/fuse fd was handed over: its pid namespace is unknown")
            }
            ProcCredentials::Auto => proc_is_own_namespace(),
        };
        if let Err(why) = proc {
            log::warn!(
                "caller credentials: {why}; supplementary groups and capabilities of callers \
                 are treated as none"
            );
        }
        Self { proc, kernel_checks }
    }
}

/// Whether `/proc` belongs to this process's pid namespace, and children we
/// start (`fusermount3`) are in it too.
fn proc_is_own_namespace() -> Result<(), &'static str> {
    let own = std::fs::read_link("/proc/self").map_err(|_| "/proc/self cannot be read")?;
    if own.to_str() != Some(&std::process::id().to_string()) {
        return Err("/proc belongs to another pid namespace than this process");
    }
    let ns = |p: &str| std::fs::metadata(p).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    match (ns("/proc/self/ns/pid"), ns("/proc/self/ns/pid_for_children")) {
        (Ok(a), Ok(b)) if a == b => Ok(()),
        (Ok(_), Ok(_)) => Err("this process's children are in another pid namespace"),
        _ => Err("the pid namespace of this process cannot be read"),
    }
}

/// Logged-once flags, one bit per reason.
static LOGGED: AtomicU8 = AtomicU8::new(0);

fn log_once(bit: u8, msg: &str) {
    if LOGGED.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
        log::warn!("caller credentials: {msg} (logged once)");
    }
}

/// Where a [`Caller`]'s credentials came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The kernel's own request (uid, gid and pid all 0).
    Kernel,
    /// Read from `/proc` and checked against the header.
    Proc,
    /// Only the header is known (the caller is outside the connection's pid
    /// namespace, `/proc` is not trusted, or the process is gone).
    HeaderOnly,
    /// A root caller whose capabilities the kernel has checked itself
    /// (`default_permissions`); not looked up.
    KernelChecked,
}

const INLINE_GROUPS: usize = 32;

/// The supplementary groups of a caller, without a heap allocation for the
/// usual few.
#[derive(Clone, Debug)]
enum Groups {
    Inline(usize, [u32; INLINE_GROUPS]),
    Heap(Vec<u32>),
}

impl Groups {
    fn new() -> Self {
        Groups::Inline(0, [0; INLINE_GROUPS])
    }

    fn push(&mut self, g: u32) {
        match self {
            Groups::Inline(n, a) if *n < INLINE_GROUPS => {
                a[*n] = g;
                *n += 1;
            }
            Groups::Inline(n, a) => {
                let mut v = a[..*n].to_vec();
                v.push(g);
                *self = Groups::Heap(v);
            }
            Groups::Heap(v) => v.push(g),
        }
    }

    fn as_slice(&self) -> &[u32] {
        match self {
            Groups::Inline(n, a) => &a[..*n],
            Groups::Heap(v) => v,
        }
    }
}

/// The credentials of one request's caller. Groups and capabilities are
/// looked up on first use.
#[derive(Clone, Debug)]
pub struct Caller {
    uid: u32,
    gid: u32,
    pid: u32,
    /// The group the kernel sent with a create (`CREATE_SUPP_GROUP`).
    sent: Groups,
    policy: CallerPolicy,
    known: OnceCell<Known>,
}

/// What could be established about a caller beyond the header.
#[derive(Clone, Debug)]
struct Known {
    groups: Groups,
    /// Effective capabilities (bit n = capability n).
    caps: u64,
    origin: Origin,
}

/// Every capability bit.
const ALL_CAPS: u64 = u64::MAX;

/// What a thread serving a caller holds when the kernel has checked the
/// request itself (`default_permissions`): the capabilities that stand for
/// the kernel's decision on file permissions, ownership and set-ID bits,
/// so that the source filesystem neither repeats the check with less
/// knowledge (groups of a caller outside the pid namespace) nor refuses
/// what the kernel allowed. Set-ID bits the caller may not keep are
/// cleared on the kernel's word (`HANDLE_KILLPRIV_V2`).
const KERNEL_CHECKED_CAPS: u64 = (1 << cap::CHOWN)
    | (1 << cap::DAC_OVERRIDE)
    | (1 << cap::DAC_READ_SEARCH)
    | (1 << cap::FOWNER)
    | (1 << cap::FSETID);

impl Caller {
    /// The caller of a request from its header fields and the groups the
    /// kernel sent with it; nothing is looked up yet.
    pub(crate) fn resolve(
        uid: u32,
        gid: u32,
        pid: u32,
        sent: impl Iterator<Item = u32>,
        policy: &CallerPolicy,
    ) -> Caller {
        let mut g = Groups::new();
        for x in sent {
            g.push(x);
        }
        Caller {
            uid,
            gid,
            pid,
            sent: g,
            policy: *policy,
            known: OnceCell::new(),
        }
    }

    fn is_kernel_request(&self) -> bool {
        self.pid == 0 && self.uid == 0 && self.gid == 0
    }

    /// Whether the kernel named no caller: uid or gid `FUSE_INVALID_UIDGID`,
    /// which it sends, once `ALLOW_IDMAP` is granted, in every request but
    /// the creates (MKNOD, MKDIR, SYMLINK, CREATE, TMPFILE), on idmapped
    /// mounts and plain ones alike. The kernel has checked such a request
    /// (`ALLOW_IDMAP` needs `default_permissions`); a check of the
    /// filesystem's own cannot know whom to check.
    pub fn is_unmapped(&self) -> bool {
        self.uid == fuse_proto::consts::INVALID_UIDGID || self.gid == fuse_proto::consts::INVALID_UIDGID
    }

    fn known(&self) -> &Known {
        self.known.get_or_init(|| self.look_up())
    }

    fn look_up(&self) -> Known {
        let all = |origin| Known {
            groups: Groups::new(),
            caps: ALL_CAPS,
            origin,
        };
        if self.is_kernel_request() {
            return all(Origin::Kernel);
        }
        if self.uid == 0 && self.policy.kernel_checks {
            return all(Origin::KernelChecked);
        }
        self.look_up_process()
    }

    /// What `/proc` (or, for a root caller, `capget(2)`) tells of the
    /// calling process, without taking the kernel's check for granted.
    fn look_up_process(&self) -> Known {
        let (uid, gid, pid) = (self.uid, self.gid, self.pid);
        if pid == 0 {
            log_once(
                1,
                "a caller outside the connection's pid namespace (pid 0) is served without groups or capabilities",
            );
        } else if self.policy.proc.is_ok() {
            // A root caller with every capability the daemon has is served
            // as the daemon: one capget(2) tells, where /proc would take
            // three system calls and a parse on this frequent path.
            if uid == 0
                && let (Ok(eff), Ok(me)) = (capget_of(pid), Daemon::get())
                && eff & me.effective == me.effective
            {
                return Known {
                    groups: Groups::new(),
                    caps: eff,
                    origin: Origin::Proc,
                };
            }
            match read_status(pid) {
                Some(st) if st.fsuid == uid && st.fsgid == gid => {
                    return Known {
                        groups: st.groups,
                        caps: st.cap_eff,
                        origin: Origin::Proc,
                    };
                }
                Some(_) => log_once(
                    2,
                    "/proc/PID/status of a caller disagrees with the request's uid or gid (pid reused?); served without groups or capabilities",
                ),
                None => {}
            }
        }
        Known {
            groups: self.sent.clone(),
            caps: 0,
            origin: Origin::HeaderOnly,
        }
    }

    /// The caller's filesystem uid.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The caller's filesystem gid.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// The caller's thread id in the connection's pid namespace (0: none).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The supplementary groups known for the caller (see [`Caller::origin`]).
    pub fn groups(&self) -> &[u32] {
        self.known().groups.as_slice()
    }

    /// Whether `gid` is the caller's group or one of its known supplementary
    /// groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups().contains(&gid)
    }

    /// Whether the caller holds capability `cap` (a [`cap`] constant).
    pub fn has_capability(&self, cap: u32) -> bool {
        cap < 64 && self.known().caps & (1 << cap) != 0
    }

    /// Whether the calling process really holds capability `cap`, looked up
    /// even where [`Caller::has_capability`] stands for the kernel's check
    /// (a root caller while the kernel checks permissions counts as holding
    /// every capability there). For the decisions the kernel leaves to the
    /// filesystem without a word on the caller, such as whether a FALLOCATE
    /// or a COPY_FILE_RANGE clears set-ID bits (the kernel clears them for a
    /// caller without `CAP_FSETID`). What cannot be known counts as not held;
    /// the kernel's own requests hold everything. Not cached: meant for rare
    /// paths.
    pub fn holds_capability(&self, cap: u32) -> bool {
        if cap >= 64 {
            return false;
        }
        if self.is_kernel_request() {
            return true;
        }
        if self.uid == 0 && self.policy.kernel_checks {
            return self.look_up_process().caps & (1 << cap) != 0;
        }
        self.has_capability(cap)
    }

    /// The effective capability set (bit n = capability n).
    pub fn capabilities(&self) -> u64 {
        self.known().caps
    }

    /// Where these credentials came from.
    pub fn origin(&self) -> Origin {
        self.known().origin
    }

    /// Whether this is one of the kernel's own requests.
    pub fn is_kernel(&self) -> bool {
        self.is_kernel_request()
    }
}

/// What `/proc/PID/status` says of a thread.
struct Status {
    fsuid: u32,
    fsgid: u32,
    groups: Groups,
    cap_eff: u64,
}

/// Reads `/proc/PID/status` into a stack buffer (no allocation for the
/// usual size) and parses it; `None` if it cannot be read or parsed.
fn read_status(pid: u32) -> Option<Status> {
    let mut path = [0u8; 32];
    let mut w = 0;
    for b in b"/proc/" {
        path[w] = *b;
        w += 1;
    }
    let mut digits = [0u8; 10];
    let (mut n, mut d) = (pid, 0);
    loop {
        digits[d] = b'0' + (n % 10) as u8;
        d += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in (0..d).rev() {
        path[w] = digits[i];
        w += 1;
    }
    for b in b"/status\0" {
        path[w] = *b;
        w += 1;
    }
    // SAFETY: `path` is NUL-terminated and lives for the call.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 8192];
    let mut len = 0;
    while len < buf.len() {
        // SAFETY: reads into the unused tail of `buf`, which lives for the call.
        let r = unsafe { libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len) };
        if r <= 0 {
            break;
        }
        len += r as usize;
    }
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    parse_status(&buf[..len])
}

fn parse_status(s: &[u8]) -> Option<Status> {
    let (mut fsuid, mut fsgid, mut groups, mut cap_eff) = (None, None, None, None);
    for line in s.split(|&b| b == b'\n') {
        let line = std::str::from_utf8(line).ok()?;
        if let Some(v) = line.strip_prefix("Uid:") {
            fsuid = v.split_whitespace().nth(3)?.parse().ok();
        } else if let Some(v) = line.strip_prefix("Gid:") {
            fsgid = v.split_whitespace().nth(3)?.parse().ok();
        } else if let Some(v) = line.strip_prefix("Groups:") {
            let mut g = Groups::new();
            for x in v.split_whitespace() {
                g.push(x.parse().ok()?);
            }
            groups = Some(g);
        } else if let Some(v) = line.strip_prefix("CapEff:") {
            cap_eff = u64::from_str_radix(v.trim(), 16).ok();
        }
    }
    Some(Status {
        fsuid: fsuid?,
        fsgid: fsgid?,
        groups: groups?,
        cap_eff: cap_eff?,
    })
}

#[cfg(test)]
mod tests {
    use super::sys::{capget, setfsgid, setfsuid};
    use super::*;

    const STATUS: &str = "Name:\tcat\nUmask:\t0022\nState:\tR (running)\nTgid:\t42\nPid:\t42\n\
        Uid:\t1000\t1001\t1002\t1003\nGid:\t2000\t2001\t2002\t2003\n\
        Groups:\t4 24 1000 \nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n\
        CapEff:\t0000000000200001\n";

    #[test]
    fn status_gives_fs_ids_groups_and_effective_caps() {
        let st = parse_status(STATUS.as_bytes()).expect("parses");
        assert_eq!((st.fsuid, st.fsgid), (1003, 2003));
        assert_eq!(st.groups.as_slice(), &[4, 24, 1000]);
        assert_eq!(st.cap_eff, (1 << cap::SYS_ADMIN) | (1 << cap::CHOWN));
    }

    #[test]
    fn status_without_a_field_is_refused() {
        let cut = STATUS.replace("CapEff:\t0000000000200001\n", "");
        assert!(parse_status(cut.as_bytes()).is_none());
    }

    #[test]
    fn many_groups_spill_to_the_heap_in_order() {
        let mut g = Groups::new();
        for i in 0..100 {
            g.push(i);
        }
        assert_eq!(g.as_slice(), (0..100).collect::<Vec<_>>().as_slice());
    }

    fn policy(proc: Result<(), &'static str>, kernel_checks: bool) -> CallerPolicy {
        CallerPolicy { proc, kernel_checks }
    }

    #[test]
    fn pid_zero_is_root_only_for_the_kernels_own_requests() {
        let p = policy(Ok(()), false);
        let k = Caller::resolve(0, 0, 0, [].into_iter(), &p);
        assert!(k.is_kernel() && k.has_capability(cap::DAC_OVERRIDE));
        let outside = Caller::resolve(65534, 65534, 0, [].into_iter(), &p);
        assert_eq!(outside.origin(), Origin::HeaderOnly);
        assert_eq!(outside.capabilities(), 0);
        assert!(outside.groups().is_empty());
        let root_gid = Caller::resolve(0, 1000, 0, [].into_iter(), &p);
        assert_eq!(
            root_gid.capabilities(),
            0,
            "uid 0 outside the namespace is not root"
        );
    }

    #[test]
    fn untrusted_proc_keeps_only_the_kernels_group() {
        let p = policy(Err("test"), false);
        let me = std::process::id();
        let c = Caller::resolve(65534, 65534, me, [77].into_iter(), &p);
        assert_eq!(c.origin(), Origin::HeaderOnly);
        assert_eq!(c.groups(), &[77]);
        assert!(c.in_group(77) && c.in_group(65534) && !c.in_group(0));
    }

    #[test]
    fn proc_is_believed_only_when_it_agrees_with_the_header() {
        let p = policy(Ok(()), false);
        let me = std::process::id();
        let (uid, gid) = (setfsuid(u32::MAX), setfsgid(u32::MAX));
        let c = Caller::resolve(uid, gid, me, [].into_iter(), &p);
        assert_eq!(c.origin(), Origin::Proc);
        let liar = Caller::resolve(uid.wrapping_add(1), gid, me, [].into_iter(), &p);
        assert_eq!(liar.origin(), Origin::HeaderOnly);
        assert_eq!(liar.capabilities(), 0);
    }

    #[test]
    fn a_root_caller_with_the_daemons_capabilities_needs_one_capget() {
        let me = std::process::id();
        let c = Caller::resolve(0, 0, me, [].into_iter(), &policy(Ok(()), false));
        assert_eq!(c.origin(), Origin::Proc);
        assert_eq!(c.capabilities(), capget().unwrap().0);
    }

    #[test]
    fn root_is_not_looked_up_when_the_kernel_checks() {
        let c = Caller::resolve(0, 0, 999_999_999, [].into_iter(), &policy(Ok(()), true));
        assert_eq!(c.origin(), Origin::KernelChecked);
        let c = Caller::resolve(0, 0, 999_999_999, [].into_iter(), &policy(Ok(()), false));
        assert_eq!(c.origin(), Origin::HeaderOnly);
        assert_eq!(c.capabilities(), 0, "a vanished root caller gets no capabilities");
    }
}

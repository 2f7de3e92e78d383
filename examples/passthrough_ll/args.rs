//! The command line: `passthrough_ll [-f] [-d] [-s] [-o opt,...] [--stats FILE] [SOURCE] MOUNTPOINT`.
//!
//! `-o` may appear anywhere (mount.fuse3 puts it after the mountpoint). With
//! two positional arguments the first is the source directory, as mount.fuse3
//! passes an fstab line's first field; `-o source=DIR` wins over it.

use crate::fs::{Cache, FsOptions};
use crate::inodes::HandleMode;
use fuse_wire::session::mount::MountOptions;
use std::path::PathBuf;
use std::time::Duration;

/// Everything the command line says.
#[derive(Debug)]
pub struct Args {
    pub mountpoint: PathBuf,
    pub source: PathBuf,
    pub mount: MountOptions,
    pub fs: FsOptions,
    pub threads: usize,
    /// Most workers running handlers at once (0: the session's default).
    pub max_threads: usize,
    /// How long a worker above `threads` (or a lock-wait helper) stays idle
    /// before it ends (`None`: the session's default).
    pub idle_timeout: Option<Duration>,
    /// Most blocking lock waits of one uid at once (0: the session's default).
    pub max_waits_per_uid: usize,
    /// Ring entries per io_uring queue (0: the session's default).
    pub queue_depth: usize,
    /// `fd_cache=`, when given (otherwise sized from the open-file limit,
    /// see `fdcache::fit`).
    pub fd_cache: Option<usize>,
    pub clone_fd: bool,
    pub atomic_open: bool,
    pub uring: bool,
    /// Leave large WRITE payloads in a pipe (`splice_write`); the
    /// smallest such payload (`splice_write_min=`, 0: the session's default).
    pub splice_write: bool,
    pub splice_write_min: usize,
    /// `serial_o_direct`: turn off the session's `O_DIRECT` default
    /// (`SessionConfig::o_direct_parallel_writes`).
    pub serial_o_direct: bool,
    /// Why kernel passthrough is off although the user did not turn it off
    /// (`None`: on, or off by `no_passthrough`), for the log at start.
    pub passthrough_off: Option<&'static str>,
    pub stats: Option<PathBuf>,
    pub debug: bool,
    /// Keep the mount in this process and serve it from a child that a
    /// crash or an upgrade replaces (`-o keeper`).
    pub keeper: bool,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    Run(Box<Args>),
    Help,
    Version,
}

pub const USAGE: &str = "\
usage: passthrough_ll [-f] [-d] [-s] [-o opt,[opt...]] [--stats FILE] [SOURCE] MOUNTPOINT

Mirrors the directory SOURCE (or -o source=DIR; default /) at MOUNTPOINT.
Runs in the foreground until unmounted, SIGINT or SIGTERM.

    -f                 foreground (always)
    -d                 debug logging (also -o debug)
    -s                 one worker thread
    --stats FILE       write the session's statistics as JSON to FILE at exit
    -h, --help         this help
    -V, --version      version

filesystem options (-o):
    source=DIR         directory to mirror (default /)
    cache=never|auto|always
                       entry/attribute timeouts 0 / 1 s / 86400 s; never opens
                       with DIRECT_IO, always with KEEP_CACHE (default auto)
    timeout=SECS       entry/attribute timeout (overrides cache's)
    negative_timeout=SECS
                       how long the kernel may cache that a name does not exist
                       (default 0: every miss is looked up again)
    writeback, no_writeback   kernel writeback cache (default off)
    idmap              let the mount be idmapped (ALLOW_IDMAP; needs default_permissions,
                       not with xattr). The kernel then names the caller only in
                       creates: other requests run as the daemon, after the
                       kernel's checks, and count as one user in per-user shares
    xattr, no_xattr    extended attributes and POSIX ACLs (default off); with
                       default_permissions the kernel checks the ACLs too
    flock              BSD flock locks served by the daemon
    posix_lock         POSIX locks served by the daemon (open file description locks)
    readdirplus, no_readdirplus   (default on)
    inode_file_handles=never|prefer|mandatory
                       know inodes by file handle (name_to_handle_at) and reopen
                       their descriptors on demand (open_by_handle_at, as root),
                       so any number of inodes cost at most fd_cache descriptors;
                       never: one O_PATH descriptor per inode the kernel knows;
                       prefer: handles when the source's filesystem gives them,
                       checked at start (default); mandatory: refuse to start
                       without them. Inodes on filesystems mounted below the
                       source keep a descriptor each in every mode. With file
                       handles the mount's own file handles (open_by_handle_at,
                       NFS export) work after the kernel dropped the inode
                       (FUSE_EXPORT_SUPPORT); with never, only while it caches it
    fd_cache=N         most descriptors kept open in file-handle mode, beside
                       those of open files (default 4096, or half of what the open
                       file limit leaves after the daemon's threads; a cache that
                       does not fit the limit is refused at start)
                       Open files take what the cache leaves of the limit: half
                       of them keep their descriptor while used (idle ones close
                       it and reopen on next use), the other half is for files
                       that must keep it (flock-locked, directories, O_DIRECT,
                       devices, unnamed), an eighth of those per user: past it
                       that user's such opens get EMFILE (docs/security.md)
    threads=N          worker threads to start and keep (default: two per CPU)
    max_threads=N      most workers running handlers at once (default: max(4 x threads, 16))
    idle_timeout=SECS  how long a worker above threads stays idle before it ends (default 10)
    queue_depth=N      io_uring entries per queue, with uring (default 8)
    max_waits_per_uid=N
                       most blocking lock waits (flock, posix_lock) of one user at once;
                       beyond it the lock request fails with ENOLCK (default 32; never
                       more than half of the session's waits, nor over io_uring half
                       of those a queue allows, so that other users can still wait)
    clone_fd, no_clone_fd     one /dev/fuse fd per worker (default on)
    passthrough, no_passthrough
                       kernel passthrough of regular files: the kernel reads and
                       writes the source file itself, O_DIRECT included, without the
                       daemon. On by default where it can be: the kernel offers it,
                       the daemon has CAP_SYS_ADMIN, and none of writeback,
                       atomic_open, keeper, parallel_direct_writes, splice_write,
                       cache=never or noatime is given (a log line at start says
                       why it is off). An open the kernel refuses a backing file
                       (e.g. a source on overlayfs) is served by the daemon.
                       passthrough asks for it and refuses what it cannot be
                       combined with; no_passthrough turns it off
    parallel_direct_writes    open every file with DIRECT_IO | PARALLEL_DIRECT_WRITES
                       (O_DIRECT opens the daemon serves get both by default,
                       buffered ones keep the page cache; in kernel passthrough
                       mode the kernel does O_DIRECT on the source file itself)
    serial_o_direct    O_DIRECT opens the daemon serves without the session's DIRECT_IO |
                       PARALLEL_DIRECT_WRITES: their writes to one file run one at a time
    splice, no_splice  answer reads of 32 KiB and more with splice(2) from the source
                       file, so their data does not pass through the daemon's memory
                       (default on; O_DIRECT handles always read into memory)
    splice_write, no_splice_write
                       receive requests with splice(2) and move the data of WRITEs of
                       64 KiB and more from the pipe into the source file, not through
                       the daemon's memory (default off; see docs/performance.md);
                       max_write defaults to 512 KiB with it (a request must fit a
                       1 MiB pipe)
    splice_write_min=BYTES    smallest WRITE spliced with splice_write (default 65536)
    max_write=BYTES    largest WRITE the kernel sends (4096 to 1048576; default 1 MiB)
    atomic_open        decode the out-of-tree atomic-open request (not with passthrough)
    uring, no_uring    serve requests over FUSE-over-io_uring when the kernel allows it
                       (enable_uring=Y); otherwise /dev/fuse, with the reason logged
    keeper             keep the mount in this process and serve it from a child; a
                       child that dies is replaced and takes over with the node table
                       and the open files (SIGUSR2: upgrade to the binary on disk;
                       docs/recovery.md). /dev/fuse only; needs file handles, and
                       neither passthrough nor posix_lock
    keeper_nodes=N     nodes the kernel may hold at once under keeper (default 1048576;
                       the kept table takes memory only as it is used)

    no_default_permissions    with allow_other, leave permission checks to the daemon
                       and the source filesystem instead of the kernel (see below)

mount options: fsname=, subtype=, allow_other, allow_root, default_permissions,
    ro, rw, [no]suid, [no]dev, [no]exec, [no]atime, [no]diratime, sync, async,
    dirsync, max_read=, auto_unmount,
    nonempty_check     refuse a mountpoint that is not empty (default: mount, and log it)
    stack              mount where something is mounted already, hiding it (default: refuse)

With allow_other, default_permissions is on unless no_default_permissions is
given: the kernel then checks every access against the file modes and ACLs as
on a local filesystem. Without it, requests run with each caller's identity on
the source filesystem, and entries below directories that not everyone may
search are not cached (docs/security.md).
";

/// fstab and mount(8) options that mean nothing to the filesystem itself.
const IGNORED: &[&str] = &[
    "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group", "_netdev", "nofail",
    "nonempty", "debug",
];

/// Parses the arguments after the program name.
pub fn parse(argv: &[String]) -> Result<Command, String> {
    let flags = match crate::cli::lex(argv, true)? {
        crate::cli::Parsed::Run(f) => f,
        crate::cli::Parsed::Help => return Ok(Command::Help),
        crate::cli::Parsed::Version => return Ok(Command::Version),
    };
    let crate::cli::Flags {
        opts,
        mut source,
        mountpoint,
        mut debug,
        single,
        stats,
    } = flags;
    let all = opts.join(",");
    let (mut mount, rest) = MountOptions::parse_known(&all).map_err(|e| e.to_string())?;
    let mut fs = FsOptions::default();
    let mut timeout: Option<f64> = None;
    let mut threads = if single { 1 } else { 0 };
    let mut max_threads = 0;
    let mut idle_timeout = None;
    let mut max_waits_per_uid = 0;
    let mut queue_depth = 0;
    let mut fd_cache = None;
    let mut clone_fd = true;
    let mut atomic_open = false;
    let mut uring = false;
    let mut splice_write = false;
    let mut splice_write_min = 0;
    let mut serial_o_direct = false;
    let mut no_default_permissions = false;
    let mut keeper = false;
    // `passthrough` (Some(true)), `no_passthrough` (Some(false)), or neither.
    let mut passthrough = None;
    for o in &rest {
        let (k, v) = match o.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (o.as_str(), None),
        };
        let flag = |on: bool| -> Result<bool, String> {
            match v {
                None => Ok(on),
                Some(_) => Err(format!("option `{k}` takes no value")),
            }
        };
        let value = || v.ok_or_else(|| format!("option `{k}` needs a value"));
        match k {
            "source" => source = Some(PathBuf::from(value()?)),
            "no_default_permissions" => no_default_permissions = flag(true)?,
            "cache" => {
                fs.cache = match value()? {
                    "never" => Cache::Never,
                    "auto" => Cache::Auto,
                    "always" => Cache::Always,
                    x => return Err(format!("cache={x}: expected never, auto or always")),
                }
            }
            "timeout" => {
                let t: f64 = value()?
                    .parse()
                    .map_err(|_| format!("timeout={}: not a number of seconds", v.unwrap_or("")))?;
                if !(0.0..=1e9).contains(&t) {
                    return Err(format!("timeout={t}: out of range"));
                }
                timeout = Some(t);
            }
            "negative_timeout" => {
                let t: f64 = value()?
                    .parse()
                    .map_err(|_| format!("negative_timeout={}: not a number of seconds", v.unwrap_or("")))?;
                if !(0.0..=1e9).contains(&t) {
                    return Err(format!("negative_timeout={t}: out of range"));
                }
                fs.negative_timeout = Duration::from_secs_f64(t);
            }
            "writeback" => fs.writeback = flag(true)?,
            "no_writeback" => fs.writeback = flag(false)?,
            "idmap" => fs.idmap = flag(true)?,
            "xattr" => fs.xattr = flag(true)?,
            "no_xattr" => fs.xattr = flag(false)?,
            "flock" => fs.flock = flag(true)?,
            "no_flock" => fs.flock = flag(false)?,
            "posix_lock" => fs.posix_lock = flag(true)?,
            "no_posix_lock" => fs.posix_lock = flag(false)?,
            "readdirplus" => fs.readdirplus = flag(true)?,
            "no_readdirplus" => fs.readdirplus = flag(false)?,
            "passthrough" => passthrough = Some(flag(true)?),
            "no_passthrough" => passthrough = Some(!flag(true)?),
            "parallel_direct_writes" => fs.parallel_direct_writes = flag(true)?,
            "serial_o_direct" => serial_o_direct = flag(true)?,
            "inode_file_handles" => {
                fs.inode_file_handles = match value()? {
                    "never" => HandleMode::Never,
                    "prefer" => HandleMode::Prefer,
                    "mandatory" => HandleMode::Mandatory,
                    x => {
                        return Err(format!(
                            "inode_file_handles={x}: expected never, prefer or mandatory"
                        ));
                    }
                }
            }
            "fd_cache" => {
                fd_cache = value()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=1 << 20).contains(n))
                    .map(Some)
                    .ok_or_else(|| format!("fd_cache={}: expected 1 to 1048576", v.unwrap_or("")))?
            }
            "splice" => fs.splice = flag(true)?,
            "no_splice" => fs.splice = flag(false)?,
            "splice_write" => splice_write = flag(true)?,
            "no_splice_write" => splice_write = flag(false)?,
            "splice_write_min" => {
                splice_write_min = value()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=1 << 20).contains(n))
                    .ok_or_else(|| format!("splice_write_min={}: expected 1 to 1048576", v.unwrap_or("")))?
            }
            "max_write" => {
                fs.max_write = Some(
                    value()?
                        .parse()
                        .ok()
                        .filter(|n| (4096..=1 << 20).contains(n))
                        .ok_or_else(|| format!("max_write={}: expected 4096 to 1048576", v.unwrap_or("")))?,
                )
            }
            "atomic_open" => atomic_open = flag(true)?,
            "uring" => uring = flag(true)?,
            "no_uring" => uring = flag(false)?,
            "clone_fd" => clone_fd = flag(true)?,
            "no_clone_fd" => clone_fd = flag(false)?,
            "threads" => {
                threads = value()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=1024).contains(n))
                    .ok_or_else(|| format!("threads={}: expected 1 to 1024", v.unwrap_or("")))?
            }
            "max_threads" => {
                max_threads = value()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=4096).contains(n))
                    .ok_or_else(|| format!("max_threads={}: expected 1 to 4096", v.unwrap_or("")))?
            }
            "queue_depth" => {
                queue_depth = value()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=4096).contains(n))
                    .ok_or_else(|| format!("queue_depth={}: expected 1 to 4096", v.unwrap_or("")))?
            }
            "max_waits_per_uid" => {
                max_waits_per_uid = value()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=1 << 16).contains(n))
                    .ok_or_else(|| format!("max_waits_per_uid={}: expected 1 to 65536", v.unwrap_or("")))?
            }
            "idle_timeout" => {
                let t: f64 = value()?
                    .parse()
                    .map_err(|_| format!("idle_timeout={}: not a number of seconds", v.unwrap_or("")))?;
                if !(0.001..=1e6).contains(&t) {
                    return Err(format!("idle_timeout={t}: out of range"));
                }
                idle_timeout = Some(Duration::from_secs_f64(t));
            }
            "keeper" => keeper = flag(true)?,
            "keeper_nodes" => {
                fs.keeper_nodes = value()?
                    .parse()
                    .ok()
                    .filter(|n| (64..=1 << 26).contains(n))
                    .ok_or_else(|| format!("keeper_nodes={}: expected 64 to 67108864", v.unwrap_or("")))?
            }
            "debug" => debug = true,
            k if IGNORED.contains(&k) || k.starts_with("x-") || k == "comment" => {}
            _ => return Err(format!("unknown option `{o}`")),
        }
    }
    fs.timeout = match (timeout, fs.cache) {
        (Some(t), _) => Duration::from_secs_f64(t),
        (None, Cache::Never) => Duration::ZERO,
        (None, Cache::Auto) => Duration::from_secs(1),
        (None, Cache::Always) => Duration::from_secs(86400),
    };
    if no_default_permissions && mount.default_permissions {
        return Err("`default_permissions` and `no_default_permissions` contradict each other".into());
    }
    // Shared with other users, the kernel checks permissions unless told
    // otherwise: without it a cached entry skips directory search checks
    // (see docs/security.md).
    if mount.allow_other && !no_default_permissions {
        mount.default_permissions = true;
    }
    fs.default_permissions = mount.default_permissions;
    fs.noatime = mount.noatime;
    if fs.idmap && !fs.default_permissions {
        return Err(
            "`idmap` needs `default_permissions`: the kernel grants idmapped mounts only \
                    to a filesystem whose permissions it checks"
                .into(),
        );
    }
    if fs.idmap && fs.xattr {
        return Err(
            "`idmap` and `xattr` cannot be combined: on an idmapped mount the kernel \
                    names no caller in a LISTXATTR, and trusted.* names are hidden from \
                    unprivileged callers only by listing as the caller"
                .into(),
        );
    }
    let mut passthrough_off = None;
    match passthrough {
        Some(on) => {
            fs.passthrough = on;
            fs.passthrough_forced = on;
        }
        None => {
            passthrough_off = default_passthrough_blocker(&fs, atomic_open, keeper, splice_write);
            fs.passthrough = passthrough_off.is_none();
        }
    }
    if fs.passthrough_forced && fs.writeback {
        return Err(
            "`passthrough` and `writeback` cannot be combined: the kernel refuses passthrough \
                    on a connection with the writeback cache (drop one of them)"
                .into(),
        );
    }
    if fs.passthrough_forced && atomic_open {
        return Err(
            "`passthrough` and `atomic_open` cannot be combined: the atomic-open extension's \
                    FOPEN_FILE_CREATED is the same bit as FOPEN_PASSTHROUGH"
                .into(),
        );
    }
    if keeper {
        crate::fs::check_keeper_options(&fs)?;
    }
    if mount.subtype.is_none() {
        mount.subtype = Some("passthrough_ll".into());
    }
    let source = source.unwrap_or_else(|| PathBuf::from("/"));
    if splice_write && fs.max_write.is_none() {
        // A whole request must fit the session's 1 MiB pipe.
        fs.max_write = Some(512 * 1024);
    }
    if mount.fsname.is_none() {
        let s = source.to_string_lossy();
        if !s.contains([',', '\0']) {
            mount.fsname = Some(s.into_owned());
        }
    }
    Ok(Command::Run(Box::new(Args {
        mountpoint,
        source,
        mount,
        fs,
        threads,
        max_threads,
        idle_timeout,
        max_waits_per_uid,
        queue_depth,
        fd_cache,
        clone_fd,
        atomic_open,
        uring,
        splice_write,
        splice_write_min,
        serial_o_direct,
        passthrough_off,
        stats,
        debug,
        keeper,
    })))
}

/// Why kernel passthrough cannot be the default with these options, or
/// `None` when it can. None of them is refused with passthrough off: the
/// default gives way, where `-o passthrough` refuses what it cannot be
/// combined with (checked in [`parse`]).
fn default_passthrough_blocker(
    fs: &FsOptions,
    atomic_open: bool,
    keeper: bool,
    splice_write: bool,
) -> Option<&'static str> {
    Some(if fs.writeback {
        "writeback: the kernel refuses passthrough on a connection with the writeback cache"
    } else if atomic_open {
        "atomic_open: the atomic-open extension's FOPEN_FILE_CREATED is the bit of FOPEN_PASSTHROUGH"
    } else if keeper {
        "keeper: the kernel's backing files are registered by the serving daemon and would not outlive it"
    } else if fs.parallel_direct_writes {
        "parallel_direct_writes: DIRECT_IO on every open sends reads and writes to the daemon"
    } else if fs.cache == Cache::Never {
        "cache=never: every read and write is to reach the daemon (DIRECT_IO opens)"
    } else if fs.noatime {
        "noatime: the kernel opens its own backing files with the caller's flags, without \
         O_NOATIME, so reads would move the source's access times"
    } else if splice_write {
        "splice_write: WRITE payloads are to reach the daemon, to be spliced"
    } else {
        return None;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Args, String> {
        let v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match parse(&v)? {
            Command::Run(a) => Ok(*a),
            c => Err(format!("{c:?}")),
        }
    }

    #[test]
    fn one_positional_is_the_mountpoint() {
        let a = run(&["-f", "-o", "source=/srv,cache=never", "/mnt"]).unwrap();
        assert_eq!(a.mountpoint, PathBuf::from("/mnt"));
        assert_eq!(a.source, PathBuf::from("/srv"));
        assert_eq!(a.fs.cache, Cache::Never);
        assert_eq!(a.fs.timeout, Duration::ZERO);
        assert_eq!(a.mount.subtype.as_deref(), Some("passthrough_ll"));
        assert_eq!(a.mount.fsname.as_deref(), Some("/srv"));
        assert!(a.fs.splice);
        assert!(!run(&["-o", "no_splice", "/mnt"]).unwrap().fs.splice);
        let a = run(&["-o", "splice_write", "/mnt"]).unwrap();
        assert!(a.splice_write && a.fs.max_write == Some(512 * 1024) && a.splice_write_min == 0);
        let a = run(&[
            "-o",
            "splice_write,max_write=131072,splice_write_min=4096",
            "/mnt",
        ])
        .unwrap();
        assert_eq!((a.fs.max_write, a.splice_write_min), (Some(131072), 4096));
        assert!(!run(&["/mnt"]).unwrap().splice_write);
        assert!(run(&["-o", "max_write=100", "/mnt"]).is_err());
    }

    #[test]
    fn mount_fuse3_form_source_mountpoint_then_options() {
        let a = run(&[
            "/data",
            "/mnt",
            "-o",
            "rw,nodev,allow_other,xattr,threads=3,_netdev",
        ])
        .unwrap();
        assert_eq!(a.source, PathBuf::from("/data"));
        assert_eq!(a.mountpoint, PathBuf::from("/mnt"));
        assert!(a.mount.allow_other);
        assert!(a.fs.xattr);
        assert_eq!(a.threads, 3);
        // -o source= wins over the positional source.
        let a = run(&["dummy", "/mnt", "-osource=/real"]).unwrap();
        assert_eq!(a.source, PathBuf::from("/real"));
    }

    #[test]
    fn cache_timeouts_and_overrides() {
        assert_eq!(run(&["/m"]).unwrap().fs.timeout, Duration::from_secs(1));
        let a = run(&["-o", "cache=always", "/m"]).unwrap();
        assert_eq!(a.fs.timeout, Duration::from_secs(86400));
        let a = run(&["-o", "cache=always,timeout=2.5", "/m"]).unwrap();
        assert_eq!(a.fs.timeout, Duration::from_millis(2500));
        assert!(run(&["-o", "cache=sometimes", "/m"]).is_err());
        assert!(run(&["-o", "timeout=x", "/m"]).is_err());
        assert_eq!(run(&["/m"]).unwrap().fs.negative_timeout, Duration::ZERO);
        let a = run(&["-o", "negative_timeout=30", "/m"]).unwrap();
        assert_eq!(a.fs.negative_timeout, Duration::from_secs(30));
        assert!(run(&["-o", "negative_timeout=-1", "/m"]).is_err());
    }

    #[test]
    fn conflicts_and_unknowns_are_errors() {
        let e = run(&["-o", "passthrough,writeback", "/m"]).unwrap_err();
        assert!(e.contains("writeback"), "{e}");
        assert!(run(&["-o", "passthrough,atomic_open", "/m"]).is_err());
        assert!(run(&["-o", "bogus", "/m"]).is_err());
        assert!(run(&["-o", "threads=0", "/m"]).is_err());
        assert!(run(&["-o", "xattr=1", "/m"]).is_err());
        assert!(run(&[]).is_err());
        assert!(run(&["a", "b", "c"]).is_err());
        assert!(run(&["-x", "/m"]).is_err());
        assert!(run(&["-o", "uring=1", "/m"]).is_err());
    }

    #[test]
    fn passthrough_is_the_default_unless_an_option_excludes_it() {
        let a = run(&["/m"]).unwrap();
        assert!(a.fs.passthrough && !a.fs.passthrough_forced && a.passthrough_off.is_none());
        let a = run(&["-o", "no_passthrough", "/m"]).unwrap();
        assert!(!a.fs.passthrough && !a.fs.passthrough_forced && a.passthrough_off.is_none());
        let a = run(&["-o", "passthrough", "/m"]).unwrap();
        assert!(a.fs.passthrough && a.fs.passthrough_forced);
        let a = run(&["-o", "passthrough,no_passthrough", "/m"]).unwrap();
        assert!(!a.fs.passthrough);
        assert!(run(&["-o", "no_passthrough=1", "/m"]).is_err());
        // What excludes it turns the default off, saying why, and is never
        // refused for it; with `passthrough` it is.
        for opt in [
            "writeback",
            "atomic_open",
            "keeper",
            "parallel_direct_writes",
            "cache=never",
            "splice_write",
            "noatime",
        ] {
            let a = run(&["-o", opt, "/m"]).unwrap_or_else(|e| panic!("{opt}: {e}"));
            assert!(!a.fs.passthrough, "{opt}");
            let why = a.passthrough_off.unwrap_or_else(|| panic!("{opt}: no reason"));
            assert!(why.starts_with(opt), "{opt}: {why}");
            let a = run(&["-o", &format!("{opt},no_passthrough"), "/m"]).unwrap();
            assert!(!a.fs.passthrough && a.passthrough_off.is_none(), "{opt}");
        }
        for opt in ["writeback", "atomic_open", "keeper"] {
            assert!(
                run(&["-o", &format!("{opt},passthrough"), "/m"]).is_err(),
                "{opt}"
            );
        }
    }

    #[test]
    fn allow_other_brings_default_permissions_unless_refused() {
        let a = run(&["-o", "allow_other", "/m"]).unwrap();
        assert!(a.mount.default_permissions && a.fs.default_permissions);
        let a = run(&["-o", "allow_other,no_default_permissions", "/m"]).unwrap();
        assert!(!a.mount.default_permissions && !a.fs.default_permissions);
        let a = run(&["/m"]).unwrap();
        assert!(!a.mount.default_permissions);
        assert!(run(&["-o", "default_permissions,no_default_permissions", "/m"]).is_err());
    }

    #[test]
    fn toggles_and_flags() {
        let a = run(&[
            "-d",
            "-s",
            "--stats",
            "/tmp/s.json",
            "-o",
            "writeback,no_writeback,no_readdirplus,flock,posix_lock,no_clone_fd,parallel_direct_writes,serial_o_direct",
            "/m",
        ])
        .unwrap();
        assert!(a.debug && !a.fs.writeback && !a.fs.readdirplus && a.fs.flock && a.fs.posix_lock);
        assert!(!a.clone_fd && a.fs.parallel_direct_writes && a.serial_o_direct);
        assert_eq!(a.threads, 1);
        assert_eq!(a.stats, Some(PathBuf::from("/tmp/s.json")));
        assert!(matches!(parse(&["-h".to_string()]), Ok(Command::Help)));
    }

    #[test]
    fn file_handle_options() {
        let a = run(&["/m"]).unwrap();
        assert_eq!(a.fs.inode_file_handles, HandleMode::Prefer);
        assert_eq!(a.fd_cache, None);
        let a = run(&["-o", "inode_file_handles=never,fd_cache=100", "/m"]).unwrap();
        assert_eq!(a.fs.inode_file_handles, HandleMode::Never);
        assert_eq!(a.fd_cache, Some(100));
        let a = run(&["-o", "inode_file_handles=mandatory", "/m"]).unwrap();
        assert_eq!(a.fs.inode_file_handles, HandleMode::Mandatory);
        assert!(run(&["-o", "inode_file_handles=always", "/m"]).is_err());
        assert!(run(&["-o", "inode_file_handles", "/m"]).is_err());
        assert!(run(&["-o", "fd_cache=0", "/m"]).is_err());
        assert!(run(&["-o", "fd_cache=x", "/m"]).is_err());
        let a = run(&["-o", "keeper,keeper_nodes=4096", "/m"]).unwrap();
        assert!(a.keeper);
        assert_eq!(a.fs.keeper_nodes, 4096);
        for bad in [
            "keeper,inode_file_handles=never",
            "keeper,passthrough",
            "keeper,posix_lock",
        ] {
            let e = run(&["-o", bad, "/m"]).unwrap_err();
            assert!(e.contains("-o keeper"), "{bad}: {e}");
        }
        assert!(run(&["-o", "keeper_nodes=1", "/m"]).is_err());
    }
}

//! The command line: `memfs [-f] [-d] [-s] [-o opt,...] [SOURCE] MOUNTPOINT`,
//! with passthrough_ll's conventions.
//!
//! `-o` may appear anywhere (mount.fuse3 puts it after the mountpoint). With
//! two positional arguments the first is the source, as mount.fuse3 passes
//! an fstab line's first field: memfs has nothing to read from, so it only
//! names the filesystem in the mount table (`fsname=` wins over it). memfs
//! always runs in the foreground: `-f` is accepted, for mount.fuse3 and
//! scripts written for other FUSE filesystems, and changes nothing.

use crate::fs::{MemFsConfig, capacity};
use fuse_wire::session::mount::MountOptions;
use fuse_wire::session::{SessionConfig, Transport};
use std::path::PathBuf;
use std::time::Duration;

/// Everything the command line says.
pub struct Args {
    pub mountpoint: PathBuf,
    pub mount: MountOptions,
    pub fs: MemFsConfig,
    pub session: SessionConfig,
    /// Debug logging (`-d`, `-o debug`).
    pub debug: bool,
    /// Keep the mount in this process and serve it from a child (`-o keeper`).
    pub keeper: bool,
}

/// What the command line asks for.
/// What the command line asks for.
pub type Command = crate::cli::Parsed<Box<Args>>;

pub const USAGE: &str = "\
usage: memfs [-f] [-d] [-s] [-o opt,[opt...]] [SOURCE] MOUNTPOINT

Serves an empty in-memory filesystem at MOUNTPOINT. Runs in the foreground
until unmounted, SIGINT or SIGTERM, then prints the session's statistics as
JSON on stderr. SOURCE (mount.fuse3 passes an fstab line's first field)
only names the filesystem in the mount table.

    -f                 foreground (always: accepted, changes nothing)
    -d                 debug logging (also -o debug)
    -s                 one worker thread
    -h, --help         this help
    -V, --version      version

filesystem options (-o):
    size=BYTES         most memory the contents and metadata may take, with a
                       k, m, g or t suffix or N% of the RAM (default 50%; 0: no
                       limit); past it, ENOSPC (ENOLCK for locks)
    nr_inodes=N        most inodes and extra hard links, with a k, m or g suffix
                       (default: one per page of half the RAM; 0: no limit)
    ttl=SECS           how long the kernel may cache names and attributes (default 1)
    posix_lock         POSIX record locks (and OFD locks) served by memfs
    flock              BSD flock locks served by memfs
    threads=N          worker threads to start and keep (default: two per CPU)
    idle_timeout=SECS  how long a worker above threads stays idle before it ends
    max_waits_per_uid=N
                       most blocking lock waits of one user at once; beyond it
                       the lock request fails with ENOLCK (default 32)
    uring              serve requests over FUSE-over-io_uring when the kernel
                       allows it (enable_uring=Y); otherwise /dev/fuse
    keeper             keep the mount in this process and serve it from a child,
                       replaced when it dies (its files are then lost: stale
                       node ids answer ESTALE); SIGUSR2 upgrades to the binary
                       on disk, keeping every file, open file and lock

mount options: fsname=, subtype=, allow_other, allow_root, default_permissions,
    ro, rw, [no]suid, [no]dev, [no]exec, [no]atime, [no]diratime, sync, async,
    dirsync, max_read=, auto_unmount
";

/// fstab and mount(8) options that mean nothing to the filesystem itself.
const IGNORED: &[&str] = &[
    "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group", "_netdev", "nofail",
    "nonempty",
];

fn seconds(key: &str, v: &str) -> Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("{key}={v}: expected seconds"))
}

fn positive(key: &str, v: &str) -> Result<usize, String> {
    v.parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{key}={v}: expected a positive number"))
}

/// Parses the arguments after the program name.
pub fn parse(argv: &[String]) -> Result<Command, String> {
    let flags = match crate::cli::lex(argv, false)? {
        crate::cli::Parsed::Run(f) => f,
        crate::cli::Parsed::Help => return Ok(Command::Help),
        crate::cli::Parsed::Version => return Ok(Command::Version),
    };
    let crate::cli::Flags {
        opts,
        source,
        mountpoint,
        mut debug,
        single,
        ..
    } = flags;
    let source = source.map(|p| p.to_string_lossy().into_owned());
    let (mut mount, ours) = MountOptions::parse_known(&opts.join(",")).map_err(|e| e.to_string())?;
    let mut fs = MemFsConfig {
        default_permissions: mount.default_permissions,
        ..MemFsConfig::default()
    };
    let mut session = SessionConfig::default();
    let mut keeper = false;
    if single {
        session.workers = 1;
    }
    for o in &ours {
        let (k, v) = match o.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (o.as_str(), None),
        };
        let flag = || match v {
            None => Ok(true),
            Some(_) => Err(format!("option `{k}` takes no value")),
        };
        let value = || v.ok_or_else(|| format!("option `{k}` needs a value"));
        match k {
            "threads" => session.workers = positive(k, value()?)?,
            "ttl" => fs.ttl = seconds(k, value()?)?,
            "idle_timeout" => {
                session.idle_timeout = seconds(k, value()?)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| format!("idle_timeout={}: expected seconds", v.unwrap_or("")))?;
            }
            "max_waits_per_uid" => session.max_deferred_per_uid = positive(k, value()?)?,
            "size" => {
                let v = value()?;
                fs.size = capacity::parse_size(v)
                    .ok_or_else(|| format!("size={v}: expected bytes, k/m/g/t or %"))?;
            }
            "nr_inodes" => {
                let v = value()?;
                fs.nr_inodes = capacity::parse_count(v)
                    .ok_or_else(|| format!("nr_inodes={v}: expected a number, k/m/g"))?;
            }
            "uring" => {
                flag()?;
                session.transport = Transport::Uring;
            }
            "keeper" => keeper = flag()?,
            "posix_lock" => fs.posix_lock = flag()?,
            "flock" => fs.flock = flag()?,
            "debug" => debug = flag()?,
            k if IGNORED.contains(&k) || k.starts_with("x-") || k == "comment" => {}
            _ => return Err(format!("unknown option `{o}`")),
        }
    }
    if mount.fsname.is_none() {
        let name = source.filter(|s| !s.contains([',', '\0']));
        mount.fsname = Some(name.unwrap_or_else(|| "memfs".into()));
    }
    mount.subtype.get_or_insert_with(|| "memfs".into());
    Ok(Command::Run(Box::new(Args {
        mountpoint,
        mount,
        fs,
        session,
        debug,
        keeper,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Args, String> {
        let v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match parse(&v)? {
            Command::Run(a) => Ok(*a),
            Command::Help => Err("help".into()),
            Command::Version => Err("version".into()),
        }
    }

    #[test]
    fn passthrough_ll_flags_are_accepted() {
        let a = run(&["-f", "-d", "-o", "size=1m,posix_lock", "/mnt"]).unwrap();
        assert_eq!(a.mountpoint, PathBuf::from("/mnt"));
        assert!(a.debug && a.fs.posix_lock && !a.fs.flock);
        assert_eq!(a.fs.size, 1 << 20);
        assert_eq!(a.mount.fsname.as_deref(), Some("memfs"));
        assert_eq!(a.mount.subtype.as_deref(), Some("memfs"));
        // Without -d, no debug; -o debug is the same as -d.
        assert!(!run(&["/mnt"]).unwrap().debug);
        assert!(run(&["-o", "debug", "/mnt"]).unwrap().debug);
        assert!(run(&["-o", "keeper", "/mnt"]).unwrap().keeper);
        assert!(!run(&["/mnt"]).unwrap().keeper);
        assert_eq!(run(&["-s", "/mnt"]).unwrap().session.workers, 1);
        assert_eq!(run(&["-othreads=3", "/mnt"]).unwrap().session.workers, 3);
        assert!(matches!(parse(&["--help".into()]), Ok(Command::Help)));
        assert!(matches!(parse(&["-h".into(), "/mnt".into()]), Ok(Command::Help)));
        assert!(matches!(parse(&["-V".into()]), Ok(Command::Version)));
    }

    #[test]
    fn mount_fuse3_form_source_mountpoint_then_options() {
        let a = run(&[
            "scratch",
            "/mnt",
            "-o",
            "rw,nodev,allow_other,flock,_netdev,nr_inodes=10k",
        ])
        .unwrap();
        assert_eq!(a.mountpoint, PathBuf::from("/mnt"));
        assert_eq!(a.mount.fsname.as_deref(), Some("scratch"));
        assert!(a.mount.allow_other && a.fs.flock);
        assert_eq!(a.fs.nr_inodes, 10 << 10);
        let a = run(&["scratch", "/mnt", "-o", "fsname=mine"]).unwrap();
        assert_eq!(a.mount.fsname.as_deref(), Some("mine"));
        let a = run(&[
            "-o",
            "ttl=2.5,idle_timeout=3,max_waits_per_uid=4,uring",
            "--",
            "-odd",
        ])
        .unwrap();
        assert_eq!(a.mountpoint, PathBuf::from("-odd"));
        assert_eq!(a.fs.ttl, Duration::from_millis(2500));
        assert_eq!(a.session.idle_timeout, Duration::from_secs(3));
        assert_eq!(a.session.max_deferred_per_uid, 4);
        assert!(matches!(a.session.transport, Transport::Uring));
        assert!(
            run(&["-o", "default_permissions", "/m"])
                .unwrap()
                .fs
                .default_permissions
        );
    }

    #[test]
    fn unknowns_and_bad_values_are_errors() {
        for bad in [
            &["-x", "/m"][..],
            &[][..],
            &["a", "b", "c"][..],
            &["-o"][..],
            &["-o", "bogus", "/m"][..],
            &["-o", "threads=0", "/m"][..],
            &["-o", "size=lots", "/m"][..],
            &["-o", "nr_inodes=-1", "/m"][..],
            &["-o", "ttl=soon", "/m"][..],
            &["-o", "idle_timeout=0", "/m"][..],
            &["-o", "posix_lock=1", "/m"][..],
            &["-o", "threads", "/m"][..],
            &["-o", "keeper=1", "/m"][..],
        ] {
            assert!(run(bad).is_err(), "{bad:?} accepted");
        }
    }
}

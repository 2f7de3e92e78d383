//! passthrough_ll: mirrors a directory through FUSE, a drop-in for libfuse's
//! low-level passthrough example, served by fuse-wire.
//!
//! ```text
//! passthrough_ll [-f] [-d] [-s] [-o opt,...] [--stats FILE] [SOURCE] MOUNTPOINT
//! ```
//!
//! It runs in the foreground until the filesystem is unmounted or it gets
//! SIGINT, SIGTERM or SIGHUP; then it unmounts and, with `--stats FILE`,
//! writes the session's statistics and the number of inodes the kernel
//! still held (`"inodes"`) as JSON. See `args.rs` for the options and
//! `fs.rs` for how operations reach the source directory.

mod args;
mod fs;
mod handles;
mod inodes;
mod sys;

use fs::PassthroughFs;
use fuse_wire::session::mount::{Mount, MountGuard};
use fuse_wire::session::{Session, SessionConfig, SessionHandle};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn main() {
    std::process::exit(run());
}

fn run() -> i32 {
    let mut argv = Vec::new();
    for a in std::env::args_os().skip(1) {
        match a.into_string() {
            Ok(s) => argv.push(s),
            Err(a) => {
                eprintln!("passthrough_ll: argument {a:?} is not valid UTF-8");
                return 2;
            }
        }
    }
    let args = match args::parse(&argv) {
        Ok(args::Command::Run(a)) => a,
        Ok(args::Command::Help) => {
            print!("{}", args::USAGE);
            return 0;
        }
        Ok(args::Command::Version) => {
            println!("passthrough_ll (fuse-wire {})", env!("CARGO_PKG_VERSION"));
            return 0;
        }
        Err(e) => {
            eprintln!("passthrough_ll: {e}\n(passthrough_ll --help lists the options)");
            return 2;
        }
    };
    let level = if args.debug {
        log::LevelFilter::Debug
    } else {
        log::LevelFilter::Warn
    };
    env_logger::Builder::new()
        .filter_level(level)
        .parse_default_env()
        .init();

    // Before any thread exists, so that every thread inherits the mask and
    // only the signal thread below receives these.
    if let Err(e) = sys::block_signals(&STOP_SIGNALS) {
        log::error!("cannot block the stop signals: {e}");
        return 1;
    }
    if let Err(e) = sys::install_interrupt_handler() {
        log::warn!("no interrupt handler for blocking lock waits: {e}");
    }
    // Modes arrive with the caller's umask already applied.
    sys::set_umask(0);
    match sys::raise_nofile_limit() {
        Ok(n) => log::debug!("open file limit: {n}"),
        Err(e) => log::warn!("cannot raise the open file limit: {e}"),
    }

    if args.fs.passthrough && args.fs.cache == fs::Cache::Never {
        log::warn!(
            "passthrough: cache=never does not set DIRECT_IO (it would route reads and writes back here)"
        );
    }
    if args.fs.passthrough && args.fs.parallel_direct_writes {
        log::warn!(
            "passthrough with parallel_direct_writes: DIRECT_IO sends reads and writes through the daemon; \
             only mmap is passed through"
        );
    }

    let source = match CString::new(args.source.as_os_str().as_bytes()) {
        Ok(s) => s,
        Err(_) => {
            log::error!("source path contains a NUL byte");
            return 2;
        }
    };
    let root = match sys::openat(sys::Dir::Cwd, &source, libc::O_PATH | libc::O_DIRECTORY, 0) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!(
                "passthrough_ll: source {} is not a usable directory: {e}",
                args.source.display()
            );
            return 1;
        }
    };
    let fs = match PassthroughFs::new(root, args.fs.clone()) {
        Ok(fs) => Arc::new(fs),
        Err(e) => {
            eprintln!("passthrough_ll: {}: {e}", args.source.display());
            return 1;
        }
    };

    let mount = match Mount::new(&args.mountpoint, &args.mount) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("passthrough_ll: {e}");
            return 1;
        }
    };
    let mountpoint = mount
        .mountpoint()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| args.mountpoint.clone());
    let (dev, guard) = mount.into_parts();
    let config = SessionConfig {
        workers: args.threads,
        clone_fd: args.clone_fd,
        atomic_open: args.atomic_open,
        ..Default::default()
    };
    let session = match Session::from_arc(fs.clone(), Arc::new(dev), config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("passthrough_ll: cannot start the session: {e}");
            return 1;
        }
    };
    let handle = session.handle();
    let guard = Arc::new(Mutex::new(Some(guard)));
    let stopped_by_signal = Arc::new(AtomicBool::new(false));
    spawn_signal_thread(handle.clone(), guard.clone(), stopped_by_signal.clone());
    log::info!("serving {} on {}", args.source.display(), mountpoint.display());

    let result = session.run();

    let leftover = guard.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(g) = leftover {
        if stopped_by_signal.load(Ordering::Acquire) || is_fuse_mounted(&mountpoint) {
            if let Err(e) = g.unmount() {
                log::warn!("unmounting {}: {e}", mountpoint.display());
            }
        } else {
            // Someone else unmounted it: there is nothing left to undo, and
            // a lazy unmount of the path could hit whatever is there now.
            std::mem::forget(g);
        }
    }

    let live = fs.live_inodes();
    log::info!(
        "exit: {live} inodes still looked up, {} handles open",
        fs.open_handles()
    );
    if let Some(path) = &args.stats {
        let ops = handle.stats().to_json();
        let body = ops.strip_prefix('{').unwrap_or(&ops);
        let json = format!("{{\"inodes\": {live}, {body}\n");
        if let Err(e) = std::fs::write(path, json) {
            log::error!("writing statistics to {}: {e}", path.display());
        }
    }
    match result {
        Ok(report) => {
            log::debug!(
                "session ended: {} workers ({} cloned fds)",
                report.workers_started,
                report.cloned_channels
            );
            0
        }
        Err(e) => {
            eprintln!("passthrough_ll: {e}");
            1
        }
    }
}

/// Waits for SIGINT/SIGTERM/SIGHUP; then unmounts and stops the session.
fn spawn_signal_thread(handle: SessionHandle, guard: Arc<Mutex<Option<MountGuard>>>, flag: Arc<AtomicBool>) {
    let r = std::thread::Builder::new().name("signals".into()).spawn(move || {
        let sig = match sys::wait_signal(&STOP_SIGNALS) {
            Ok(s) => s,
            Err(e) => {
                log::error!("waiting for signals: {e}");
                return;
            }
        };
        log::info!("signal {sig}: unmounting");
        flag.store(true, Ordering::Release);
        let g = guard.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(g) = g
            && let Err(e) = g.unmount()
        {
            log::warn!("unmounting: {e}");
        }
        handle.stop();
    });
    if let Err(e) = r {
        log::error!("cannot start the signal thread: {e}");
    }
}

/// Whether a FUSE filesystem is mounted at `path` (from /proc/self/mountinfo).
fn is_fuse_mounted(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return true;
    };
    let want: PathBuf = path.to_path_buf();
    info.lines().any(|line| {
        let mut halves = line.splitn(2, " - ");
        let (Some(pre), Some(post)) = (halves.next(), halves.next()) else {
            return false;
        };
        let mp = pre.split(' ').nth(4).map(unescape_mountinfo);
        mp.as_deref() == Some(want.as_os_str().as_bytes())
            && post.split(' ').next().is_some_and(|t| t.starts_with("fuse"))
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, …).
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

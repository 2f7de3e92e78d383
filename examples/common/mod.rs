//! What every example needs besides its filesystem: a stderr logger, and
//! "mount, serve until unmounted or interrupted, unmount".
//!
//! Shared by `hello` and `memfs` (`mod common;`); not an example itself.
#![allow(dead_code)]

use fuse_wire::session::mount::MountOptions;
use fuse_wire::session::{Filesystem, Session, SessionConfig, SessionReport};
use std::error::Error;
use std::path::{Path, PathBuf};

/// Logs to stderr at the level named by `RUST_LOG` (`error` … `trace`;
/// default `info`). A module filter is not supported: this is ten lines,
/// not a logging framework.
pub fn init_logging() {
    struct Stderr;
    impl log::Log for Stderr {
        fn enabled(&self, m: &log::Metadata<'_>) -> bool {
            m.level() <= log::max_level()
        }
        fn log(&self, r: &log::Record<'_>) {
            if self.enabled(r.metadata()) {
                eprintln!("[{:5} {}] {}", r.level(), r.target(), r.args());
            }
        }
        fn flush(&self) {}
    }
    static LOGGER: Stderr = Stderr;
    let level = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(log::LevelFilter::Info);
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}

/// Mounts `fs` on `mountpoint`, serves it in this process until the
/// filesystem is unmounted (`umount`, `fusermount3 -u`) or SIGINT/SIGTERM
/// arrives, in which case it unmounts. Returns the session's report.
pub fn mount_and_serve<F: Filesystem>(
    fs: F,
    mountpoint: &Path,
    opts: &MountOptions,
    config: SessionConfig,
) -> Result<SessionReport, Box<dyn Error>> {
    // Before any thread exists, so that every thread inherits the mask and
    // only our waiter below ever sees the two signals.
    let signals = block_termination_signals()?;

    // The session owns the mount: stopping it (on a signal) unmounts it,
    // and so does its end if the mount is still there. Either way only our
    // own mount: one placed over ours or made on the path after ours was
    // unmounted is left alone (and logged).
    let session = Session::mount(fs, mountpoint, opts, config)?;
    log::info!("mounted on {}", mountpoint.display());
    let handle = session.handle();
    let running = session.spawn()?;

    let stopper = handle.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = wait_for(&signals) {
                log::info!("signal {sig}: unmounting");
                stopper.stop();
            }
        })?;

    let report = running.join()?;
    log::info!("session ended; {} workers served it", report.workers_started);
    Ok(report)
}

/// The mountpoint argument of a command line `PROG [-o OPTS] MOUNTPOINT`,
/// and the `-o` lists in order.
pub fn parse_args(usage: &str) -> Result<(PathBuf, Vec<String>), String> {
    let mut mountpoint = None;
    let mut opts = Vec::new();
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("-h" | "--help") => return Err(usage.to_string()),
            Some("-o") => match args.next().and_then(|o| o.into_string().ok()) {
                Some(o) => opts.push(o),
                None => return Err(format!("-o needs an option list\n{usage}")),
            },
            Some(s) if s.starts_with("-o") => opts.push(s[2..].to_string()),
            Some(s) if s.starts_with('-') => return Err(format!("unknown flag {s}\n{usage}")),
            _ if mountpoint.is_none() => mountpoint = Some(PathBuf::from(arg)),
            _ => return Err(format!("one mountpoint only\n{usage}")),
        }
    }
    mountpoint.map(|m| (m, opts)).ok_or_else(|| usage.to_string())
}

/// The set of SIGINT and SIGTERM, blocked in the calling thread.
fn block_termination_signals() -> std::io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
    }
    // SAFETY: pthread_sigmask reads `set` and writes no old mask (null).
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(set)
}

/// Waits for one of the signals in `set` (blocked in every thread).
fn wait_for(set: &libc::sigset_t) -> Option<libc::c_int> {
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is an initialised sigset_t and `sig` a valid out pointer.
    let rc = unsafe { libc::sigwait(set, &mut sig) };
    if rc == 0 {
        Some(sig)
    } else {
        log::error!("sigwait: {}", std::io::Error::from_raw_os_error(rc));
        None
    }
}

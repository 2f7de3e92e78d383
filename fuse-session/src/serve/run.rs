//! Serving a filesystem the way a program wants to: [`serve`] mounts, serves
//! until the filesystem is unmounted or the process gets SIGINT, SIGTERM or
//! SIGHUP, unmounts its own mount and returns the session's report;
//! [`spawn`] serves in the background and unmounts when its handle drops.
//!
//! The termination signals are caught with a process-wide handler (it only
//! writes the signal number to a pipe), so it does not matter which threads
//! exist or what their signal masks are: no mask has to be set before any
//! thread starts. One thread, started on first use and blocked in `read(2)`
//! on that pipe, stops every session [`serve`] is running. The previous
//! dispositions are put back when the last [`serve`] returns; a signal that
//! arrives when no session is left is raised again under them.

use crate::filesystem::Filesystem;
use crate::mount::MountOptions;
use crate::session::{RunningSession, Session, SessionConfig, SessionError, SessionHandle, SessionReport};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};

/// Mounts `fs` on `mountpoint` and serves it in this thread until the
/// filesystem is unmounted (`umount`, `fusermount3 -u`), the kernel ends the
/// connection, or the process receives SIGINT, SIGTERM or SIGHUP; then
/// unmounts it (only if the topmost mount there is still ours) and returns
/// the session's report.
///
/// Uses [`SessionConfig::default`]; see [`serve_with`]. If the process may
/// be killed by other means (SIGKILL, a crash), set
/// [`MountOptions::auto_unmount`] so that the mount does not outlive it.
///
/// ```no_run
/// use fuse_session::{Filesystem, MountOptions};
///
/// struct Empty;
/// impl Filesystem for Empty {}
///
/// let opts = MountOptions {
///     fsname: Some("empty".into()),
///     auto_unmount: true,
///     ..MountOptions::default()
/// };
/// let report = fuse_session::serve(Empty, "/mnt/empty", &opts)?;
/// println!("served {} requests", report.stats.total_requests());
/// # Ok::<(), fuse_session::SessionError>(())
/// ```
pub fn serve<F: Filesystem>(
    fs: F,
    mountpoint: impl AsRef<Path>,
    opts: &MountOptions,
) -> Result<SessionReport, SessionError> {
    serve_with(fs, mountpoint, opts, SessionConfig::default())
}

/// [`serve`] with a session configuration (workers, transport, …).
pub fn serve_with<F: Filesystem>(
    fs: F,
    mountpoint: impl AsRef<Path>,
    opts: &MountOptions,
    config: SessionConfig,
) -> Result<SessionReport, SessionError> {
    // Catch the signals first, so that one arriving while we mount stops
    // the session as soon as it exists instead of killing the process
    // with a mount in place.
    let mut watch = SignalWatch::start()?;
    let mountpoint = mountpoint.as_ref();
    let session = Session::mount(fs, mountpoint, opts, config)?;
    log::info!("mounted on {}", mountpoint.display());
    watch.attach(session.handle());
    let report = session.run();
    drop(watch);
    match &report {
        Ok(r) if r.mount_left.is_some() => log::warn!(
            "{} not unmounted ({}); {} requests served by {} workers",
            mountpoint.display(),
            r.mount_left.as_deref().unwrap_or_default(),
            r.stats.total_requests(),
            r.workers_started
        ),
        Ok(r) => log::info!(
            "{} unmounted; {} requests served by {} workers",
            mountpoint.display(),
            r.stats.total_requests(),
            r.workers_started
        ),
        Err(_) => {}
    }
    report
}

/// Mounts `fs` on `mountpoint` and serves it in background threads. The
/// returned [`RunningSession`] stops the session and unmounts (our own
/// mount only) when dropped or [stopped](RunningSession::stop); it does
/// not react to signals.
///
/// ```no_run
/// use fuse_session::{Filesystem, MountOptions, SessionConfig};
///
/// struct Empty;
/// impl Filesystem for Empty {}
///
/// let running = fuse_session::spawn(Empty, "/mnt/empty", &MountOptions::default(), SessionConfig::default())?;
/// assert!(std::fs::read_dir("/mnt/empty")?.next().is_none() || true);
/// drop(running); // unmounts
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn spawn<F: Filesystem>(
    fs: F,
    mountpoint: impl AsRef<Path>,
    opts: &MountOptions,
    config: SessionConfig,
) -> Result<RunningSession, SessionError> {
    Session::mount(fs, mountpoint, opts, config)?.spawn()
}

const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The write end of the signal pipe (-1 before first use; never closed).
static PIPE_WR: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = PIPE_WR.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = sig as u8;
        // SAFETY: write(2) is async-signal-safe; `b` is a live local. A full
        // pipe (a flood of signals) drops this one, which is harmless.
        unsafe {
            libc::write(fd, (&b as *const u8).cast(), 1);
        }
    }
}

/// Who is listening: the sessions to stop and the dispositions to restore.
struct Registry {
    /// Active [`SignalWatch`]es; the handlers are installed while > 0.
    active: usize,
    next_id: u64,
    sessions: Vec<(u64, SessionHandle)>,
    /// A signal came while a watch was active but before its session was
    /// attached: stop sessions as they attach.
    pending: bool,
    saved: Vec<(libc::c_int, libc::sigaction)>,
}

fn registry() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| {
        Mutex::new(Registry {
            active: 0,
            next_id: 0,
            sessions: Vec::new(),
            pending: false,
            saved: Vec::new(),
        })
    })
}

fn lock() -> std::sync::MutexGuard<'static, Registry> {
    registry().lock().unwrap_or_else(|e| e.into_inner())
}

/// Creates the pipe and its reader thread, once per process.
fn start_listener() -> io::Result<()> {
    static STARTED: OnceLock<Result<(), i32>> = OnceLock::new();
    let r = STARTED.get_or_init(|| {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two fds into the live array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
        }
        // The handler must never block: a full pipe drops the byte.
        // SAFETY: fcntl on the pipe's write end we just made.
        unsafe {
            libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK);
        }
        let rd = fds[0];
        let spawned = std::thread::Builder::new()
            .name("fuse-signals".into())
            .spawn(move || listen(rd));
        if let Err(e) = spawned {
            // SAFETY: closes the two fds made above, used by nobody.
            unsafe {
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
            return Err(e.raw_os_error().unwrap_or(libc::EAGAIN));
        }
        PIPE_WR.store(fds[1], Ordering::Release);
        Ok(())
    });
    r.map_err(io::Error::from_raw_os_error)
}

/// The reader thread: turns each signal into a stop of every attached
/// session.
fn listen(rd: libc::c_int) {
    loop {
        let mut b = 0u8;
        // SAFETY: reads one byte into a live local from our pipe.
        let n = unsafe { libc::read(rd, (&mut b as *mut u8).cast(), 1) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if n != 1 {
            log::error!("signal pipe: {}", io::Error::last_os_error());
            return;
        }
        let sig = libc::c_int::from(b);
        let mut r = lock();
        if !r.sessions.is_empty() {
            log::info!("{}: stopping and unmounting", signal_name(sig));
            for (_, h) in r.sessions.drain(..) {
                h.stop();
            }
        } else if r.active > 0 {
            r.pending = true;
        } else {
            // Nobody serves any more and the old dispositions are back:
            // let the signal do what it would have done.
            drop(r);
            // SAFETY: raise has no preconditions.
            unsafe {
                libc::raise(sig);
            }
        }
    }
}

fn signal_name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}

/// One [`serve`] call's registration: handlers installed while it lives.
struct SignalWatch {
    id: Option<u64>,
}

impl SignalWatch {
    fn start() -> io::Result<SignalWatch> {
        start_listener()?;
        let mut r = lock();
        if r.active == 0 {
            let mut saved = Vec::with_capacity(SIGNALS.len());
            for sig in SIGNALS {
                // SAFETY: a zeroed sigaction with our handler, an empty mask
                // and SA_RESTART (so that blocked reads elsewhere resume);
                // the old action is written into a live local.
                unsafe {
                    let mut sa: libc::sigaction = std::mem::zeroed();
                    sa.sa_sigaction = on_signal as *const () as usize;
                    sa.sa_flags = libc::SA_RESTART;
                    libc::sigemptyset(&mut sa.sa_mask);
                    let mut old: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(sig, &sa, &mut old) != 0 {
                        let e = io::Error::last_os_error();
                        restore(&saved);
                        return Err(e);
                    }
                    saved.push((sig, old));
                }
            }
            r.saved = saved;
            r.pending = false;
        }
        r.active += 1;
        Ok(SignalWatch { id: None })
    }

    fn attach(&mut self, handle: SessionHandle) {
        let mut r = lock();
        if r.pending {
            log::info!("signal received while mounting: stopping and unmounting");
            handle.stop();
            return;
        }
        let id = r.next_id;
        r.next_id += 1;
        r.sessions.push((id, handle));
        self.id = Some(id);
    }
}

impl Drop for SignalWatch {
    fn drop(&mut self) {
        let mut r = lock();
        if let Some(id) = self.id {
            r.sessions.retain(|(i, _)| *i != id);
        }
        r.active -= 1;
        if r.active == 0 {
            let saved = std::mem::take(&mut r.saved);
            restore(&saved);
            r.pending = false;
        }
    }
}

fn restore(saved: &[(libc::c_int, libc::sigaction)]) {
    for (sig, old) in saved {
        // SAFETY: puts back an action sigaction itself returned.
        unsafe {
            libc::sigaction(*sig, old, std::ptr::null_mut());
        }
    }
}

//! The session's wake-up signal and what uses it: waking threads blocked in
//! `read(2)` (stop), interrupting a deferred wait (INTERRUPT), and the
//! one-shot per-thread timer that ends an idle worker's read.
//!
//! The signal is a real-time signal whose handler does nothing and is
//! installed without `SA_RESTART`, so that a blocking system call of the
//! thread it is sent to returns `EINTR`.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The signal number.
pub(crate) fn wake_signal() -> libc::c_int {
    libc::SIGRTMIN() + 7
}

extern "C" fn on_wake(_: libc::c_int) {}

/// Installs the do-nothing handler (once per process).
pub(crate) fn install_wake_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sigaction with a zeroed struct, an empty mask and a handler
        // that does nothing (async-signal-safe); the pointers are to locals.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_wake as *const () as usize;
            sa.sa_flags = 0;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(wake_signal(), &sa, std::ptr::null_mut()) != 0 {
                log::warn!(
                    "cannot install the wake-up signal handler: {}",
                    io::Error::last_os_error()
                );
            }
        }
    });
}

/// The calling thread.
pub(crate) fn this_thread() -> libc::pthread_t {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() }
}

/// Sends the wake-up signal to `t`, which the caller knows to be alive
/// (it is registered in a [`Threads`] or a wait cell that the thread clears
/// under the same lock before it moves on).
pub(crate) fn wake(t: libc::pthread_t) {
    // SAFETY: see above: `t` names a running thread of this process.
    unsafe {
        libc::pthread_kill(t, wake_signal());
    }
}

/// The live threads of a session, to wake them all on stop. A thread
/// registers itself and is removed when its guard drops (before it exits),
/// so that no signal is ever sent to a thread that is gone.
#[derive(Default)]
pub(crate) struct Threads(Mutex<Vec<libc::pthread_t>>);

impl Threads {
    /// Registers the calling thread until the guard drops.
    pub(crate) fn register(self: &Arc<Self>) -> Registered {
        let me = this_thread();
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(me);
        Registered {
            threads: self.clone(),
            me,
        }
    }

    /// Signals every registered thread.
    pub(crate) fn wake_all(&self) {
        for &t in self.0.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            wake(t);
        }
    }
}

/// A thread's registration in [`Threads`].
pub(crate) struct Registered {
    threads: Arc<Threads>,
    me: libc::pthread_t,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut l = self.threads.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = l.iter().position(|&t| {
            // SAFETY: pthread_equal only compares the two ids.
            unsafe { libc::pthread_equal(t, self.me) != 0 }
        }) {
            l.swap_remove(i);
        }
    }
}

/// A one-shot POSIX timer that sends the wake-up signal to the thread that
/// made it: armed around a blocking read, it makes the read return `EINTR`
/// once the time is up. Only workers above the pool's floor use one, and
/// only while they wait; nothing ticks while a session is idle.
pub(crate) struct ThreadTimer {
    id: libc::timer_t,
}

impl ThreadTimer {
    /// A timer for the calling thread.
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        // SAFETY: a zeroed sigevent is valid; the fields set below are the
        // ones SIGEV_THREAD_ID reads.
        let mut sev: libc::sigevent = unsafe { std::mem::zeroed() };
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = wake_signal();
        sev.sigev_notify_thread_id = tid;
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: `sev` and `id` are live locals; the kernel writes the id.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut id) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { id })
    }

    fn set(&self, after: Duration) -> io::Result<libc::itimerspec> {
        let new = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: an all-zero itimerspec is valid; it receives the old value.
        let mut old: libc::itimerspec = unsafe { std::mem::zeroed() };
        // SAFETY: `self.id` is a timer this thread created; the pointers are to locals.
        if unsafe { libc::timer_settime(self.id, 0, &new, &mut old) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(old)
    }

    /// Arms the timer to fire once after `after` (at least a nanosecond).
    pub(crate) fn arm(&self, after: Duration) -> io::Result<()> {
        self.set(after.max(Duration::from_nanos(1))).map(drop)
    }

    /// Disarms it; returns whether it had already fired.
    pub(crate) fn disarm(&self) -> bool {
        match self.set(Duration::ZERO) {
            Ok(old) => old.it_value.tv_sec == 0 && old.it_value.tv_nsec == 0,
            Err(_) => false,
        }
    }
}

impl Drop for ThreadTimer {
    fn drop(&mut self) {
        // SAFETY: deletes the timer made in `new`, used by nobody else.
        unsafe {
            libc::timer_delete(self.id);
        }
    }
}

//! The daemon's own umask kept out of the files it creates for callers.
//!
//! The kernel sends the mode of a CREATE, MKNOD, MKDIR or TMPFILE with the
//! caller's umask applied (unless the filesystem negotiated `DONT_MASK`:
//! then [`crate::RequestContext::umask`] gives it). A filesystem that
//! creates with that mode on another filesystem (a mirror, a passthrough)
//! would have the daemon's own umask (022, say) taken off a second time,
//! so `touch f` under a caller's umask of 0 would give 0644, not 0666.
//!
//! The session therefore gives each thread that serves such a request a
//! umask of 0, once: the umask lives in the `fs_struct` that a process's
//! threads share, so the thread first takes a copy of its own
//! (`unshare(CLONE_FS)`: same root, working directory and umask), and the
//! rest of the program keeps its umask. A later `chdir` by another thread
//! no longer moves such a thread's working directory (a filesystem should
//! not depend on the working directory anyway). Code that creates for a
//! caller on threads of its own (an async runtime's, after the first
//! `await`) calls [`clear_for_this_thread`] at their start.

use std::cell::Cell;

thread_local! {
    /// Whether this thread has its own `fs_struct` with a umask of 0.
    static CLEARED: Cell<bool> = const { Cell::new(false) };
}

/// Gives the calling thread a umask of 0 of its own (the first call makes
/// two system calls; later ones none), so that what it creates gets
/// exactly the mode asked for. Other threads keep their umask. `false` if
/// the thread could not get an `fs_struct` of its own (logged once per
/// thread; the process's umask then applies).
pub fn clear_for_this_thread() -> bool {
    if CLEARED.get() {
        return true;
    }
    // SAFETY: unshare only gives this thread a private copy of its
    // filesystem state; CLONE_FS is allowed in a multithreaded process.
    if unsafe { libc::unshare(libc::CLONE_FS) } != 0 {
        log::warn!(
            "cannot give this thread a umask of its own ({}): creates get the daemon's umask applied",
            std::io::Error::last_os_error()
        );
        CLEARED.set(true);
        return false;
    }
    // SAFETY: umask has no preconditions and cannot fail; it changes the
    // fs_struct this thread alone now uses.
    unsafe { libc::umask(0) };
    CLEARED.set(true);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's umask, read without changing it.
    fn current_umask() -> u32 {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = status.lines().find_map(|l| l.strip_prefix("Umask:")).unwrap();
        u32::from_str_radix(line.trim(), 8).unwrap()
    }

    #[test]
    fn only_the_calling_thread_loses_its_umask() {
        let before = current_umask();
        let (inside, again) = std::thread::spawn(|| {
            assert!(clear_for_this_thread());
            let inside = current_umask();
            assert!(clear_for_this_thread());
            (inside, current_umask())
        })
        .join()
        .unwrap();
        assert_eq!((inside, again), (0, 0));
        assert_eq!(current_umask(), before);
    }
}

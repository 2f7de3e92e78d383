//! The `/dev/fuse` transport: `read(2)` for requests (or `splice(2)` into a
//! pipe, for WRITE data that should not pass through user memory), one
//! `writev(2)` per reply (or one `splice(2)` from a pipe, for READ data),
//! and `FUSE_DEV_IOC_CLONE` for a queue per worker.

use super::{Channel, ReplySink, RequestSource};
use fuse_proto::Reply;
use fuse_proto::consts::dev_ioc;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use crate::signal::ThreadTimer;

thread_local! {
    /// The calling worker's idle timer, made on its first timed read.
    static TIMER: std::cell::RefCell<Option<ThreadTimer>> = const { std::cell::RefCell::new(None) };
}

/// One `/dev/fuse` file descriptor: the session fd or a clone of it.
#[derive(Debug)]
pub struct DevFuse {
    fd: OwnedFd,
    cloned: bool,
}

impl DevFuse {
    /// Opens a fresh `/dev/fuse` (not yet bound to a connection).
    pub fn open() -> io::Result<Self> {
        let fd = nix::fcntl::open(
            "/dev/fuse",
            nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(io::Error::from)?;
        Ok(Self { fd, cloned: false })
    }

    /// Wraps an fd that is already bound to a connection (from `mount(2)`,
    /// `fusermount3`, or a privileged helper).
    pub fn from_fd(fd: OwnedFd) -> Self {
        Self { fd, cloned: false }
    }

    /// Opens a new `/dev/fuse` and binds it to this fd's connection with
    /// `FUSE_DEV_IOC_CLONE`; the clone has its own processing queue.
    pub fn clone_fd(&self) -> io::Result<Self> {
        let new = Self::open()?;
        let session_fd: u32 = self.fd.as_raw_fd() as u32;
        // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the session fd) through the
        // pointer, which points at a live local for the duration of the call.
        let r = unsafe {
            libc::ioctl(
                new.fd.as_raw_fd(),
                dev_ioc::CLONE as libc::Ioctl,
                &session_fd as *const u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            fd: new.fd,
            cloned: true,
        })
    }

    /// Whether this fd was made by [`DevFuse::clone_fd`].
    pub fn is_clone(&self) -> bool {
        self.cloned
    }

    /// Reads one request.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        nix::unistd::read(self.fd.as_fd(), buf).map_err(io::Error::from)
    }

    /// Writes one message with a single `writev`.
    pub fn write(&self, msg: &Reply<'_>) -> io::Result<()> {
        let mut slices = [IoSlice::new(&[]), IoSlice::new(&[]), IoSlice::new(&[])];
        let mut n = 0;
        for p in msg.parts() {
            slices[n] = IoSlice::new(p);
            n += 1;
        }
        let written = nix::sys::uio::writev(self.fd.as_fd(), &slices[..n]).map_err(io::Error::from)?;
        if written != msg.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write to /dev/fuse: {written} of {} bytes", msg.len()),
            ));
        }
        Ok(())
    }

    /// Moves one message of `len` bytes (header included) from the pipe
    /// read end `pipe` into the device with a single `splice(2)`; the kernel
    /// takes a spliced message only whole.
    pub fn splice_in(&self, pipe: BorrowedFd<'_>, len: usize) -> io::Result<()> {
        use nix::fcntl::{SpliceFFlags, splice};
        let moved =
            splice(pipe, None, self.fd.as_fd(), None, len, SpliceFFlags::empty()).map_err(io::Error::from)?;
        if moved != len {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short splice to /dev/fuse: {moved} of {len} bytes"),
            ));
        }
        Ok(())
    }

    /// Moves one request (at most `len` bytes) into the pipe whose write
    /// end is `pipe` with a single `splice(2)`; returns its length.
    pub fn splice_out(&self, pipe: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
        use nix::fcntl::{SpliceFFlags, splice};
        splice(self.fd.as_fd(), None, pipe, None, len, SpliceFFlags::empty()).map_err(io::Error::from)
    }

    /// Runs a blocking receive `op` that gives up with `ETIMEDOUT` after
    /// `timeout`.
    fn timed(&self, timeout: Duration, mut op: impl FnMut() -> io::Result<usize>) -> io::Result<usize> {
        // A read of /dev/fuse has no timeout of its own: a one-shot timer of
        // this thread interrupts it (the wake-up signal's handler has no
        // SA_RESTART). A request that arrives as the timer fires is kept.
        crate::signal::install_wake_handler();
        TIMER.with(|t| {
            let mut t = t.borrow_mut();
            if t.is_none() {
                match ThreadTimer::new() {
                    Ok(timer) => *t = Some(timer),
                    Err(e) => {
                        // Without a timer this thread reads as if at the floor.
                        static SAID: std::sync::Once = std::sync::Once::new();
                        SAID.call_once(|| {
                            log::warn!("no idle timer for workers ({e}); they will not time out")
                        });
                        drop(t);
                        return op();
                    }
                }
            }
            let timer = t.as_ref().expect("just set");
            if timer.arm(timeout).is_err() {
                return op();
            }
            let r = op();
            let fired = timer.disarm();
            match r {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) && fired => {
                    Err(io::Error::from_raw_os_error(libc::ETIMEDOUT))
                }
                r => r,
            }
        })
    }

    /// Duplicates the descriptor (same open file, same queue).
    pub fn try_dup(&self) -> io::Result<Self> {
        Ok(Self {
            fd: self.fd.try_clone()?,
            cloned: self.cloned,
        })
    }

    /// Takes ownership of a raw fd.
    ///
    /// # Safety
    /// `fd` must be an open `/dev/fuse` descriptor owned by nobody else.
    pub unsafe fn from_raw_fd(fd: RawFd) -> Self {
        Self {
            // SAFETY: the caller guarantees `fd` is open and exclusively ours.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            cloned: false,
        }
    }
}

impl AsFd for DevFuse {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for DevFuse {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl RequestSource for DevFuse {
    fn receive(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read(buf)
    }

    fn receive_timeout(&self, buf: &mut [u8], timeout: Duration) -> io::Result<usize> {
        self.timed(timeout, || self.read(buf))
    }

    fn supports_splice_receive(&self) -> bool {
        true
    }

    fn receive_to_pipe(
        &self,
        pipe: BorrowedFd<'_>,
        len: usize,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        match timeout {
            Some(t) => self.timed(t, || self.splice_out(pipe, len)),
            None => self.splice_out(pipe, len),
        }
    }

    fn try_clone(&self) -> io::Result<Arc<dyn Channel>> {
        Ok(Arc::new(self.clone_fd()?))
    }
}

impl ReplySink for DevFuse {
    fn send(&self, msg: &Reply<'_>) -> io::Result<()> {
        self.write(msg)
    }

    fn supports_splice(&self) -> bool {
        true
    }

    fn send_spliced(&self, pipe: BorrowedFd<'_>, len: usize) -> io::Result<()> {
        self.splice_in(pipe, len)
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn describe(&self) -> String {
        format!(
            "/dev/fuse fd {}{}",
            self.fd.as_raw_fd(),
            if self.cloned { " (clone)" } else { "" }
        )
    }
}

//! Per-thread pipes that stage a READ reply for `splice(2)` into `/dev/fuse`.
//!
//! The kernel takes a spliced reply only whole: header and data must both
//! wait in one pipe, header first, and go in with one `splice`. The data's
//! length is known only after it was read (a read may end early at EOF), so
//! each thread keeps two pipes: the file's pages are spliced into the data
//! pipe first; then the 16-byte header, now knowing the length, is written
//! to the message pipe and the data pipe's buffers are moved behind it.
//!
//! Both pipes are non-blocking, so a miscounted capacity shows up as
//! `EAGAIN` (and a fallback) rather than as a worker blocked for ever.
//! Whatever goes wrong while staging, the pipes are drained before the
//! error is returned, so that the next request starts with empty pipes.

use fuse_proto::abi::OutHeader;
use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use std::cell::RefCell;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use zerocopy::IntoBytes;

/// The largest pipe we ask for: a READ is at most 1 MiB.
const PIPE_MAX: usize = 1 << 20;

/// The two pipes of one thread.
pub(crate) struct Pipes {
    data_r: OwnedFd,
    data_w: OwnedFd,
    msg_r: OwnedFd,
    msg_w: OwnedFd,
    /// Buffers (pages) each pipe holds.
    slots: usize,
    page: usize,
}

enum State {
    Untried,
    Failed,
    Ready(Pipes),
}

thread_local! {
    static PIPES: RefCell<State> = const { RefCell::new(State::Untried) };
}

/// Runs `f` with this thread's pipes, creating them on first use; `None`
/// if they cannot be made (remembered: not retried on this thread) or are
/// already in use further up this thread's stack.
pub(crate) fn with_pipes<R>(f: impl FnOnce(&Pipes) -> R) -> Option<R> {
    PIPES.with(|p| {
        let mut state = p.try_borrow_mut().ok()?;
        if let State::Untried = *state {
            *state = match Pipes::new() {
                Ok(pipes) => State::Ready(pipes),
                Err(e) => {
                    log::info!("READ replies on this thread will not use splice: {e}");
                    State::Failed
                }
            };
        }
        match &*state {
            State::Ready(pipes) => Some(f(pipes)),
            _ => None,
        }
    })
}

fn new_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(io::Error::from)
}

/// Grows a pipe to the largest size the system allows up to [`PIPE_MAX`]
/// (`fs.pipe-max-size` and the per-user pipe limits decide); returns its size.
fn grow(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut want = PIPE_MAX;
    while want > 4096 {
        if fcntl(fd, FcntlArg::F_SETPIPE_SZ(want as libc::c_int)).is_ok() {
            break;
        }
        want /= 2;
    }
    let size = fcntl(fd, FcntlArg::F_GETPIPE_SZ).map_err(io::Error::from)?;
    Ok(size as usize)
}

impl Pipes {
    fn new() -> io::Result<Self> {
        let (data_r, data_w) = new_pipe()?;
        let (msg_r, msg_w) = new_pipe()?;
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .map_or(4096, |p| p as usize);
        let bytes = grow(data_w.as_fd())?.min(grow(msg_w.as_fd())?);
        Ok(Self {
            data_r,
            data_w,
            msg_r,
            msg_w,
            slots: bytes / page,
            page,
        })
    }

    /// Whether a reply of up to `len` bytes of a file at `offset` fits: the
    /// file's pages take one pipe buffer each, the header one more.
    pub(crate) fn fits(&self, offset: u64, len: usize) -> bool {
        let lead = (offset % self.page as u64) as usize;
        lead.saturating_add(len).div_ceil(self.page) < self.slots
    }

    /// Puts a success reply to request `unique` in the message pipe: the
    /// header, then up to `len` bytes of `fd` from `offset` (fewer at end of
    /// file). Returns the message's total length. On error both pipes are
    /// drained.
    pub(crate) fn stage(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        unique: u64,
    ) -> io::Result<usize> {
        let r = self.try_stage(fd, offset, len, unique);
        if r.is_err() {
            self.drain();
        }
        r
    }

    fn try_stage(&self, fd: BorrowedFd<'_>, offset: u64, len: usize, unique: u64) -> io::Result<usize> {
        let mut off =
            libc::loff_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let mut got = 0;
        while got < len {
            match splice(
                fd,
                Some(&mut off),
                self.data_w.as_fd(),
                None,
                len - got,
                SpliceFFlags::empty(),
            ) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let total = size_of::<OutHeader>() + got;
        let header = OutHeader {
            len: u32::try_from(total).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?,
            error: 0,
            unique,
        };
        let written = nix::unistd::write(self.msg_w.as_fd(), header.as_bytes())?;
        if written != size_of::<OutHeader>() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "short header write to the pipe",
            ));
        }
        let mut moved = 0;
        while moved < got {
            match splice(
                self.data_r.as_fd(),
                None,
                self.msg_w.as_fd(),
                None,
                got - moved,
                SpliceFFlags::SPLICE_F_MOVE,
            ) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "data pipe ran dry")),
                Ok(n) => moved += n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(total)
    }

    /// The read end a staged message waits in.
    pub(crate) fn message(&self) -> BorrowedFd<'_> {
        self.msg_r.as_fd()
    }

    /// Bytes waiting in the message pipe.
    pub(crate) fn message_len(&self) -> usize {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int through the pointer, which points
        // at a live local for the duration of the call.
        let r = unsafe { libc::ioctl(self.msg_r.as_raw_fd(), libc::FIONREAD, &mut n as *mut libc::c_int) };
        if r < 0 { 0 } else { n as usize }
    }

    /// Reads both pipes empty (they are non-blocking: stops at `EAGAIN`).
    pub(crate) fn drain(&self) {
        let mut sink = [0u8; 16 * 1024];
        for fd in [self.data_r.as_fd(), self.msg_r.as_fd()] {
            loop {
                match nix::unistd::read(fd, &mut sink) {
                    Ok(0) => break,
                    Ok(_) => continue,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(_) => break,
                }
            }
        }
    }
}

/// `pread` until `buf` is full or the file ends; returns the bytes read.
pub(crate) fn pread_full(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let off = offset
            .checked_add(got as u64)
            .and_then(|o| libc::off_t::try_from(o).ok())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        match nix::sys::uio::pread(fd, &mut buf[got..], off) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp_file(content: &[u8]) -> std::fs::File {
        let path = std::env::temp_dir().join(format!("fw-splice-{}-{}", std::process::id(), content.len()));
        std::fs::File::create(&path).unwrap().write_all(content).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    fn read_message(p: &Pipes, total: usize) -> Vec<u8> {
        let mut out = vec![0u8; total];
        let mut got = 0;
        while got < total {
            got += nix::unistd::read(p.message(), &mut out[got..]).unwrap();
        }
        out
    }

    #[test]
    fn staged_messages_are_header_then_the_files_bytes() {
        let content: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 4096) as u8).collect();
        let f = temp_file(&content);
        let p = Pipes::new().unwrap();
        for (off, len) in [
            (0usize, 1usize),
            (1, 4095),
            (4095, 4096),
            (8192, 131_072),
            (299_990, 4096),
            (300_000, 10),
        ] {
            assert!(p.fits(off as u64, len));
            let total = p.stage(f.as_fd(), off as u64, len, 77).unwrap();
            let want = &content[off.min(content.len())..(off + len).min(content.len())];
            assert_eq!(total, 16 + want.len());
            assert_eq!(p.message_len(), total);
            let msg = read_message(&p, total);
            assert_eq!(u32::from_ne_bytes(msg[0..4].try_into().unwrap()) as usize, total);
            assert_eq!(i32::from_ne_bytes(msg[4..8].try_into().unwrap()), 0);
            assert_eq!(u64::from_ne_bytes(msg[8..16].try_into().unwrap()), 77);
            assert!(msg[16..] == *want, "{len} bytes at {off}");
            assert_eq!(p.message_len(), 0);
        }
    }

    #[test]
    fn what_does_not_fit_is_refused_and_failures_leave_the_pipes_empty() {
        let p = Pipes::new().unwrap();
        let room = p.slots * p.page;
        // A full-size message needs one buffer more than the data's pages.
        assert!(!p.fits(0, room));
        assert!(p.fits(0, room - p.page));
        assert!(!p.fits(1, room - p.page));
        // Not spliceable (a directory): an error, and nothing left behind.
        let dir = std::fs::File::open(std::env::temp_dir()).unwrap();
        assert!(p.stage(dir.as_fd(), 0, 4096, 1).is_err());
        assert_eq!(p.message_len(), 0);
        // An offset beyond what the kernel takes.
        let f = temp_file(b"abc");
        assert!(p.stage(f.as_fd(), u64::MAX, 3, 1).is_err());
        // Half staged, then drained: the next message starts clean.
        nix::unistd::write(p.data_w.as_fd(), b"stale").unwrap();
        nix::unistd::write(p.msg_w.as_fd(), b"stale").unwrap();
        p.drain();
        let total = p.stage(f.as_fd(), 0, 3, 5).unwrap();
        assert_eq!(&read_message(&p, total)[16..], b"abc");
    }
}

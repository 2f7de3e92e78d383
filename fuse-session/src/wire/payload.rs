//! A WRITE's data as a handler sees it: bytes in the worker's receive
//! buffer, or (with [`SessionConfig::splice_write`](crate::SessionConfig))
//! still waiting in the worker's pipe, from where a handler can move it into
//! a file with `splice(2)` without it passing through user memory.
//!
//! A payload in the pipe has no bytes to borrow until it is fetched, so
//! [`WriteData::bytes`] says `None` for it rather than an empty slice;
//! [`WriteData::fetch`] reads it into the part of the receive buffer it
//! would have filled (no allocation), [`WriteData::read_into`] into the
//! handler's own storage, and [`WriteData::splice_to`] writes it to a file
//! either way. Whatever a handler leaves in the pipe is
//! drained by the worker after the handler returns.

use nix::fcntl::{SpliceFFlags, splice};
use nix::sys::uio::pwrite;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

/// The data of a WRITE ([`crate::ops::WriteRequest::data`]).
///
/// Without [`SessionConfig::splice_write`](crate::SessionConfig) it is always
/// bytes in memory ([`WriteData::bytes`] is `Some`). With it, large
/// payloads may wait in a pipe: move them into a file with
/// [`WriteData::splice_to`], or get the bytes with [`WriteData::fetch`].
///
/// ```
/// use fuse_session::WriteData;
///
/// let d = WriteData::from(&b"abc"[..]);
/// assert_eq!(d.len(), 3);
/// assert_eq!(d.bytes(), Some(&b"abc"[..]));
/// assert_eq!(d.fetch().unwrap(), b"abc");
/// ```
#[derive(Clone, Copy)]
pub struct WriteData<'a>(Data<'a>);

#[derive(Clone, Copy)]
enum Data<'a> {
    Bytes(&'a [u8]),
    Pipe(&'a PipePayload<'a>),
}

/// A WRITE payload of `len` bytes at the front of a worker's pipe.
pub(crate) struct PipePayload<'a> {
    pipe: BorrowedFd<'a>,
    len: usize,
    /// Bytes of the payload still in the pipe.
    left: AtomicUsize,
    /// Where [`WriteData::fetch`] reads the payload to (the receive buffer
    /// after the request's header); taken by the first fetch. (Sync types
    /// throughout, so that a `WriteRequest` can still be shared with other
    /// threads for the length of the call; nobody contends for them.)
    spare: Mutex<Option<&'a mut [u8]>>,
    /// The payload's bytes once fetched.
    fetched: OnceLock<&'a [u8]>,
}

impl<'a> PipePayload<'a> {
    /// `len` bytes waiting in `pipe` (its read end, non-blocking); `spare`
    /// must hold at least `len` bytes.
    pub(crate) fn new(pipe: BorrowedFd<'a>, len: usize, spare: &'a mut [u8]) -> Self {
        Self {
            pipe,
            len,
            left: AtomicUsize::new(len),
            spare: Mutex::new(Some(spare)),
            fetched: OnceLock::new(),
        }
    }

    /// Bytes the handler left in the pipe.
    pub(crate) fn left(&self) -> usize {
        self.left.load(Relaxed)
    }

    /// Reads `buf` full from the pipe (the payload is all there already:
    /// a short read means the pipe does not hold what we think).
    fn read_exact(&self, buf: &mut [u8]) -> io::Result<()> {
        let mut got = 0;
        while got < buf.len() {
            match nix::unistd::read(self.pipe, &mut buf[got..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "WRITE payload pipe ran dry",
                    ));
                }
                Ok(n) => {
                    got += n;
                    self.left.fetch_sub(n.min(self.left.load(Relaxed)), Relaxed);
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn fetch(&self) -> io::Result<&'a [u8]> {
        if let Some(&b) = self.fetched.get() {
            return Ok(b);
        }
        if self.left.load(Relaxed) != self.len {
            return Err(io::Error::other(
                "WRITE payload was partly spliced already; its bytes are gone",
            ));
        }
        let mut slot = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&b) = self.fetched.get() {
            return Ok(b);
        }
        let Some(spare) = slot.take() else {
            return Err(io::Error::other("WRITE payload buffer already taken"));
        };
        let buf = &mut spare[..self.len];
        self.read_exact(buf)?;
        let bytes: &'a [u8] = buf;
        Ok(self.fetched.get_or_init(|| bytes))
    }

    fn read_into(&self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(&b) = self.fetched.get() {
            buf[..b.len()].copy_from_slice(b);
            return Ok(b.len());
        }
        if self.left.load(Relaxed) != self.len {
            return Err(io::Error::other(
                "WRITE payload was partly consumed already; its bytes are gone",
            ));
        }
        self.read_exact(&mut buf[..self.len])?;
        Ok(self.len)
    }

    /// Reads what is left of the payload out of the pipe and throws it
    /// away, so that the pipe is empty for the next request. False if the
    /// pipe would not give it all.
    pub(crate) fn drain(&self) -> bool {
        let mut sink = [0u8; 4096];
        while self.left.load(Relaxed) > 0 {
            let n = self.left.load(Relaxed).min(sink.len());
            if self.read_exact(&mut sink[..n]).is_err() {
                return false;
            }
        }
        true
    }

    fn splice_to(&self, fd: BorrowedFd<'_>, offset: u64) -> io::Result<usize> {
        if let Some(&b) = self.fetched.get() {
            return pwrite_all(fd, b, offset);
        }
        if self.left.load(Relaxed) == 0 && self.len > 0 {
            return Err(io::Error::other("WRITE payload was consumed already"));
        }
        let mut off =
            libc::loff_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let mut moved = 0;
        while self.left.load(Relaxed) > 0 {
            match splice(
                self.pipe,
                None,
                fd,
                Some(&mut off),
                self.left.load(Relaxed),
                SpliceFFlags::SPLICE_F_MOVE,
            ) {
                Ok(0) => break,
                Ok(n) => {
                    moved += n;
                    self.left.fetch_sub(n.min(self.left.load(Relaxed)), Relaxed);
                }
                Err(nix::errno::Errno::EINTR) => continue,
                // The file takes no splice (opened O_APPEND, a filesystem
                // without splice_write): through memory, as without a pipe.
                Err(nix::errno::Errno::EINVAL) if moved == 0 => {
                    let b = self.fetch()?;
                    return pwrite_all(fd, b, offset);
                }
                Err(e) if moved == 0 => return Err(e.into()),
                Err(_) => break,
            }
        }
        Ok(moved)
    }
}

/// `pwrite` until all of `data` is written or the file takes no more.
fn pwrite_all(fd: BorrowedFd<'_>, data: &[u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < data.len() {
        let off = offset
            .checked_add(done as u64)
            .and_then(|o| libc::off_t::try_from(o).ok())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        match pwrite(fd, &data[done..], off) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) if done == 0 => return Err(e.into()),
            Err(_) => break,
        }
    }
    Ok(done)
}

impl<'a> WriteData<'a> {
    /// A payload waiting in a pipe.
    pub(crate) fn in_pipe(p: &'a PipePayload<'a>) -> Self {
        WriteData(Data::Pipe(p))
    }

    /// The payload's length in bytes (`fuse_write_in.size`).
    pub fn len(&self) -> usize {
        match self.0 {
            Data::Bytes(b) => b.len(),
            Data::Pipe(p) => p.len,
        }
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, if they are in memory: always without
    /// [`SessionConfig::splice_write`](crate::SessionConfig); `None` while
    /// the payload waits in the worker's pipe (see [`WriteData::fetch`]).
    pub fn bytes(&self) -> Option<&'a [u8]> {
        match self.0 {
            Data::Bytes(b) => Some(b),
            Data::Pipe(p) => p.fetched.get().copied(),
        }
    }

    /// Whether the payload (still) waits in the worker's pipe.
    pub fn is_in_pipe(&self) -> bool {
        self.bytes().is_none()
    }

    /// The bytes, reading them out of the pipe first if they wait there
    /// (into the worker's receive buffer, page-aligned as a WRITE's data
    /// always is; no allocation). Fails if part of the payload was already
    /// spliced away, or the pipe fails.
    pub fn fetch(&self) -> io::Result<&'a [u8]> {
        match self.0 {
            Data::Bytes(b) => Ok(b),
            Data::Pipe(p) => p.fetch(),
        }
    }

    /// Copies the payload into the start of `buf` (straight from the pipe
    /// if it waits there: one copy into your own storage); returns its
    /// length. `buf` must hold [`WriteData::len`] bytes (`EINVAL`
    /// otherwise). After it, a payload that was in the pipe is gone from
    /// there: [`WriteData::fetch`] and [`WriteData::splice_to`] fail.
    pub fn read_into(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.len() < self.len() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        match self.0 {
            Data::Bytes(b) => {
                buf[..b.len()].copy_from_slice(b);
                Ok(b.len())
            }
            Data::Pipe(p) => p.read_into(buf),
        }
    }

    /// The bytes, copied (see [`WriteData::fetch`]).
    pub fn to_vec(&self) -> io::Result<Vec<u8>> {
        self.fetch().map(<[u8]>::to_vec)
    }

    /// Writes the payload to `fd` at `offset`: from the pipe with
    /// `splice(2)` (the bytes never enter user memory), or with `pwrite(2)`
    /// if they are in memory, or if the file refuses a splice (`EINVAL`: a
    /// file opened `O_APPEND`, where `pwrite` appends as `write` would).
    /// Returns the bytes written: fewer than [`WriteData::len`] when the
    /// file took no more (the rest is discarded after the handler returns).
    pub fn splice_to(&self, fd: BorrowedFd<'_>, offset: u64) -> io::Result<usize> {
        match self.0 {
            Data::Bytes(b) => pwrite_all(fd, b, offset),
            Data::Pipe(p) => p.splice_to(fd, offset),
        }
    }
}

impl<'a> From<&'a [u8]> for WriteData<'a> {
    fn from(b: &'a [u8]) -> Self {
        WriteData(Data::Bytes(b))
    }
}

impl std::fmt::Debug for WriteData<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.bytes() {
            Some(b) => write!(f, "WriteData({} bytes)", b.len()),
            None => write!(f, "WriteData({} bytes in a pipe)", self.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn pipe_with(content: &[u8]) -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
        let (r, w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let _ = nix::fcntl::fcntl(w.as_fd(), nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
        assert_eq!(nix::unistd::write(w.as_fd(), content).unwrap(), content.len());
        (r, w)
    }

    fn temp_file(tag: &str) -> std::fs::File {
        let path = std::env::temp_dir().join(format!("fw-payload-{}-{tag}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    /// The whole file, whatever its descriptor's position.
    fn file_bytes(f: &std::fs::File) -> Vec<u8> {
        std::fs::read(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(f))).unwrap()
    }

    #[test]
    fn write_requests_can_still_be_shared_with_scoped_threads() {
        fn send_sync<T: Send + Sync>() {}
        // (WriteRequest's other fields are plain values.)
        send_sync::<WriteData<'static>>();
    }

    #[test]
    fn a_piped_payload_splices_into_a_file_at_its_offset() {
        let content: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        let (r, _w) = pipe_with(&content);
        let mut spare = vec![0u8; content.len()];
        let p = PipePayload::new(r.as_fd(), content.len(), &mut spare);
        let d = WriteData::in_pipe(&p);
        assert!(d.is_in_pipe() && d.bytes().is_none());
        assert_eq!(d.len(), content.len());
        let f = temp_file("splice");
        assert_eq!(d.splice_to(f.as_fd(), 5).unwrap(), content.len());
        assert_eq!(p.left(), 0);
        let got = file_bytes(&f);
        assert_eq!(&got[..5], &[0; 5]);
        assert!(got[5..] == content[..]);
        // Gone from the pipe: fetching now has nothing to give.
        assert!(d.fetch().is_err());
    }

    #[test]
    fn a_fetched_payload_is_bytes_and_then_still_splices() {
        let (r, _w) = pipe_with(b"hello world");
        let mut spare = vec![0u8; 64];
        let p = PipePayload::new(r.as_fd(), 11, &mut spare);
        let d = WriteData::in_pipe(&p);
        assert_eq!(d.fetch().unwrap(), b"hello world");
        assert_eq!(d.bytes(), Some(&b"hello world"[..]));
        assert_eq!(d.to_vec().unwrap(), b"hello world");
        let f = temp_file("fetched");
        assert_eq!(d.splice_to(f.as_fd(), 0).unwrap(), 11);
        assert_eq!(file_bytes(&f), b"hello world");
    }

    #[test]
    fn read_into_takes_the_payload_straight_from_the_pipe() {
        let (r, _w) = pipe_with(b"0123456789");
        let mut spare = vec![0u8; 10];
        let p = PipePayload::new(r.as_fd(), 10, &mut spare);
        let d = WriteData::in_pipe(&p);
        let mut small = [0u8; 4];
        assert_eq!(
            d.read_into(&mut small).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        let mut mine = [0u8; 12];
        assert_eq!(d.read_into(&mut mine).unwrap(), 10);
        assert_eq!(&mine[..10], b"0123456789");
        assert_eq!(p.left(), 0);
        // Gone from the pipe: nothing more to fetch or splice.
        assert!(d.fetch().is_err());
        let f = temp_file("read-into");
        assert!(d.splice_to(f.as_fd(), 0).is_err());
        // Bytes in memory copy as well.
        let b = WriteData::from(&b"xyz"[..]);
        assert_eq!(b.read_into(&mut mine).unwrap(), 3);
        assert_eq!(&mine[..3], b"xyz");
    }

    #[test]
    fn append_only_files_get_the_bytes_written_not_spliced() {
        let (r, _w) = pipe_with(b"tail");
        let mut spare = vec![0u8; 4];
        let p = PipePayload::new(r.as_fd(), 4, &mut spare);
        let f = temp_file("append");
        std::io::Write::write_all(&mut &f, b"head").unwrap();
        let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&f));
        let a = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        assert_eq!(WriteData::in_pipe(&p).splice_to(a.as_fd(), 0).unwrap(), 4);
        assert_eq!(file_bytes(&f), b"headtail");
    }

    #[test]
    fn what_a_handler_leaves_is_drained_and_only_that() {
        let (r, w) = pipe_with(b"payload");
        let mut spare = vec![0u8; 8];
        let p = PipePayload::new(r.as_fd(), 7, &mut spare);
        nix::unistd::write(w.as_fd(), b"next").unwrap();
        assert!(p.drain());
        assert_eq!(p.left(), 0);
        let mut rest = [0u8; 8];
        assert_eq!(nix::unistd::read(r.as_fd(), &mut rest).unwrap(), 4);
        assert_eq!(&rest[..4], b"next");
        // A payload the pipe does not hold cannot be drained.
        let mut spare = vec![0u8; 8];
        let q = PipePayload::new(r.as_fd(), 3, &mut spare);
        assert!(!q.drain());
    }
}

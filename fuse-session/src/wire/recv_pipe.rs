//! The receive pipe of a `/dev/fuse` worker under
//! [`SessionConfig::splice_write`](crate::SessionConfig): each request is
//! spliced from the device into the pipe, its header and (for a WRITE) its
//! `fuse_write_in` are read from there, and the payload of a large WRITE is
//! left in the pipe for the handler ([`crate::payload`]); every other
//! request is read whole into the worker's buffer.
//!
//! The kernel refuses a splice into a pipe without room for the whole
//! request *after* it took the request off its queue (the request is then
//! lost and its caller waits until the connection is aborted), so the pipe
//! must be empty before each receive and hold the largest request: a pipe
//! that cannot is not made, and the worker reads instead.

use crate::buffer::{PAGE, WRITE_PAYLOAD_OFFSET};
use crate::transport::RequestSource;
use fuse_proto::Opcode;
use fuse_proto::abi::{InHeader, WriteIn};
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;
use zerocopy::FromBytes;

/// The largest pipe we ask for.
const PIPE_MAX: usize = 1 << 20;

/// One worker's receive pipe (both ends non-blocking).
pub(crate) struct RecvPipe {
    r: OwnedFd,
    w: OwnedFd,
}

/// Where a received request is.
pub(crate) enum Received {
    /// All of it, this many bytes, in the worker's buffer.
    Whole(usize),
    /// A WRITE: its header and `fuse_write_in` in the buffer
    /// ([`WRITE_PAYLOAD_OFFSET`] bytes), its payload of this many bytes
    /// still in the pipe.
    Write(usize),
}

impl RecvPipe {
    /// A pipe for requests of up to `buffer` bytes: every page of the
    /// request needs a pipe buffer, plus one for a payload that does not
    /// start on a page boundary.
    pub(crate) fn new(buffer: usize) -> io::Result<Self> {
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(io::Error::from)?;
        let mut want = PIPE_MAX;
        while want > PAGE && fcntl(w.as_fd(), FcntlArg::F_SETPIPE_SZ(want as libc::c_int)).is_err() {
            want /= 2;
        }
        let size = fcntl(w.as_fd(), FcntlArg::F_GETPIPE_SZ).map_err(io::Error::from)? as usize;
        let need = buffer.div_ceil(PAGE) + 1;
        if size / PAGE < need {
            return Err(io::Error::other(format!(
                "a request of {buffer} bytes needs {need} pipe buffers; the pipe has {}",
                size / PAGE
            )));
        }
        Ok(Self { r, w })
    }

    /// The read end, where a WRITE's payload waits.
    pub(crate) fn reader(&self) -> BorrowedFd<'_> {
        self.r.as_fd()
    }

    /// Receives one request from `source` (the pipe must be empty). A WRITE
    /// of at least `min_payload` bytes (and nothing after its data) leaves
    /// its payload in the pipe; anything else is read into `buf`, with one
    /// read when it is too short to be such a WRITE (and with two, header
    /// first, otherwise).
    ///
    /// Errors from the source are returned as they are (the pipe is then
    /// empty). If the pipe fails after the request was taken (it cannot:
    /// it is ours and holds the request), the pipe is emptied and the error
    /// returned; the request is lost.
    pub(crate) fn receive(
        &self,
        source: &dyn RequestSource,
        buf: &mut [u8],
        timeout: Option<Duration>,
        min_payload: usize,
    ) -> io::Result<Received> {
        let n = source.receive_to_pipe(self.w.as_fd(), buf.len(), timeout)?;
        let r = self.take(buf, n, min_payload);
        if r.is_err() {
            self.drain();
        }
        r
    }

    fn take(&self, buf: &mut [u8], n: usize, min_payload: usize) -> io::Result<Received> {
        if n > buf.len() {
            return Err(io::Error::other(format!(
                "spliced a {n}-byte request into a {}-byte buffer",
                buf.len()
            )));
        }
        if n < WRITE_PAYLOAD_OFFSET.saturating_add(min_payload) {
            // Too short to be a WRITE whose payload stays: one read.
            self.read_exact(&mut buf[..n])?;
            return Ok(Received::Whole(n));
        }
        let head = WRITE_PAYLOAD_OFFSET;
        self.read_exact(&mut buf[..head])?;
        if let Some(size) = spliceable_write(&buf[..head], n)
            && size >= min_payload
        {
            return Ok(Received::Write(size));
        }
        self.read_exact(&mut buf[head..n])?;
        Ok(Received::Whole(n))
    }

    /// Reads the rest of a WRITE's payload (`len` bytes) into `buf` after
    /// its header, making it a whole request: for a WRITE that must be
    /// queued for another thread.
    pub(crate) fn read_payload(&self, buf: &mut [u8], len: usize) -> io::Result<usize> {
        let end = WRITE_PAYLOAD_OFFSET + len;
        let r = self.read_exact(&mut buf[WRITE_PAYLOAD_OFFSET..end]);
        if r.is_err() {
            self.drain();
        }
        r.map(|()| end)
    }

    fn read_exact(&self, buf: &mut [u8]) -> io::Result<()> {
        let mut got = 0;
        while got < buf.len() {
            match nix::unistd::read(self.r.as_fd(), &mut buf[got..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "receive pipe ran dry",
                    ));
                }
                Ok(n) => got += n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Reads the pipe empty (it is non-blocking: stops at `EAGAIN`).
    pub(crate) fn drain(&self) {
        let mut sink = [0u8; 4096];
        loop {
            match nix::unistd::read(self.r.as_fd(), &mut sink) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
    }
}

/// The payload size of a WRITE whose first `head.len()` bytes are `head`
/// and whose length is `n`, if its payload may stay in the pipe: it has the
/// full `fuse_write_in` (protocol 7.9 on), no extensions, and its data is
/// exactly what the header's length leaves.
fn spliceable_write(head: &[u8], n: usize) -> Option<usize> {
    let (h, rest) = InHeader::read_from_prefix(head).ok()?;
    if h.opcode != Opcode::Write as u32 || h.len as usize != n || h.total_extlen != 0 {
        return None;
    }
    let (arg, _) = WriteIn::read_from_prefix(rest).ok()?;
    let size = arg.size as usize;
    (size_of::<InHeader>() + size_of::<WriteIn>() + size == n).then_some(size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    fn write_request(size: u32, extlen: u16) -> Vec<u8> {
        let len = 80 + size as usize;
        let h = InHeader {
            len: len as u32,
            opcode: Opcode::Write as u32,
            unique: 9,
            nodeid: 2,
            total_extlen: extlen,
            ..Default::default()
        };
        let a = WriteIn {
            size,
            ..Default::default()
        };
        let mut v = h.as_bytes().to_vec();
        v.extend_from_slice(a.as_bytes());
        v.resize(len, 0xab);
        v
    }

    #[test]
    fn only_plain_writes_leave_their_payload() {
        let w = write_request(4096, 0);
        assert_eq!(spliceable_write(&w[..80], w.len()), Some(4096));
        // Length disagreeing with the header, extensions, a short header.
        assert_eq!(spliceable_write(&w[..80], w.len() - 1), None);
        let e = write_request(4096, 1);
        assert_eq!(spliceable_write(&e[..80], e.len()), None);
        assert_eq!(spliceable_write(&w[..60], w.len()), None);
        let mut g = w.clone();
        g[4..8].copy_from_slice(&(Opcode::Getattr as u32).to_ne_bytes());
        assert_eq!(spliceable_write(&g[..80], g.len()), None);
    }

    #[test]
    fn a_pipe_too_small_for_the_largest_request_is_refused() {
        assert!(RecvPipe::new(512 * 1024 + PAGE).is_ok());
        assert!(RecvPipe::new((1 << 20) + PAGE).is_err());
    }
}

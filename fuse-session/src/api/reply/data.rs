//! READ's answer, [`ReplyData`](super::ReplyData): bytes from memory, or
//! moved from a file with `splice(2)`, on a per-thread scratch buffer when
//! they have to be read first.

use super::{ReplyData, errno_of};
use crate::buffer::AlignedBuf;
use crate::conn::WorkerCore;
use crate::splice;
use fuse_proto::{Errno, Opcode, Reply};
use std::cell::RefCell;
use std::os::fd::BorrowedFd;

thread_local! {
    static SCRATCH: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

impl ReplyData {
    /// The bytes or the error.
    pub fn result<D: AsRef<[u8]>, E: Into<Errno>>(self, r: Result<D, E>) {
        match r {
            Ok(d) => self.data(d.as_ref()),
            Err(e) => self.error(e),
        }
    }

    /// The bytes (sent with the header in one `writev`, not copied here).
    pub fn data(self, data: &[u8]) {
        match Reply::data(self.core.unique, data) {
            Ok(r) => self.core.send(&r),
            Err(e) => {
                log::error!("{} reply: {e}", self.core.opcode);
                self.core.error(Errno::EIO)
            }
        }
    }

    /// Fills a per-thread, page-aligned scratch buffer of `len` bytes with
    /// `fill` (which returns how many bytes it produced) and sends them. The
    /// buffer is reused across requests on the same thread, so this
    /// allocates only when a thread first needs a larger one; its alignment
    /// suits `O_DIRECT` reads of a backing file.
    pub fn with_buffer(self, len: usize, fill: impl FnOnce(&mut [u8]) -> std::io::Result<usize>) {
        with_scratch(len, |buf| match fill(buf) {
            Ok(n) => self.data(&buf[..n.min(len)]),
            Err(e) => self.error(e),
        })
    }

    /// Answers a READ with up to `len` bytes of `fd` from `offset`, as
    /// `pread(2)` would read them: fewer only where `fd` itself ends. The
    /// end of the descriptor, not of your file: a file that is a byte range
    /// of a larger one (a tar member at `start` with `size` bytes) must
    /// clamp, passing `start + offset` and at most `size - offset` bytes
    /// (none at or past `size`), or the reply runs on into what follows
    /// the member.
    ///
    /// ```no_run
    /// # use fuse_session::{ReadRequest, reply::ReplyData};
    /// # use std::os::fd::AsFd;
    /// /// A member of the archive `tar`: `size` bytes from byte `start`.
    /// fn read_member(tar: &std::fs::File, start: u64, size: u64, req: ReadRequest, reply: ReplyData) {
    ///     let len = size.saturating_sub(req.offset).min(u64::from(req.size));
    ///     reply.splice_from(tar.as_fd(), start.saturating_add(req.offset), len as usize);
    /// }
    /// ```
    ///
    /// On `/dev/fuse` the bytes go from `fd` into the kernel with `splice(2)`
    /// through two per-thread pipes, without passing through user memory.
    /// Where that cannot be done (another transport, a reply larger than the
    /// pipes hold with its header, an `fd` that cannot be spliced, any
    /// splice error before the reply reached the kernel) it reads into the
    /// scratch buffer of [`ReplyData::with_buffer`] and writes the same
    /// reply instead; the caller cannot tell the two apart. A read error is
    /// answered with its errno.
    pub fn splice_from(mut self, fd: BorrowedFd<'_>, offset: u64, len: usize) {
        if len > 0 && self.core.worker.channel().supports_splice() {
            let unique = self.core.unique;
            let opcode = self.core.opcode;
            let core = &mut self.core;
            let sent = splice::with_pipes(|pipes| {
                if !pipes.fits(offset, len) {
                    return false;
                }
                match pipes.stage(fd, offset, len, unique) {
                    Ok(total) => {
                        core.finish_spliced(pipes, total, |worker, unique| {
                            resend_read(worker, opcode, unique, fd, offset, len)
                        });
                        true
                    }
                    Err(e) => {
                        log::debug!("{opcode} {unique}: not spliced ({e}); reading into memory");
                        false
                    }
                }
            });
            if sent == Some(true) {
                return;
            }
        }
        self.with_buffer(len, |buf| splice::pread_full(fd, buf, offset));
    }
}

/// Runs `f` on a per-thread, page-aligned scratch buffer of `len` bytes (a
/// buffer of its own when re-entered from inside `f`).
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|s| {
        let Ok(mut slot) = s.try_borrow_mut() else {
            let mut own = AlignedBuf::new(len, 0);
            return f(&mut own.as_mut_slice()[..len]);
        };
        let scratch = slot.get_or_insert_with(|| AlignedBuf::new(len, 0));
        scratch.ensure(len);
        f(&mut scratch.as_mut_slice()[..len])
    })
}

/// The answer [`ReplyData::splice_from`] writes when a staged reply was
/// refused whole: the same bytes, read into memory (already counted).
fn resend_read(
    worker: &WorkerCore,
    opcode: Opcode,
    unique: u64,
    fd: BorrowedFd<'_>,
    offset: u64,
    len: usize,
) {
    with_scratch(len, |buf| match splice::pread_full(fd, buf, offset) {
        Ok(n) => match Reply::data(unique, &buf[..n]) {
            Ok(r) => worker.send_reply(opcode, unique, &r),
            Err(_) => worker.send_reply(opcode, unique, &Reply::error(unique, Errno::EIO)),
        },
        Err(e) => worker.send_reply(opcode, unique, &Reply::error(unique, errno_of(&e))),
    })
}

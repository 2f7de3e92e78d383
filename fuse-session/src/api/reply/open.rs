//! The answers that open a file: OPEN and OPENDIR, CREATE, TMPFILE and
//! atomic open, with the file handle, its flags and a passthrough backing
//! file.

use super::{ReplyCreate, ReplyOpen};
use crate::backing::BackingFile;
use crate::types::{Entry, FileHandle};
use fuse_proto::abi::OpenOut;
use fuse_proto::ext::atomic_open::FOPEN_FILE_CREATED;
use fuse_proto::flags::FopenFlags;
use fuse_proto::{Errno, Reply};

/// How an open reply hands the file to the kernel.
fn open_out(fh: FileHandle, flags: FopenFlags, backing: Option<&BackingFile>) -> Result<OpenOut, Errno> {
    let mut flags = flags;
    let mut backing_id = 0;
    if let Some(b) = backing {
        flags |= FopenFlags::PASSTHROUGH;
        if !FopenFlags::PASSTHROUGH_MASK.contains(flags) {
            log::error!(
                "open reply: {:?} cannot be combined with PASSTHROUGH (only DIRECT_IO, \
                 PARALLEL_DIRECT_WRITES and NOFLUSH can); answering EINVAL",
                flags.difference(FopenFlags::PASSTHROUGH_MASK)
            );
            return Err(Errno::EINVAL);
        }
        backing_id = b.id();
    } else if flags.contains(FopenFlags::PASSTHROUGH) {
        log::error!("open reply: PASSTHROUGH without a backing file; answering EINVAL");
        return Err(Errno::EINVAL);
    }
    Ok(OpenOut {
        fh: fh.0,
        open_flags: flags.bits(),
        backing_id,
    })
}

impl ReplyOpen {
    /// Opened with handle `fh` and `flags` (e.g. `DIRECT_IO | PARALLEL_DIRECT_WRITES`).
    /// The answer of an `O_DIRECT` open may get those two added by the
    /// session ([`crate::SessionConfig::o_direct_parallel_writes`]).
    ///
    /// ```no_run
    /// # fn doc(reply: fuse_session::reply::ReplyOpen) {
    /// use fuse_session::FileHandle;
    /// use fuse_session::proto::flags::FopenFlags;
    ///
    /// // Generated content whose size is not known when `stat` asks:
    /// // DIRECT_IO makes every read(2) a READ, whatever the size says.
    /// reply.opened(FileHandle(0), FopenFlags::DIRECT_IO);
    /// # }
    /// ```
    pub fn opened(self, fh: FileHandle, flags: FopenFlags) {
        self.finish(fh, flags, None)
    }

    /// Opened (handle and flags) or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<(FileHandle, FopenFlags), E>) {
        match r {
            Ok((fh, flags)) => self.opened(fh, flags),
            Err(e) => self.error(e),
        }
    }

    /// Opened in kernel passthrough mode: reads and writes go straight to
    /// `backing` (only `DIRECT_IO`, `PARALLEL_DIRECT_WRITES`, `NOFLUSH` may join).
    ///
    /// Keep a clone of `backing` until this file's RELEASE: the kernel looks
    /// the backing id up after it reads this reply, so dropping the last
    /// clone right after answering races with the open and fails it (EIO).
    pub fn passthrough(self, fh: FileHandle, flags: FopenFlags, backing: &BackingFile) {
        self.finish(fh, flags, Some(backing))
    }

    fn finish(self, fh: FileHandle, flags: FopenFlags, backing: Option<&BackingFile>) {
        match open_out(fh, self.core.open_flags(flags, backing), backing) {
            Ok(out) => {
                let u = self.core.unique;
                self.core.send(&Reply::open(u, &out))
            }
            Err(e) => self.core.error(e),
        }
    }
}

impl ReplyCreate {
    /// Makes an `ENOSYS` answer go out as `errno` (the default CREATE).
    pub(crate) fn enosys_as(mut self, errno: Errno) -> Self {
        self.core.enosys_as = Some(errno);
        self
    }

    /// Created and opened (entry, handle, flags), or the error.
    pub fn result<E: Into<Errno>>(self, r: Result<(Entry, FileHandle, FopenFlags), E>) {
        match r {
            Ok((entry, fh, flags)) => self.created(&entry, fh, flags),
            Err(e) => self.error(e),
        }
    }

    /// The file was created by this call and opened.
    pub fn created(self, entry: &Entry, fh: FileHandle, flags: FopenFlags) {
        self.finish(entry, fh, flags, None, true)
    }

    /// The file already existed and was opened (atomic open without
    /// `O_EXCL`); for FUSE_CREATE it is the same as [`ReplyCreate::created`].
    pub fn opened(self, entry: &Entry, fh: FileHandle, flags: FopenFlags) {
        self.finish(entry, fh, flags, None, false)
    }

    /// Like [`ReplyCreate::created`] / [`ReplyCreate::opened`] in passthrough mode.
    pub fn passthrough(
        self,
        entry: &Entry,
        fh: FileHandle,
        flags: FopenFlags,
        backing: &BackingFile,
        created: bool,
    ) {
        self.finish(entry, fh, flags, Some(backing), created)
    }

    fn finish(
        self,
        entry: &Entry,
        fh: FileHandle,
        flags: FopenFlags,
        backing: Option<&BackingFile>,
        created: bool,
    ) {
        match open_out(fh, self.core.open_flags(flags, backing), backing) {
            Ok(mut out) => {
                if created && self.core.atomic_open {
                    out.open_flags |= FOPEN_FILE_CREATED;
                }
                let r = Reply::create(self.core.unique, &entry.to_out(), &out, self.core.minor());
                self.core.send(&r)
            }
            Err(e) => self.core.error(e),
        }
    }
}

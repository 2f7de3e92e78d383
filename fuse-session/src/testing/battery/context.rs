//! The context a scenario runs in ([`Ctx`]: the kernel, the directory,
//! the owner, the differences so far) and its steps: a result the next
//! steps need, an error expected, a check, and the small helpers that
//! create, read and stat files.

use super::Battery;
use crate::filesystem::Filesystem;
use crate::testing::kernel::TestKernel;
use crate::testing::wire::Caller;
use crate::types::{FileHandle, Inode};
use fuse_proto::Errno;
use fuse_proto::abi::{Attr, EntryOut};
use std::cell::RefCell;
use std::fmt;

/// Why a scenario stopped before its end.
pub(super) enum Stop {
    Unsupported(String),
    /// A step failed whose result the next ones need (the difference is
    /// recorded already).
    Failed,
}

pub(super) type Step<T = ()> = Result<T, Stop>;

pub(super) struct Ctx<'k, F: Filesystem> {
    pub(super) k: &'k TestKernel<F>,
    pub(super) dir: Inode,
    pub(super) battery: &'k Battery,
    pub(super) owner: Caller,
    /// Every difference so far.
    pub(super) diffs: RefCell<Vec<String>>,
}

pub(super) const REG: u32 = libc::S_IFREG;

impl<F: Filesystem> Ctx<'_, F> {
    /// Records a difference (the scenario goes on).
    pub(super) fn differs(&self, d: String) {
        self.diffs.borrow_mut().push(d);
    }

    /// Why `e` (the answer to the latest request) makes the scenario
    /// unsupported, if it does.
    fn unsupported(&self, op: &str, e: Errno) -> Option<String> {
        if matches!(e, Errno::ENOSYS | Errno::EROFS) {
            return Some(format!("{op}: {e}"));
        }
        let (code, _) = self.k.checker().last_answer()?;
        self.battery
            .refused
            .iter()
            .any(|&(o, d)| o == code && d == e)
            .then(|| format!("{op}: {e} (declared)"))
    }

    /// The result of operation `op`, which the next steps need: an error
    /// stops the scenario (unsupported, or a difference).
    pub(super) fn need<T>(&self, op: &str, r: Result<T, Errno>) -> Step<T> {
        r.map_err(|e| match self.unsupported(op, e) {
            Some(why) => Stop::Unsupported(why),
            None => {
                self.differs(format!("{op}: {e}"));
                Stop::Failed
            }
        })
    }

    /// An operation that must fail with one of `want`.
    pub(super) fn expect_err<T: fmt::Debug>(&self, op: &str, r: Result<T, Errno>, want: &[Errno]) -> Step {
        match r {
            Err(e) if want.contains(&e) => Ok(()),
            Err(e) if let Some(why) = self.unsupported(op, e) => Err(Stop::Unsupported(why)),
            other => {
                self.differs(format!("{op}: {other:?}, expected {want:?}"));
                Ok(())
            }
        }
    }

    /// A step's result: a difference if not `ok` (the scenario goes on).
    pub(super) fn check(&self, what: &str, ok: bool, detail: impl FnOnce() -> String) -> Step {
        if !ok {
            self.differs(format!("{what}: {}", detail()));
        }
        Ok(())
    }

    pub(super) fn create(&self, name: &str, data: &[u8], mode: u32) -> Step<(Inode, FileHandle)> {
        let (e, o) = self.need(
            &format!("CREATE {name}"),
            self.k.create(self.dir, name, REG | mode, libc::O_RDWR),
        )?;
        let (ino, fh) = (Inode(e.nodeid), FileHandle(o.fh));
        if !data.is_empty() {
            let n = self.need(&format!("WRITE {name}"), self.k.write(ino, fh, 0, data))?;
            self.check(&format!("WRITE {name}"), n as usize == data.len(), || {
                format!("{n} of {} bytes written", data.len())
            })?;
        }
        Ok((ino, fh))
    }

    pub(super) fn created(&self, name: &str, data: &[u8]) -> Step<Inode> {
        let (ino, fh) = self.create(name, data, 0o644)?;
        self.need("RELEASE", self.k.release(ino, fh))?;
        Ok(ino)
    }

    /// CREATE `name` in `dir` with permission bits `mode`, then RELEASE.
    pub(super) fn created_in(&self, dir: Inode, name: &str, mode: u32) -> Step<EntryOut> {
        let (e, o) = self.need(
            &format!("CREATE {name}"),
            self.k.create(dir, name, REG | mode, libc::O_RDWR),
        )?;
        self.need("RELEASE", self.k.release(Inode(e.nodeid), FileHandle(o.fh)))?;
        Ok(e)
    }

    pub(super) fn read_all(&self, name: &str, ino: Inode, fh: FileHandle) -> Step<Vec<u8>> {
        self.need(&format!("READ {name}"), self.k.read(ino, fh, 0, 1 << 20))
    }

    /// Opens `ino`, reads it whole, releases it.
    pub(super) fn contents(&self, name: &str, ino: Inode) -> Step<Vec<u8>> {
        let fh = FileHandle(
            self.need(&format!("OPEN {name}"), self.k.open(ino, libc::O_RDONLY))?
                .fh,
        );
        let d = self.read_all(name, ino, fh);
        self.need("RELEASE", self.k.release(ino, fh))?;
        d
    }

    pub(super) fn attr(&self, name: &str, ino: Inode) -> Step<Attr> {
        Ok(self
            .need(&format!("GETATTR {name}"), self.k.getattr(ino, None))?
            .attr)
    }
}

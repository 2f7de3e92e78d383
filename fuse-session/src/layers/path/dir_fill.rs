//! Where a directory listing by path goes ([`PathDirFill`]): each entry's
//! `d_ino` found without the filesystem's help.

use crate::attr::FileKind;
use crate::reply::*;
use crate::types::Inode;

/// Where [`PathFilesystem::readdir`](super::PathFilesystem::readdir) puts a directory's entries.
///
/// Each entry carries the inode number `readdir(3)` shows (`d_ino`), which
/// must be the `st_ino` that `stat` gives the same name. [`add`](Self::add)
/// finds it with no code of the filesystem's: the node's if the kernel
/// knows the name, otherwise the [`FileAttr::ino`](crate::FileAttr::ino) the filesystem's
/// [`getattr`](super::PathFilesystem::getattr) reports for the path (one call per
/// such name). A filesystem that has the numbers at hand (a mirror reading
/// its source's `d_ino`) gives them with [`add_with_ino`](Self::add_with_ino)
/// and saves those calls.
///
/// Cookies (`next`) are the filesystem's, from 1 to [`MAX_COOKIE`](super::MAX_COOKIE); the
/// kernel passes one back as `offset` to continue after its entry. An entry
/// with a cookie out of that range is left out (logged,
/// [`DirAdd::Skipped`]) rather than sent with a cookie another entry has.
pub struct PathDirFill<'r> {
    pub(super) reply: &'r mut ReplyDirectory,
    pub(super) full: bool,
    pub(super) ino_of: &'r mut dyn FnMut(&[u8]) -> u64,
}

/// The `d_ino` sent for a name whose `st_ino` is not known yet: one the
/// kernel has not looked up, of a filesystem that reports no
/// [`FileAttr::ino`](crate::FileAttr::ino) (its `st_ino` is the node id a LOOKUP will give it).
pub const UNKNOWN_INO: u64 = 0xffff_ffff;

impl PathDirFill<'_> {
    /// Adds `name` of `kind` with cookie `next`: the `offset` the kernel
    /// passes back to continue the listing after this entry (1 to
    /// [`MAX_COOKIE`](super::MAX_COOKIE)). Its `d_ino` is found as the [type's
    /// documentation](Self) says. Says what it did, as
    /// [`ReplyDirectory::add`] does:
    /// [`DirAdd::Full`] means the entry is not in the reply and none after
    /// it will be (stop; the kernel asks again from the last entry it
    /// got), [`DirAdd::Skipped`] a name the kernel would reject or a cookie
    /// out of range (logged, left out), [`DirAdd::Added`] an entry sent.
    pub fn add(&mut self, name: &[u8], kind: FileKind, next: u64) -> DirAdd {
        if self.full {
            return DirAdd::Full;
        }
        let ino = (self.ino_of)(name);
        self.add_with_ino(name, kind, next, ino)
    }

    /// [`add`](Self::add) with the entry's inode number given: `ino` must
    /// be the [`FileAttr::ino`](crate::FileAttr::ino) the filesystem's `getattr` reports for it.
    pub fn add_with_ino(&mut self, name: &[u8], kind: FileKind, next: u64, ino: u64) -> DirAdd {
        if self.full {
            return DirAdd::Full;
        }
        let Some(next) = crate::layers::core::wire_cookie(next, name) else {
            return DirAdd::Skipped;
        };
        let added = self.reply.add(Inode(ino), next, kind, name);
        self.full = added.is_full();
        added
    }
}

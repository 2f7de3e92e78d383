//! Where a node's directory listing goes ([`DirFill`]): READDIR or
//! READDIRPLUS entries, each node entered as the kernel is told of it.

use crate::context::RequestContext;
use crate::reply::*;
use crate::types::Inode;
use fuse_proto::Errno;

use super::{NodeFs, NodeRef};

pub(super) enum Out<'r> {
    Plain(&'r mut ReplyDirectory),
    Plus(&'r mut ReplyDirectoryPlus),
}

/// Where [`Node::readdir`](super::Node::readdir) puts a directory's entries.
pub struct DirFill<'r, 'c> {
    pub(super) ctx: &'r RequestContext<'c>,
    pub(super) fs: &'r NodeFs,
    pub(super) out: Out<'r>,
    pub(super) full: bool,
}

impl DirFill<'_, '_> {
    /// Adds `name` (leading to `node`) with cookie `next`: the `offset`
    /// the kernel passes back to continue the listing after this entry
    /// (1 to [`MAX_COOKIE`](super::MAX_COOKIE); an entry with a cookie out of that range is
    /// left out, logged, rather than sent with a cookie another entry has).
    /// Its `d_ino` is the node's `st_ino`, as `stat` reports it. Says what
    /// it did, as [`ReplyDirectory::add`] does: [`DirAdd::Full`] means the
    /// entry is not in the reply and none after it will be (stop; the
    /// kernel asks again from the last entry it got), [`DirAdd::Skipped`]
    /// an entry left out (a name the kernel would reject, a cookie out of
    /// range, or a node whose attributes cannot be read: logged),
    /// [`DirAdd::Added`] an entry sent.
    pub fn add(&mut self, name: &[u8], next: u64, node: &NodeRef) -> DirAdd {
        if self.full {
            return DirAdd::Full;
        }
        let Some(next) = crate::layers::core::wire_cookie(next, name) else {
            return DirAdd::Skipped;
        };
        let added = match &mut self.out {
            Out::Plain(reply) => {
                let attr = match self.fs.attr_of(node, self.ctx) {
                    Ok(a) => a,
                    Err(e) => return unreadable(name, e),
                };
                reply.add(Inode(attr.ino), next, attr.kind, name)
            }
            Out::Plus(reply) => {
                let entry = match self.fs.enter(self.ctx, node.clone()) {
                    Ok(e) => e,
                    Err(e) => return unreadable(name, e),
                };
                let added = reply.add(&entry, next, name);
                if !added.counts_lookup() {
                    // Not sent, or not counted by the kernel: give it back.
                    self.fs.forget_one(entry.ino, 1);
                }
                match added {
                    DirPlusAdd::Added { .. } => DirAdd::Added,
                    DirPlusAdd::Full => DirAdd::Full,
                    DirPlusAdd::Skipped => DirAdd::Skipped,
                }
            }
        };
        self.full = added.is_full();
        added
    }

    /// Whether the reply is full.
    pub fn is_full(&self) -> bool {
        self.full
    }
}

/// Logs an entry [`DirFill::add`] leaves out because its node's
/// attributes could not be read.
fn unreadable(name: &[u8], e: Errno) -> DirAdd {
    log::warn!(
        "readdir: skipping {:?}, whose attributes could not be read ({e})",
        String::from_utf8_lossy(name)
    );
    DirAdd::Skipped
}

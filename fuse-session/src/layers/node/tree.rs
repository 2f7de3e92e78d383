//! The node table's bookkeeping: node ids to nodes, a node's attributes
//! with its `st_ino`, entries given and forgotten, open files stored.

use crate::attr::FileAttr;
use crate::context::RequestContext;
use crate::inodes::Forgotten;
use crate::layers::values::Open;
use crate::reply::*;
use crate::types::{Entry, FileHandle, Inode};
use fuse_proto::Errno;
use std::sync::{Arc, Mutex};

use super::filesystem::Opened;
use super::{Held, NodeFs, NodeRef, OpenEntry, key_of};

impl NodeFs {
    pub(super) fn node(&self, ino: Inode) -> Result<NodeRef, Errno> {
        self.held(ino).map(|h| h.node.clone())
    }

    pub(super) fn held(&self, ino: Inode) -> Result<Arc<Held>, Errno> {
        crate::layers::core::held(&self.shared.table, ino)
    }

    /// The attributes of `node`, with the library's `st_ino` if it
    /// reports none.
    pub(super) fn attr_of(&self, node: &NodeRef, ctx: &RequestContext<'_>) -> Result<FileAttr, Errno> {
        let mut attr = node.getattr(ctx)?;
        if attr.ino == 0 {
            attr.ino = self.shared.st_ino(key_of(node));
        }
        Ok(attr)
    }

    /// The entry of `node`, with one lookup reference taken for the reply
    /// about to be sent.
    pub(super) fn enter(&self, ctx: &RequestContext<'_>, node: NodeRef) -> Result<Entry, Errno> {
        let attr = self.attr_of(&node, ctx)?;
        let (ino, generation) = self.shared.table.acquire(key_of(&node), || {
            Arc::new(Held {
                node: node.clone(),
                io: Mutex::default(),
            })
        });
        Ok(Entry {
            ino,
            generation,
            attr,
            entry_ttl: self.opts.entry_ttl,
            attr_ttl: self.opts.attr_ttl,
        })
    }

    pub(super) fn forget_one(&self, ino: Inode, n: u64) {
        if let Forgotten::Dropped(held) = self.shared.table.forget(ino, n) {
            held.node.forgotten();
        }
    }

    pub(super) fn file(&self, fh: FileHandle) -> Result<Arc<OpenEntry>, Errno> {
        crate::layers::core::open_file(&self.shared.files, fh)
    }

    pub(super) fn store_open(&self, held: Arc<Held>, opened: Opened) -> Open {
        let (flags, backing) = crate::layers::core::attach_open(&held.io, opened.flags, opened.backing);
        let fh = self.shared.files.insert(Arc::new(OpenEntry {
            held,
            file: opened.file,
            passthrough: backing.is_some(),
        }));
        Open {
            fh: FileHandle(fh),
            flags,
            backing,
        }
    }

    pub(super) fn new_entry(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        reply: ReplyEntry,
        make: impl FnOnce(&NodeRef) -> Result<NodeRef, Errno>,
    ) {
        reply.result(
            self.node(parent)
                .and_then(|p| make(&p))
                .and_then(|n| self.enter(ctx, n)),
        )
    }
}

//! [`Invalidator`]: drops the kernel's cached state of nodes, from
//! anywhere.

use crate::types::Inode;
use std::sync::Arc;

use super::{NodeRef, Shared, key_of};

/// Drops the kernel's cached state of nodes; see the
/// [module documentation](super#invalidation). Clone freely.
///
/// Each call only queues a notification and returns; nodes the kernel does
/// not hold need none (`Ok` without sending). Errors: the session has not
/// served a request yet, or the kernel lacks the notification.
#[derive(Clone)]
pub struct Invalidator {
    pub(super) shared: Arc<Shared>,
}

impl Invalidator {
    /// The node id the kernel knows `node` by, if it holds it.
    pub fn ino(&self, node: &NodeRef) -> Option<Inode> {
        match key_of(node) {
            k if k == self.shared.root => Some(Inode::ROOT),
            k => self.shared.table.find(&k),
        }
    }

    /// Drops `node`'s cached attributes and content (all of it).
    pub fn content(&self, node: &NodeRef) -> Result<(), crate::notify::NotifyError> {
        self.shared.notifier.inval_content(self.ino(node))
    }

    /// Drops the cached name `name` in directory `dir` (after a change the
    /// kernel did not make: the name now leads elsewhere, or nowhere).
    pub fn entry(&self, dir: &NodeRef, name: &[u8]) -> Result<(), crate::notify::NotifyError> {
        self.shared.notifier.inval_entry(self.ino(dir), name)
    }
}

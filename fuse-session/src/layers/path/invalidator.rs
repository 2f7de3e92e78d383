//! [`PathInvalidator`]: drops the kernel's cached state of paths, from
//! anywhere, without the tree lock.

use crate::inodes::InodeTable;
use crate::layers::core::{NotifierSlot, lock};
use crate::notify::NotifyError;
use crate::types::Inode;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use super::PNode;

/// Drops the kernel's cached state of paths (from [`PathFs::invalidator`](super::PathFs::invalidator));
/// clone freely.
///
/// Each call only queues a notification for the session's notifier thread
/// and never waits, and takes no tree lock, so it is safe anywhere,
/// including inside a method serving the path it invalidates. Paths the
/// kernel holds no entry for need none (`Ok` without sending). It resolves
/// the path through the names the kernel knows without stopping renames: a
/// rename running at the same time may make it invalidate the old or the
/// new place (both harmless) or neither. Errors: no request was served yet,
/// or the kernel lacks the notification.
#[derive(Clone)]
pub struct PathInvalidator {
    pub(super) table: Arc<InodeTable<u64, Arc<PNode>>>,
    pub(super) notifier: Arc<NotifierSlot>,
}

impl PathInvalidator {
    /// The node id the kernel knows `path` by, if it holds one.
    pub fn ino(&self, path: &Path) -> Option<Inode> {
        use std::path::Component;
        let mut at = Inode::ROOT;
        for c in path.components() {
            match c {
                Component::RootDir | Component::CurDir => continue,
                Component::Normal(name) => {
                    let dir = self.table.get(at)?;
                    let (ino, generation) = *lock(&dir.children).get(name.as_bytes())?;
                    if self.table.generation(Inode(ino)) != Some(generation) {
                        return None;
                    }
                    at = Inode(ino);
                }
                _ => return None,
            }
        }
        Some(at)
    }

    /// Drops the cached attributes and content of `path`.
    pub fn content(&self, path: &Path) -> Result<(), NotifyError> {
        self.notifier.inval_content(self.ino(path))
    }

    /// Drops the cached name `name` in directory `dir` (after a change the
    /// kernel did not make).
    pub fn entry(&self, dir: &Path, name: &[u8]) -> Result<(), NotifyError> {
        self.notifier.inval_entry(self.ino(dir), name)
    }
}

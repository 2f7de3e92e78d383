//! The path layer under a keeper: the node table and open files kept
//! where the keeper holds them ([`crate::kept_tree`]), taken over at start
//! ([`PathFs::kept`]), a node's name written as it changes, and a
//! predecessor's open files opened again at their first use.

use crate::context::RequestContext;
use crate::inodes::{HandleTable, InodeTable, Restored, TableMirror};
use crate::kept_tree::{self, KeptOpen, KeptTree};
use crate::layers::core::lock;
use crate::ops::*;
use crate::types::{FileHandle, Inode};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::filesystem::PathFilesystem;
use super::{OpenEntry, PNode, PathFs};

impl<F: PathFilesystem> PathFs<F> {
    /// Serves `fs` under a keeper ([`crate::keeper::KeeperLink::serve`]'s
    /// `restore`, or the fd store's), with its node table and open files
    /// kept where the keeper holds them ([`crate::kept_tree`]): after a
    /// crash or an upgrade every node id the kernel holds names the same
    /// path again, and every open file is opened again through
    /// [`PathFilesystem::open`] (without `O_TRUNC`, `O_CREAT`, `O_EXCL`) at
    /// its first use, under the file handle the kernel holds. The layer
    /// then states [`crate::Recovery::Durable`]. A kept table that is
    /// blank, of another layout or of another connection is refused
    /// ([`crate::kept_tree::NotRecoverable`]: the keeper ends the mount).
    /// Names and attributes may be cached for `ttl`.
    pub fn kept(fs: F, ttl: Duration, restore: &crate::keeper::Restore<'_>) -> std::io::Result<Self> {
        Self::kept_sized(
            fs,
            ttl,
            restore,
            kept_tree::DEFAULT_NODES,
            kept_tree::DEFAULT_OPENS,
        )
    }

    /// [`PathFs::kept`] with room for `nodes` node ids and `opens` open
    /// files in the kept tree (a node beyond them answers `ESTALE` after a
    /// crash, an open file `EBADF`). Every daemon of a mount must use the
    /// same figures.
    pub fn kept_sized(
        fs: F,
        ttl: Duration,
        restore: &crate::keeper::Restore<'_>,
        nodes: usize,
        opens: usize,
    ) -> std::io::Result<Self> {
        let fresh = restore.state.is_none();
        let region = restore
            .vault
            .region(kept_tree::REGION_KEY, KeptTree::bytes_needed(nodes, opens))
            .map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    kept_tree::NotRecoverable(format!("the kept node table cannot be mapped: {e}")),
                )
            })?;
        let tree = Arc::new(KeptTree::open(region, fresh, restore.connection, nodes, opens)?);
        let mirror: Arc<dyn TableMirror<u64>> = tree.clone();
        if fresh {
            let table = InodeTable::with_mirror(PNode::new(Vec::new()), mirror);
            return Ok(Self::build(
                fs,
                ttl,
                table,
                HandleTable::new(),
                Some(tree),
                HashMap::new(),
            ));
        }
        let k = tree.load();
        let root = PNode::new(Vec::new());
        let nodes: HashMap<u64, Arc<PNode>> = k
            .nodes
            .iter()
            .map(|n| {
                let names = n.name.iter().map(|(p, nm)| (*p, nm.clone().into_boxed_slice()));
                (n.ino, PNode::new(names.collect()))
            })
            .collect();
        for n in &k.nodes {
            let Some((parent, name)) = &n.name else { continue };
            let dir = if *parent == Inode::ROOT.0 {
                Some(&root)
            } else {
                nodes.get(parent)
            };
            if let Some(dir) = dir {
                lock(&dir.children).insert(name.clone().into_boxed_slice(), (n.ino, n.generation));
            }
        }
        let pending: HashMap<u64, KeptOpen> = k
            .opens
            .iter()
            .filter(|o| {
                let known = nodes.contains_key(&o.ino);
                if !known {
                    tree.closed(o.slot);
                }
                known
            })
            .map(|o| (o.fh, *o))
            .collect();
        let live = k
            .nodes
            .iter()
            .filter_map(|n| {
                Some(Restored {
                    ino: n.ino,
                    generation: n.generation,
                    lookups: n.lookups,
                    key: n.key,
                    value: nodes.get(&n.ino)?.clone(),
                })
            })
            .collect();
        log::info!(
            "path layer: took over {} nodes and {} open files from the kept table (epoch {})",
            k.nodes.len(),
            pending.len(),
            tree.epoch()
        );
        let table = InodeTable::rebuild(root, mirror, live, k.free, &k.fresh);
        let files = HandleTable::rebuild(&k.handles, Vec::new());
        Ok(Self::build(fs, ttl, table, files, Some(tree), pending))
    }

    /// Writes node `ino`'s newest name to the kept tree (under the node's
    /// shard lock, so a number reused meanwhile is never written over).
    /// One name a node: a hard-linked file keeps the one made last (the
    /// one a client most likely goes on using after removing the old).
    pub(super) fn keep_name(&self, ino: u64, generation: u64, node: &PNode) {
        if let Some(t) = &self.shared.kept {
            let names = lock(&node.names);
            let first = names.last().map(|(p, n)| (*p, &**n));
            self.shared
                .table
                .with_node(Inode(ino), generation, || t.set_name(ino, first));
        }
    }

    /// Opens again, under the number the kernel holds, a file a
    /// predecessor recorded (at its first use). Costs one atomic load
    /// when nothing is pending.
    pub(super) fn revive(&self, ctx: &RequestContext<'_>, fh: FileHandle) {
        if !self.shared.any_pending.load(Ordering::Acquire) || self.shared.files.get(fh.0).is_some() {
            return;
        }
        let mut pending = lock(&self.shared.pending);
        let Some(rec) = pending.remove(&fh.0) else { return };
        if pending.is_empty() {
            self.shared.any_pending.store(false, Ordering::Release);
        }
        let _tree = self.shared.tree.read();
        let flags = OpenFlags::from_bits(rec.flags & !(libc::O_TRUNC | libc::O_CREAT | libc::O_EXCL));
        let r = self.node(Inode(rec.ino)).and_then(|node| {
            let opened = self.shared.fs.open(ctx, &self.path(Inode(rec.ino))?, flags)?;
            Ok((node, opened))
        });
        match r {
            Ok((node, opened)) => {
                let (_, backing) = crate::layers::core::attach_open(&node.io, opened.flags, opened.backing);
                self.shared.files.insert_at(
                    fh.0,
                    Arc::new(OpenEntry {
                        node: node.clone(),
                        file: opened.file,
                        passthrough: backing.is_some(),
                        record: AtomicUsize::new(rec.slot),
                    }),
                );
                lock(&node.open).push(fh.0);
            }
            Err(e) => {
                log::warn!(
                    "file handle {fh} of node {} could not be opened again ({e}): EBADF",
                    rec.ino
                );
                if let Some(t) = &self.shared.kept {
                    t.closed(rec.slot);
                }
            }
        }
    }
}

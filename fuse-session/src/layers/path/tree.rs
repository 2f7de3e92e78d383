//! The tree of names the kernel knows: node ids to paths, entries given
//! and forgotten, names moved and removed, open files and their nodes, and
//! the checks of a request resent after a crash (made, appended or removed
//! already).

use crate::attr::{FileAttr, FileKind};
use crate::context::RequestContext;
use crate::inodes::Forgotten;
use crate::journal::Replay;
use crate::layers::core::{check_name, lock};
use crate::layers::setid::{self, Change};
use crate::layers::values::Open;
use crate::ops::*;
use crate::reply::*;
use crate::types::{Entry, FileHandle, Inode};
use fuse_proto::Errno;
use std::ffi::{CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::filesystem::{PathFilesystem, PathOpened};
use super::{MAX_DEPTH, OpenEntry, PNode, PathFs};

impl<F: PathFilesystem> PathFs<F> {
    pub(super) fn node(&self, ino: Inode) -> Result<Arc<PNode>, Errno> {
        crate::layers::core::held(&self.shared.table, ino)
    }

    /// The path of `ino` (call with a tree lock held). `ENOENT` for a node
    /// that lost its name.
    pub(super) fn path(&self, ino: Inode) -> Result<PathBuf, Errno> {
        let mut names: Vec<Box<[u8]>> = Vec::new();
        let mut at = ino;
        while at != Inode::ROOT {
            let node = self.node(at)?;
            let (parent, name) = lock(&node.names).first().cloned().ok_or(Errno::ENOENT)?;
            names.push(name);
            at = Inode(parent);
            if names.len() > MAX_DEPTH {
                log::error!("the path of node {ino} does not reach the root");
                return Err(Errno::EIO);
            }
        }
        let mut p = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum::<usize>() + 1);
        for n in names.iter().rev() {
            p.push(b'/');
            p.extend_from_slice(n);
        }
        if p.is_empty() {
            p.push(b'/');
        }
        Ok(PathBuf::from(OsStr::from_bytes(&p)))
    }

    pub(super) fn child_path(&self, parent: Inode, name: &CStr) -> Result<PathBuf, Errno> {
        check_name(name)?;
        let mut p = self.path(parent)?;
        p.push(OsStr::from_bytes(name.to_bytes()));
        Ok(p)
    }

    /// The entry for `name` in `parent` with attributes `attr`, one lookup
    /// reference taken (call with a tree lock held, before replying).
    pub(super) fn enter(&self, parent: Inode, name: &[u8], mut attr: FileAttr) -> Result<Entry, Errno> {
        let dir = self.node(parent)?;
        let mut stale = None;
        let (ino, generation) = {
            let mut children = lock(&dir.children);
            let known = children.get(name).copied().and_then(|(ino, generation)| {
                match self.shared.table.acquire_ino(Inode(ino)) {
                    Some((_, g)) if g == generation => Some((Inode(ino), g)),
                    Some(_) => {
                        // The number was reused for another node: not this name.
                        stale = Some(Inode(ino));
                        None
                    }
                    None => None,
                }
            });
            known.unwrap_or_else(|| {
                let here = || vec![(parent.0, Box::<[u8]>::from(name))];
                let (ino, generation) = if attr.kind != FileKind::Directory && attr.nlink > 1 && attr.ino != 0
                {
                    // A hard-linked file: one node for all its names, found
                    // by the inode number the filesystem reports.
                    let (ino, generation) = self.shared.table.acquire(attr.ino, || PNode::new(Vec::new()));
                    if let Some(node) = self.shared.table.get(ino) {
                        node.rename(parent.0, name, Some((parent.0, name)));
                        self.keep_name(ino.0, generation, &node);
                    }
                    (ino, generation)
                } else {
                    let node = PNode::new(here());
                    let (ino, generation) = self.shared.table.insert(node.clone());
                    self.keep_name(ino.0, generation, &node);
                    (ino, generation)
                };
                children.insert(name.into(), (ino.0, generation));
                (ino, generation)
            })
        };
        if let Some(other) = stale {
            self.forget_one(other, 1);
        }
        if attr.ino == 0 {
            attr.ino = ino.0;
        }
        self.remember(ino, &attr);
        Ok(Entry {
            ino,
            generation,
            attr,
            entry_ttl: self.ttl,
            attr_ttl: self.ttl,
        })
    }

    /// The `st_ino` of node `ino` as last reported (its node id when the
    /// filesystem reports none).
    pub(super) fn st_ino(&self, ino: Inode) -> u64 {
        self.shared
            .table
            .get(ino)
            .and_then(|n| *lock(&n.last))
            .map(|a| a.ino)
            .filter(|&i| i != 0)
            .unwrap_or(ino.0)
    }

    /// Gives `ctx` the last attributes of `ino`, the node the kernel
    /// checked a by-name request against ([`RequestContext::node_attr`]).
    pub(super) fn show_node(&self, ctx: &RequestContext<'_>, ino: Inode) {
        ctx.set_node_attr(self.shared.table.get(ino).and_then(|n| *lock(&n.last)));
    }

    /// Keeps `attr` as the last attributes of `ino`.
    pub(super) fn remember(&self, ino: Inode, attr: &FileAttr) {
        if let Some(node) = self.shared.table.get(ino) {
            *lock(&node.last) = Some(*attr);
        }
    }

    /// Gives back `n` references of `ino`; a node dropped leaves its
    /// parent's children.
    pub(super) fn forget_one(&self, ino: Inode, n: u64) {
        let Forgotten::Dropped(node) = self.shared.table.forget(ino, n) else {
            return;
        };
        let names = std::mem::take(&mut *lock(&node.names));
        for (parent, name) in names {
            if let Some(dir) = self.shared.table.get(Inode(parent)) {
                let mut children = lock(&dir.children);
                if children.get(&name).is_some_and(|&(i, _)| i == ino.0) {
                    children.remove(&name);
                }
            }
        }
    }

    /// The node of a child entry, if its number still names it.
    pub(super) fn live(&self, (ino, generation): (u64, u64)) -> Option<Arc<PNode>> {
        let node = self.shared.table.get(Inode(ino))?;
        (self.shared.table.generation(Inode(ino)) == Some(generation)).then_some(node)
    }

    /// Takes `name` out of `parent`'s children and marks its node unnamed.
    pub(super) fn unname(&self, parent: Inode, name: &[u8]) {
        let Some(dir) = self.shared.table.get(parent) else {
            return;
        };
        let child = lock(&dir.children).remove(name);
        if let Some((c, node)) = child.and_then(|c| Some((c, self.live(c)?))) {
            node.rename(parent.0, name, None);
            self.keep_name(c.0, c.1, &node);
        }
    }

    pub(super) fn fix_attr(&self, ino: Inode, mut attr: FileAttr) -> (Duration, FileAttr) {
        if attr.ino == 0 {
            attr.ino = ino.0;
        }
        self.remember(ino, &attr);
        (self.ttl, attr)
    }

    /// Clears the set-ID bits `change` drops from the open `file` (handle
    /// `fh`), through the filesystem's getattr and setattr of the file (no
    /// path: READ, WRITE and the like build none); whether it changed the
    /// mode.
    pub(super) fn clear_setid(
        &self,
        ctx: &RequestContext<'_>,
        change: Change,
        fh: FileHandle,
        file: &F::File,
    ) -> Result<bool, Errno> {
        let fs = &self.shared.fs;
        let cleared = setid::clear(
            ctx,
            change,
            Some(fh),
            || fs.getattr(ctx, None, Some(file)),
            |r| fs.setattr(ctx, None, Some(file), r),
        )?;
        Ok(cleared.is_some())
    }

    pub(super) fn file(&self, fh: FileHandle) -> Result<Arc<OpenEntry<F::File>>, Errno> {
        crate::layers::core::open_file(&self.shared.files, fh)
    }

    pub(super) fn store(
        &self,
        ino: Inode,
        open_flags: OpenFlags,
        node: Arc<PNode>,
        opened: PathOpened<F::File>,
    ) -> Open {
        let (flags, backing) = crate::layers::core::attach_open(&node.io, opened.flags, opened.backing);
        let n = node.clone();
        let entry = Arc::new(OpenEntry {
            node,
            file: opened.file,
            passthrough: backing.is_some(),
            record: AtomicUsize::new(usize::MAX),
        });
        let fh = self.shared.files.insert(entry.clone());
        if let Some(t) = &self.shared.kept {
            t.handle_given(fh);
            if let Some(slot) = t.opened(fh, ino.0, open_flags.bits()) {
                entry.record.store(slot, Ordering::Release);
            }
        }
        lock(&n.open).push(fh);
        Open {
            fh: FileHandle(fh),
            flags,
            backing,
        }
    }

    /// The file to go with a request on `ino`: the one given, or (for a
    /// node without a name) any open file of it.
    pub(super) fn file_for(
        &self,
        ino: Inode,
        fh: Option<FileHandle>,
        named: bool,
    ) -> Option<Arc<OpenEntry<F::File>>> {
        if let Some(fh) = fh {
            return self.shared.files.get(fh.0);
        }
        if named {
            return None;
        }
        let node = self.shared.table.get(ino)?;
        let first = lock(&node.open).first().copied();
        first.and_then(|fh| self.shared.files.get(fh))
    }

    pub(super) fn new_entry(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        reply: ReplyEntry,
        make: impl FnOnce(&Path) -> Result<FileAttr, Errno>,
    ) {
        let _tree = self.shared.tree.read();
        let r = self
            .child_path(parent, name)
            .and_then(|p| self.made_already(ctx, &p).map_or_else(|| make(&p), Ok))
            .and_then(|attr| self.enter(parent, name.to_bytes(), attr));
        reply.result(r)
    }

    /// For a request resent after a crash ([`Replay::MaybeDone`]) that makes
    /// `path`: its attributes if it exists (the dead daemon made it: the
    /// kernel holds the directory's lock through the request, so nothing
    /// else did).
    pub(super) fn made_already(&self, ctx: &RequestContext<'_>, path: &Path) -> Option<FileAttr> {
        (ctx.replay() == Replay::MaybeDone)
            .then(|| self.shared.fs.getattr(ctx, Some(path), None).ok())
            .flatten()
    }

    /// For an appending write under a keeper: whether a predecessor wrote
    /// its `len` bytes already (it died before answering). A first try
    /// notes the file's size in the journal; a resent one finds them done
    /// when the file has grown past that by `len` (the kernel writes one
    /// append to a file at a time, so no other write grew it). Without the
    /// size (a filesystem whose `getattr` cannot answer by open file) the
    /// write is carried out again.
    pub(super) fn appended_already(&self, ctx: &RequestContext<'_>, file: &F::File, len: u64) -> bool {
        let size = || self.shared.fs.getattr(ctx, None, Some(file)).map(|a| a.size);
        match (ctx.replay(), ctx.journal_note()) {
            (Replay::MaybeDone, Some(at)) => size().is_ok_and(|now| now >= at.saturating_add(len)),
            _ => {
                if let Ok(at) = size() {
                    ctx.set_journal_note(at);
                }
                false
            }
        }
    }

    /// For a request resent after a crash that removes `path`: whether it
    /// is gone already.
    pub(super) fn removed_already(&self, ctx: &RequestContext<'_>, path: &Path) -> bool {
        ctx.replay() == Replay::MaybeDone
            && self.shared.fs.getattr(ctx, Some(path), None) == Err(Errno::ENOENT)
    }
}

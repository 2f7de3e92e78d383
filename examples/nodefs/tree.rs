//! nodefs's nodes. Each node locks its own metadata; a directory also locks
//! its entries. A rename takes `RENAMES` first (renames only), then the
//! directories' entry locks, the source before the target, so that two
//! renames never lock two directories in opposite orders.

use fuse_wire::node::{Children, DirFill, Node, NodeRef, OpenFile, Opened};
use fuse_wire::reply::ReplyData;
use fuse_wire::{
    CreateRequest, Errno, FallocateRequest, FileAttr, FileKind, MknodRequest, OpenFlags, ReadRequest,
    RenameFlags, RequestContext, SetattrRequest, WriteRequest,
};
use std::any::Any;
use std::collections::BTreeMap;
use std::ffi::CStr;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::SystemTime;

static RENAMES: Mutex<()> = Mutex::new(());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Longest name.
const NAME_MAX: usize = 255;
/// Largest file (contents are kept in one vector).
const SIZE_MAX: u64 = 1 << 30;

/// A directory's entries (the library's name map with stable cookies).
type Entries = Children<Arc<Inode>>;

fn check_name(name: &CStr) -> Result<&[u8], Errno> {
    match name.to_bytes() {
        n if n.len() > NAME_MAX => Err(Errno::ENAMETOOLONG),
        n => Ok(n),
    }
}

/// What every node has: attributes, and its content by kind.
pub struct Inode {
    attr: Arc<Mutex<FileAttr>>,
    body: Body,
    /// Extended attributes (the kernel checks names, sizes and permissions).
    xattrs: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
}

enum Body {
    Dir(Mutex<Entries>),
    File(Arc<RwLock<Vec<u8>>>),
    Link(Vec<u8>),
    Special,
}

fn new_node(ctx: &RequestContext<'_>, kind: FileKind, mode: u32, body: Body) -> Arc<Inode> {
    // Times now; the owner is the caller, not the daemon.
    let mut attr = FileAttr::new(0, kind, (mode & 0o7777) as u16);
    (attr.uid, attr.gid) = (ctx.uid(), ctx.gid());
    Arc::new(Inode {
        attr: Arc::new(Mutex::new(attr)),
        body,
        xattrs: Mutex::default(),
    })
}

/// The root directory.
pub fn root() -> NodeRef {
    let attr = FileAttr::new(0, FileKind::Directory, 0o755);
    Arc::new(Inode {
        attr: Arc::new(Mutex::new(attr)),
        body: Body::Dir(Mutex::default()),
        xattrs: Mutex::default(),
    })
}

impl Inode {
    fn entries(&self) -> Result<&Mutex<Entries>, Errno> {
        match &self.body {
            Body::Dir(d) => Ok(d),
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// A directory's entries changed: its link count by `nlink`, its
    /// mtime and ctime now.
    fn touch(&self, nlink: i32) {
        let mut a = lock(&self.attr);
        a.nlink = a.nlink.saturating_add_signed(nlink);
        (a.mtime, a.ctime) = (SystemTime::now(), SystemTime::now());
    }

    /// A node gained or lost a name (link, unlink, rename): its link count
    /// by `nlink` and its ctime; its mtime is its content's and stays.
    fn relink(&self, nlink: i32) {
        let mut a = lock(&self.attr);
        a.nlink = a.nlink.saturating_add_signed(nlink);
        a.ctime = SystemTime::now();
    }

    /// Adds a new child `name` of `kind`.
    fn add(
        &self,
        ctx: &RequestContext<'_>,
        name: &CStr,
        kind: FileKind,
        mode: u32,
        body: Body,
    ) -> Result<NodeRef, Errno> {
        let name = check_name(name)?;
        let mut d = lock(self.entries()?);
        if d.contains(name) {
            return Err(Errno::EEXIST);
        }
        let node = new_node(ctx, kind, mode, body);
        let dir = *lock(&self.attr);
        if dir.perm & 0o2000 != 0 {
            // A set-group-ID directory gives its group, and to directories its bit.
            let mut a = lock(&node.attr);
            a.gid = dir.gid;
            if kind == FileKind::Directory {
                a.perm |= 0o2000;
            }
        }
        d.insert(name.to_vec(), node.clone());
        self.touch(if kind == FileKind::Directory { 1 } else { 0 });
        Ok(node)
    }

    fn attr(&self) -> FileAttr {
        let a = *lock(&self.attr);
        match &self.body {
            Body::File(data) => a.with_size(data.read().unwrap_or_else(|e| e.into_inner()).len() as u64),
            _ => a,
        }
    }

    /// Whether `dir` is somewhere below this directory (`dir` itself is
    /// never locked here: the caller holds it).
    fn holds(&self, dir: &Inode) -> bool {
        let Ok(entries) = self.entries() else { return false };
        let children: Vec<Arc<Inode>> = lock(entries).after(0).map(|(_, _, c)| c.clone()).collect();
        children
            .iter()
            .any(|c| c.is_dir() && (std::ptr::eq(&**c, dir) || c.holds(dir)))
    }

    fn is_dir(&self) -> bool {
        matches!(self.body, Body::Dir(_))
    }
}

fn as_arc(node: NodeRef) -> Result<Arc<Inode>, Errno> {
    (node as Arc<dyn Any + Send + Sync>)
        .downcast()
        .map_err(|_| Errno::EXDEV)
}

fn as_inode(node: &NodeRef) -> Result<&Inode, Errno> {
    (&**node as &dyn Any).downcast_ref::<Inode>().ok_or(Errno::EXDEV)
}

impl Node for Inode {
    fn getattr(&self, _: &RequestContext<'_>) -> Result<FileAttr, Errno> {
        Ok(self.attr())
    }

    fn setattr(
        &self,
        _: &RequestContext<'_>,
        req: &SetattrRequest,
        _: Option<&dyn OpenFile>,
    ) -> Result<FileAttr, Errno> {
        if let (Some(size), Body::File(data)) = (req.size, &self.body) {
            if size > SIZE_MAX {
                return Err(Errno::EFBIG);
            }
            data.write()
                .unwrap_or_else(|e| e.into_inner())
                .resize(size as usize, 0);
            lock(&self.attr).mtime = SystemTime::now();
        }
        {
            let mut a = lock(&self.attr);
            req.apply_to(&mut a);
            a.ctime = SystemTime::now();
        }
        Ok(self.attr())
    }

    fn readlink(&self, _: &RequestContext<'_>) -> Result<Vec<u8>, Errno> {
        match &self.body {
            Body::Link(t) => Ok(t.clone()),
            _ => Err(Errno::EINVAL),
        }
    }

    fn open(&self, _: &RequestContext<'_>, flags: OpenFlags) -> Result<Opened, Errno> {
        match &self.body {
            Body::File(data) => Ok(Opened::new(Handle {
                attr: self.attr.clone(),
                data: data.clone(),
                flags,
            })),
            _ => Err(Errno::EINVAL),
        }
    }

    fn getxattr(&self, _: &RequestContext<'_>, name: &CStr) -> Result<Vec<u8>, Errno> {
        lock(&self.xattrs)
            .get(name.to_bytes())
            .cloned()
            .ok_or(Errno::ENODATA)
    }

    fn listxattr(&self, _: &RequestContext<'_>) -> Result<Vec<u8>, Errno> {
        Ok(lock(&self.xattrs)
            .keys()
            .flat_map(|k| k.iter().copied().chain([0]))
            .collect())
    }

    fn setxattr(&self, _: &RequestContext<'_>, name: &CStr, value: &[u8], flags: i32) -> Result<(), Errno> {
        if ![&b"user."[..], b"trusted.", b"security."]
            .iter()
            .any(|p| name.to_bytes().starts_with(p))
        {
            return Err(Errno::EOPNOTSUPP); // the namespaces of a plain filesystem
        }
        let mut x = lock(&self.xattrs);
        match (x.contains_key(name.to_bytes()), flags) {
            (true, libc::XATTR_CREATE) => return Err(Errno::EEXIST),
            (false, libc::XATTR_REPLACE) => return Err(Errno::ENODATA),
            _ => {}
        }
        x.insert(name.to_bytes().to_vec(), value.to_vec());
        lock(&self.attr).ctime = SystemTime::now();
        Ok(())
    }

    fn removexattr(&self, _: &RequestContext<'_>, name: &CStr) -> Result<(), Errno> {
        lock(&self.xattrs)
            .remove(name.to_bytes())
            .map(drop)
            .ok_or(Errno::ENODATA)?;
        lock(&self.attr).ctime = SystemTime::now();
        Ok(())
    }

    fn lookup(&self, _: &RequestContext<'_>, name: &CStr) -> Result<NodeRef, Errno> {
        let name = check_name(name)?;
        let d = lock(self.entries()?);
        d.get(name).map(|n| n.clone() as NodeRef).ok_or(Errno::ENOENT)
    }

    fn readdir(&self, _: &RequestContext<'_>, offset: u64, out: &mut DirFill<'_, '_>) -> Result<(), Errno> {
        let d = lock(self.entries()?);
        for (cookie, name, node) in d.after(offset) {
            if out.add(name, cookie, &(node.clone() as NodeRef)).is_full() {
                break;
            }
        }
        Ok(())
    }

    fn create(
        &self,
        ctx: &RequestContext<'_>,
        name: &CStr,
        req: CreateRequest,
    ) -> Result<(NodeRef, Opened), Errno> {
        let node = self.add(
            ctx,
            name,
            FileKind::RegularFile,
            req.mode,
            Body::File(Arc::default()),
        )?;
        let file = node.open(ctx, req.flags)?;
        Ok((node, file))
    }

    fn mknod(&self, ctx: &RequestContext<'_>, name: &CStr, req: MknodRequest) -> Result<NodeRef, Errno> {
        let kind = req.kind().ok_or(Errno::EINVAL)?;
        if matches!(kind, FileKind::Directory | FileKind::Symlink) {
            return Err(Errno::EPERM); // MKDIR and SYMLINK make those
        }
        let body = if kind == FileKind::RegularFile {
            Body::File(Arc::default())
        } else {
            Body::Special
        };
        let node = self.add(ctx, name, kind, req.mode, body)?;
        if let Ok(n) = as_inode(&node) {
            lock(&n.attr).rdev = req.rdev;
        }
        Ok(node)
    }

    fn mkdir(&self, ctx: &RequestContext<'_>, name: &CStr, mode: u32) -> Result<NodeRef, Errno> {
        self.add(ctx, name, FileKind::Directory, mode, Body::Dir(Mutex::default()))
    }

    fn symlink(&self, ctx: &RequestContext<'_>, name: &CStr, target: &CStr) -> Result<NodeRef, Errno> {
        let node = self.add(
            ctx,
            name,
            FileKind::Symlink,
            0o777,
            Body::Link(target.to_bytes().to_vec()),
        )?;
        if let Ok(n) = as_inode(&node) {
            let mut a = lock(&n.attr);
            *a = a.with_size(target.to_bytes().len() as u64);
        }
        Ok(node)
    }

    fn link(&self, _: &RequestContext<'_>, name: &CStr, node: &NodeRef) -> Result<(), Errno> {
        let inode = as_arc(node.clone())?;
        if inode.is_dir() {
            return Err(Errno::EPERM); // the kernel never asks; a tree stays a tree
        }
        let name = check_name(name)?;
        let mut d = lock(self.entries()?);
        if d.contains(name) {
            return Err(Errno::EEXIST);
        }
        inode.relink(1);
        d.insert(name.to_vec(), inode);
        self.touch(0);
        Ok(())
    }

    fn unlink(&self, _: &RequestContext<'_>, name: &CStr) -> Result<(), Errno> {
        let mut d = lock(self.entries()?);
        match d.get(name.to_bytes()) {
            None => Err(Errno::ENOENT),
            Some(n) if n.is_dir() => Err(Errno::EISDIR),
            Some(_) => {
                let n = d.remove(name.to_bytes()).expect("present");
                n.relink(-1);
                self.touch(0);
                Ok(())
            }
        }
    }

    fn rmdir(&self, _: &RequestContext<'_>, name: &CStr) -> Result<(), Errno> {
        let _renames = lock(&RENAMES); // it locks two directories, too
        let mut d = lock(self.entries()?);
        let n = d.get(name.to_bytes()).ok_or(Errno::ENOENT)?;
        if std::ptr::eq(&**n, self) {
            return Err(Errno::EINVAL);
        }
        if !lock(n.entries()?).is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        d.remove(name.to_bytes()).expect("present").relink(-2);
        self.touch(-1);
        Ok(())
    }

    fn rename(
        &self,
        _: &RequestContext<'_>,
        name: &CStr,
        newdir: &NodeRef,
        newname: &CStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let to = as_inode(newdir)?;
        check_name(newname)?;
        if flags.contains(RenameFlags::WHITEOUT) {
            return Err(Errno::EINVAL);
        }
        let _renames = lock(&RENAMES);
        let (name, newname) = (name.to_bytes(), newname.to_bytes());
        let mut src = lock(self.entries()?);
        let mut other = if std::ptr::eq(self, to) {
            None
        } else {
            Some(lock(to.entries()?))
        };
        let node = src.get(name).cloned().ok_or(Errno::ENOENT)?;
        if node.is_dir() && other.is_some() && (std::ptr::eq(&*node, to) || node.holds(to)) {
            // Into itself or below: the kernel never asks (it checks), but
            // a loop would leave a tree that locks against itself.
            return Err(Errno::EINVAL);
        }
        let old = other.as_ref().unwrap_or(&src).get(newname).cloned();
        if old
            .as_ref()
            .is_some_and(|o| std::ptr::eq(&**o, self) || std::ptr::eq(&**o, to))
        {
            return Err(Errno::EINVAL);
        }
        let moves_dir = |n: &Inode, from: &Inode, into: &Inode| {
            if n.is_dir() && other.is_some() {
                from.touch(-1);
                into.touch(1);
            }
        };
        if flags.contains(RenameFlags::EXCHANGE) {
            let old = old.ok_or(Errno::ENOENT)?;
            moves_dir(&node, self, to);
            moves_dir(&old, to, self);
            src.insert(name.to_vec(), old.clone());
            other
                .as_mut()
                .unwrap_or(&mut src)
                .insert(newname.to_vec(), node.clone());
        } else {
            if let Some(old) = &old {
                if flags.contains(RenameFlags::NOREPLACE) {
                    return Err(Errno::EEXIST);
                }
                if Arc::ptr_eq(old, &node) {
                    return Ok(()); // two names of one file: nothing to do
                }
                match (node.is_dir(), old.is_dir()) {
                    (true, false) => return Err(Errno::ENOTDIR),
                    (false, true) => return Err(Errno::EISDIR),
                    (true, true) if !lock(old.entries()?).is_empty() => return Err(Errno::ENOTEMPTY),
                    (true, true) => {
                        old.relink(-2);
                        to.touch(-1);
                    }
                    _ => old.relink(-1),
                }
            }
            moves_dir(&node, self, to);
            src.remove(name);
            other
                .as_mut()
                .unwrap_or(&mut src)
                .insert(newname.to_vec(), node.clone());
        }
        node.relink(0);
        for n in [self, to] {
            n.touch(0);
        }
        Ok(())
    }
}

/// An open regular file: reads and writes go to the node's bytes.
struct Handle {
    attr: Arc<Mutex<FileAttr>>,
    data: Arc<RwLock<Vec<u8>>>,
    flags: OpenFlags,
}

impl OpenFile for Handle {
    fn read(&self, _: &RequestContext<'_>, req: ReadRequest, reply: ReplyData) {
        let data = self.data.read().unwrap_or_else(|e| e.into_inner());
        let start = (req.offset as usize).min(data.len());
        reply.data(&data[start..start.saturating_add(req.size as usize).min(data.len())]);
    }

    fn write(&self, _: &RequestContext<'_>, req: WriteRequest<'_>) -> Result<u32, Errno> {
        let bytes = req.data.fetch()?;
        if bytes.is_empty() {
            return Ok(0);
        }
        let mut data = self.data.write().unwrap_or_else(|e| e.into_inner());
        let at = if self.flags.append() {
            data.len()
        } else {
            req.offset as usize
        };
        let end = at
            .checked_add(bytes.len())
            .filter(|&e| e as u64 <= SIZE_MAX)
            .ok_or(Errno::EFBIG)?;
        if data.len() < end {
            data.resize(end, 0);
        }
        data[at..end].copy_from_slice(bytes);
        let mut a = lock(&self.attr);
        (a.mtime, a.ctime) = (SystemTime::now(), SystemTime::now());
        Ok(bytes.len() as u32)
    }

    fn fallocate(&self, _: &RequestContext<'_>, req: FallocateRequest) -> Result<(), Errno> {
        // The kernel has checked the fd's mode, the range and the flags'
        // combinations; in memory there is nothing to reserve.
        let keep_size = req.mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let zero = match req.mode & !libc::FALLOC_FL_KEEP_SIZE {
            0 => false,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE => true,
            _ => return Err(Errno::EOPNOTSUPP),
        };
        let end = req
            .offset
            .checked_add(req.length)
            .filter(|&e| e <= SIZE_MAX)
            .ok_or(Errno::EFBIG)?;
        let mut data = self.data.write().unwrap_or_else(|e| e.into_inner());
        let len = data.len() as u64;
        if zero && req.offset < len {
            data[req.offset as usize..end.min(len) as usize].fill(0);
        }
        if !keep_size && end > len {
            data.resize(end as usize, 0);
        }
        if zero || (!keep_size && end > len) {
            let mut a = lock(&self.attr);
            (a.mtime, a.ctime) = (SystemTime::now(), SystemTime::now());
        }
        Ok(())
    }
}

//! The twin's storage, shared by both APIs: directories and regular files
//! in memory, each node locking its own attributes, a directory its
//! entries (the library's name map with stable listing cookies), a file
//! its bytes. Nothing here knows node ids or lookup counts: that is what
//! the two front ends (node_api, raw_api) do differently.

use fuse_wire::node::Children;
use fuse_wire::reply::ReplyData;
use fuse_wire::{Errno, FileAttr, FileKind, OpenFlags, SetattrRequest};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::SystemTime;

/// Longest name.
const NAME_MAX: usize = 255;
/// Largest file (contents are one vector).
const SIZE_MAX: u64 = 1 << 30;

/// Serial numbers (`st_ino`, and the raw front end's node ids); 1 is the root.
static NEXT_INO: AtomicU64 = AtomicU64::new(2);

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One file or directory.
pub struct Inode {
    /// Serial number, never reused.
    pub ino: u64,
    attr: Arc<Mutex<FileAttr>>,
    body: Body,
}

enum Body {
    Dir(Mutex<Children<Arc<Inode>>>),
    File(Arc<RwLock<Vec<u8>>>),
}

impl Inode {
    /// The root directory (serial number 1).
    pub fn root() -> Arc<Inode> {
        Arc::new(Inode {
            ino: 1,
            attr: Arc::new(Mutex::new(FileAttr::new(1, FileKind::Directory, 0o755))),
            body: Body::Dir(Mutex::default()),
        })
    }

    fn entries(&self) -> Result<MutexGuard<'_, Children<Arc<Inode>>>, Errno> {
        match &self.body {
            Body::Dir(d) => Ok(lock(d)),
            Body::File(_) => Err(Errno::ENOTDIR),
        }
    }

    pub fn kind(&self) -> FileKind {
        match self.body {
            Body::Dir(_) => FileKind::Directory,
            Body::File(_) => FileKind::RegularFile,
        }
    }

    pub fn attr(&self) -> FileAttr {
        let a = *lock(&self.attr);
        match &self.body {
            Body::File(data) => a.with_size(data.read().unwrap_or_else(|e| e.into_inner()).len() as u64),
            Body::Dir(_) => a,
        }
    }

    pub fn lookup(&self, name: &[u8]) -> Result<Arc<Inode>, Errno> {
        self.entries()?.get(name).cloned().ok_or(Errno::ENOENT)
    }

    /// Adds a new child `name`: a directory or an empty regular file.
    pub fn add(
        &self,
        (uid, gid): (u32, u32),
        name: &[u8],
        kind: FileKind,
        mode: u32,
    ) -> Result<Arc<Inode>, Errno> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut entries = self.entries()?;
        if entries.contains(name) {
            return Err(Errno::EEXIST);
        }
        let ino = NEXT_INO.fetch_add(1, Ordering::Relaxed);
        let now = SystemTime::now();
        let mut attr = FileAttr::new(ino, kind, (mode & 0o7777) as u16);
        (attr.uid, attr.gid) = (uid, gid);
        (attr.atime, attr.mtime, attr.ctime) = (now, now, now);
        let body = match kind {
            FileKind::Directory => Body::Dir(Mutex::default()),
            FileKind::RegularFile => Body::File(Arc::default()),
            _ => return Err(Errno::EPERM),
        };
        let node = Arc::new(Inode {
            ino,
            attr: Arc::new(Mutex::new(attr)),
            body,
        });
        entries.insert(name.to_vec(), node.clone());
        drop(entries);
        self.touch(i32::from(kind == FileKind::Directory));
        Ok(node)
    }

    /// Removes child `name`: a directory (empty) with `dir`, else a file.
    pub fn remove(&self, name: &[u8], dir: bool) -> Result<(), Errno> {
        let mut entries = self.entries()?;
        let child = entries.get(name).ok_or(Errno::ENOENT)?;
        match (&child.body, dir) {
            (Body::Dir(_), false) => return Err(Errno::EISDIR),
            (Body::File(_), true) => return Err(Errno::ENOTDIR),
            (Body::Dir(d), true) if !lock(d).is_empty() => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        let child = entries.remove(name).ok_or(Errno::ENOENT)?;
        drop(entries);
        let mut a = lock(&child.attr);
        a.nlink = 0;
        a.ctime = SystemTime::now();
        drop(a);
        self.touch(if dir { -1 } else { 0 });
        Ok(())
    }

    fn touch(&self, nlink: i32) {
        let mut a = lock(&self.attr);
        a.nlink = a.nlink.saturating_add_signed(nlink);
        (a.mtime, a.ctime) = (SystemTime::now(), SystemTime::now());
    }

    pub fn setattr(&self, req: &SetattrRequest) -> Result<FileAttr, Errno> {
        if let Some(size) = req.size {
            let Body::File(data) = &self.body else {
                return Err(Errno::EISDIR);
            };
            if size > SIZE_MAX {
                return Err(Errno::EFBIG);
            }
            data.write()
                .unwrap_or_else(|e| e.into_inner())
                .resize(size as usize, 0);
            lock(&self.attr).mtime = SystemTime::now();
        }
        let mut a = lock(&self.attr);
        req.apply_to(&mut a);
        a.ctime = SystemTime::now();
        drop(a);
        Ok(self.attr())
    }

    /// What an open of this file keeps.
    pub fn open(&self, flags: OpenFlags) -> Result<OpenState, Errno> {
        match &self.body {
            Body::File(data) => Ok(OpenState {
                attr: self.attr.clone(),
                data: data.clone(),
                append: flags.append(),
            }),
            Body::Dir(_) => Err(Errno::EISDIR),
        }
    }

    /// Calls `each(cookie, name, child)` for the children after cookie
    /// `offset` until it returns false.
    pub fn list(
        &self,
        offset: u64,
        mut each: impl FnMut(u64, &[u8], &Arc<Inode>) -> bool,
    ) -> Result<(), Errno> {
        for (cookie, name, child) in self.entries()?.after(offset) {
            if !each(cookie, name, child) {
                break;
            }
        }
        Ok(())
    }
}

/// An open regular file: reads and writes go to the node's bytes (which
/// outlive an unlink while open).
pub struct OpenState {
    attr: Arc<Mutex<FileAttr>>,
    data: Arc<RwLock<Vec<u8>>>,
    append: bool,
}

impl OpenState {
    pub fn read(&self, offset: u64, size: u32, reply: ReplyData) {
        self.with_range(offset, size, |bytes| reply.data(bytes))
    }

    /// `size` bytes from `offset` (fewer at the end), given to `f`.
    pub fn with_range<R>(&self, offset: u64, size: u32, f: impl FnOnce(&[u8]) -> R) -> R {
        let data = self.data.read().unwrap_or_else(|e| e.into_inner());
        let start = (offset as usize).min(data.len());
        f(&data[start..start.saturating_add(size as usize).min(data.len())])
    }

    pub fn write(&self, offset: u64, bytes: &[u8]) -> Result<u32, Errno> {
        if bytes.is_empty() {
            return Ok(0);
        }
        let mut data = self.data.write().unwrap_or_else(|e| e.into_inner());
        let at = if self.append { data.len() } else { offset as usize };
        let end = at
            .checked_add(bytes.len())
            .filter(|&e| e as u64 <= SIZE_MAX)
            .ok_or(Errno::EFBIG)?;
        if data.len() < end {
            data.resize(end, 0);
        }
        data[at..end].copy_from_slice(bytes);
        drop(data);
        let mut a = lock(&self.attr);
        (a.mtime, a.ctime) = (SystemTime::now(), SystemTime::now());
        Ok(bytes.len() as u32)
    }
}

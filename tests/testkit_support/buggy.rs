//! A deliberately buggy filesystem for the test kit's own tests: a flat
//! in-memory directory of regular files, correct unless a [`Bug`] is
//! seeded, each bug breaking one rule of the protocol checker the way real
//! filesystems break it.
#![allow(dead_code)]

use fuse_wire::reply::{
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite,
};
use fuse_wire::{
    CreateRequest, Entry, Errno, FileAttr, FileHandle, FileKind, Filesystem, FopenFlags, Inode, LockOwner,
    OpenFlags, ReadRequest, ReleaseRequest, RenameRequest, RequestContext, SetattrRequest, Statfs,
    WriteRequest,
};
use std::collections::{BTreeMap, HashMap};
use std::ffi::CStr;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, SystemTime};

/// The seeded bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// None: the filesystem keeps every rule.
    None,
    /// lookup-count: a node is dropped at UNLINK rather than at its last
    /// FORGET, and its id handed out again (with a new generation).
    ForgetsAtUnlink,
    /// readdir-cookie: cookies are positions in the current listing, so an
    /// UNLINK during a listing makes it skip a name.
    PositionCookies,
    /// entry-attr: GETATTR reports every file as a directory.
    WrongType,
    /// reply-size: READ answers more bytes than asked for.
    LongRead,
    /// errno: a failed LOOKUP answers an error number Linux does not know.
    UnknownErrno,
    /// answer: LOOKUP of "hang" is never answered (until released).
    LostReply,
    /// handle-after-release: FLUSH frees the handle (it is RELEASE's job),
    /// so a read after `close` of a `dup` fails with EBADF.
    FlushFrees,
    /// attr-backwards: the size is that of the last write, not the end of
    /// the furthest one.
    SizeOfLastWrite,
    /// panic: LOOKUP of "boom" panics.
    Panics,
    /// lookup-count: LOOKUP of an existing name does not count the lookup.
    UndercountsLookup,
    /// posix: LOOKUP answers ENOENT for names it has (a cache keyed by
    /// something else).
    LookupEnoent,
    /// posix: SETATTR of the size answers the old size and changes nothing.
    IgnoresTruncate,
    /// posix: READ answers at most 3 bytes.
    ShortRead,
    /// posix: STATFS answers block size 0.
    StatfsZero,
    /// lookup-count: a node id is handed out again, once forgotten, with
    /// the generation it had.
    SameGeneration,
    /// battery: new files are owned by the server's own uid, not the
    /// caller's.
    OwnUid,
    /// battery: RENAME is refused with EOPNOTSUPP (by design: the
    /// battery is told so).
    RefusesRename,
    /// explorer: the first WRITE after a truncate is answered but lost
    /// (an ordering bug no battery scenario reaches).
    WriteAfterTruncateLost,
}

struct File {
    generation: u64,
    data: Vec<u8>,
    /// The size GETATTR reports (what SizeOfLastWrite gets wrong).
    size: u64,
    nlink: u32,
    perm: u16,
    owner: (u32, u32),
    /// Truncated since the last write.
    truncated: bool,
}

struct Inner {
    names: BTreeMap<Vec<u8>, u64>,
    files: HashMap<u64, File>,
    lookups: HashMap<u64, u64>,
    handles: HashMap<u64, u64>,
    next_fh: u64,
    next_generation: u64,
}

/// The filesystem.
pub struct Buggy {
    bug: Bug,
    inner: Mutex<Inner>,
    hang: Mutex<bool>,
    hang_cv: Condvar,
}

const TTL: Duration = Duration::ZERO;

impl Buggy {
    pub fn new(bug: Bug) -> Buggy {
        Buggy {
            bug,
            inner: Mutex::new(Inner {
                names: BTreeMap::new(),
                files: HashMap::new(),
                lookups: HashMap::new(),
                handles: HashMap::new(),
                next_fh: 1,
                next_generation: 1,
            }),
            hang: Mutex::new(true),
            hang_cv: Condvar::new(),
        }
    }

    /// Lets a LOOKUP of "hang" answer.
    pub fn release_hang(&self) {
        *self.hang.lock().unwrap() = false;
        self.hang_cv.notify_all();
    }

    /// The lookup counts the filesystem keeps.
    pub fn lookup_counts(&self) -> Vec<(Inode, u64)> {
        let i = self.inner.lock().unwrap();
        i.lookups.iter().map(|(&n, &c)| (Inode(n), c)).collect()
    }

    fn attr(&self, ino: u64, f: &File, getattr: bool) -> FileAttr {
        let kind = if getattr && self.bug == Bug::WrongType {
            FileKind::Directory
        } else {
            FileKind::RegularFile
        };
        let mut a = FileAttr::at(ino, kind, f.perm, SystemTime::UNIX_EPOCH).with_size(f.size);
        a.nlink = f.nlink;
        (a.uid, a.gid) = f.owner;
        a
    }

    fn entry(&self, i: &mut Inner, ino: u64) -> Entry {
        let f = &i.files[&ino];
        let mut e = Entry::new(Inode(ino), self.attr(ino, f, false), TTL);
        e.generation = f.generation;
        *i.lookups.entry(ino).or_default() += 1;
        e
    }

    fn root_attr() -> FileAttr {
        FileAttr::at(1, FileKind::Directory, 0o755, SystemTime::UNIX_EPOCH)
    }

    /// A free node id: the lowest unused (with ForgetsAtUnlink, one that
    /// the kernel may still hold).
    fn new_id(i: &Inner) -> u64 {
        (2..).find(|n| !i.files.contains_key(n)).unwrap_or(u64::MAX)
    }

    /// The listing after `.` and `..`: (cookie, ino, name).
    fn listing(&self, i: &Inner) -> Vec<(u64, u64, Vec<u8>)> {
        let mut v: Vec<(u64, u64, Vec<u8>)> = i
            .names
            .iter()
            .map(|(n, &ino)| (ino + 2, ino, n.clone()))
            .collect();
        v.sort();
        if self.bug == Bug::PositionCookies {
            for (pos, e) in v.iter_mut().enumerate() {
                e.0 = pos as u64 + 3;
            }
        }
        v
    }
}

impl Filesystem for Buggy {
    fn lookup(&self, _: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        if parent != Inode::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        if name.to_bytes() == b"boom" && self.bug == Bug::Panics {
            panic!("a seeded panic");
        }
        if name.to_bytes() == b"hang" && self.bug == Bug::LostReply {
            let mut h = self.hang.lock().unwrap();
            while *h {
                h = self.hang_cv.wait_timeout(h, Duration::from_secs(30)).unwrap().0;
            }
            return reply.error(Errno::ENOENT);
        }
        let mut i = self.inner.lock().unwrap();
        match i.names.get(name.to_bytes()).copied() {
            Some(_) if self.bug == Bug::LookupEnoent => reply.error(Errno::ENOENT),
            Some(ino) => {
                let e = self.entry(&mut i, ino);
                if self.bug == Bug::UndercountsLookup {
                    let _ = i.lookups.get_mut(&ino).map(|c| *c -= 1);
                }
                reply.entry(&e)
            }
            None if self.bug == Bug::UnknownErrno => reply.error(Errno::new(300).unwrap()),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn forget(&self, _: &RequestContext<'_>, ino: Inode, n: u64) {
        let mut i = self.inner.lock().unwrap();
        let left = i.lookups.get(&ino.0).copied().unwrap_or(0).saturating_sub(n);
        if left == 0 {
            i.lookups.remove(&ino.0);
            let linked = i.names.values().any(|&v| v == ino.0);
            if !linked && self.bug != Bug::ForgetsAtUnlink {
                i.files.remove(&ino.0);
            }
        } else {
            i.lookups.insert(ino.0, left);
        }
    }

    fn getattr(&self, _: &RequestContext<'_>, ino: Inode, _: Option<FileHandle>, reply: ReplyAttr) {
        if ino == Inode::ROOT {
            return reply.attr(TTL, &Self::root_attr());
        }
        let i = self.inner.lock().unwrap();
        match i.files.get(&ino.0) {
            Some(f) => reply.attr(TTL, &self.attr(ino.0, f, true)),
            None => reply.error(Errno::ESTALE),
        }
    }

    fn setattr(&self, _: &RequestContext<'_>, ino: Inode, req: &SetattrRequest, reply: ReplyAttr) {
        let mut i = self.inner.lock().unwrap();
        let Some(f) = i.files.get_mut(&ino.0) else {
            return reply.error(Errno::ESTALE);
        };
        if let Some(size) = req.size
            && self.bug != Bug::IgnoresTruncate
        {
            f.data.resize(size as usize, 0);
            f.size = size;
            f.truncated = true;
        }
        let a = self.attr(ino.0, f, true);
        reply.attr(TTL, &a)
    }

    fn create(
        &self,
        ctx: &RequestContext<'_>,
        parent: Inode,
        name: &CStr,
        req: CreateRequest,
        reply: ReplyCreate,
    ) {
        if parent != Inode::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let mut i = self.inner.lock().unwrap();
        if i.names.contains_key(name.to_bytes()) {
            return reply.error(Errno::EEXIST);
        }
        let ino = Self::new_id(&i);
        let generation = if self.bug == Bug::SameGeneration {
            1
        } else {
            i.next_generation
        };
        i.next_generation += 1;
        let owner = if self.bug == Bug::OwnUid {
            // SAFETY: geteuid and getegid have no preconditions and cannot fail.
            unsafe { (libc::geteuid(), libc::getegid()) }
        } else {
            (ctx.uid(), ctx.gid())
        };
        i.files.insert(
            ino,
            File {
                generation,
                data: Vec::new(),
                size: 0,
                nlink: 1,
                perm: req.perm(),
                owner,
                truncated: false,
            },
        );
        i.names.insert(name.to_bytes().to_vec(), ino);
        let e = self.entry(&mut i, ino);
        let fh = i.next_fh;
        i.next_fh += 1;
        i.handles.insert(fh, ino);
        reply.created(&e, FileHandle(fh), FopenFlags::empty())
    }

    fn unlink(&self, _: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEmpty) {
        if parent != Inode::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let mut i = self.inner.lock().unwrap();
        let Some(ino) = i.names.remove(name.to_bytes()) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some(f) = i.files.get_mut(&ino) {
            f.nlink -= 1;
        }
        if self.bug == Bug::ForgetsAtUnlink || !i.lookups.contains_key(&ino) {
            i.files.remove(&ino);
        }
        reply.ok()
    }

    fn open(&self, _: &RequestContext<'_>, ino: Inode, _: OpenFlags, reply: ReplyOpen) {
        let mut i = self.inner.lock().unwrap();
        if !i.files.contains_key(&ino.0) {
            return reply.error(Errno::ESTALE);
        }
        let fh = i.next_fh;
        i.next_fh += 1;
        i.handles.insert(fh, ino.0);
        reply.opened(FileHandle(fh), FopenFlags::empty())
    }

    fn read(&self, _: &RequestContext<'_>, _: Inode, fh: FileHandle, req: ReadRequest, reply: ReplyData) {
        let i = self.inner.lock().unwrap();
        let Some(f) = i.handles.get(&fh.0).and_then(|ino| i.files.get(ino)) else {
            return reply.error(Errno::EBADF);
        };
        if self.bug == Bug::LongRead {
            return reply.data(&vec![b'x'; req.size as usize + 10]);
        }
        let start = (req.offset as usize).min(f.data.len());
        let size = if self.bug == Bug::ShortRead {
            3
        } else {
            req.size as usize
        };
        let end = start.saturating_add(size).min(f.data.len());
        reply.data(&f.data[start..end])
    }

    fn write(
        &self,
        _: &RequestContext<'_>,
        _: Inode,
        fh: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        let mut i = self.inner.lock().unwrap();
        let Some(&ino) = i.handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let Some(data) = req.data.bytes() else {
            return reply.error(Errno::EIO);
        };
        let f = i.files.get_mut(&ino).expect("an open file exists");
        if std::mem::take(&mut f.truncated) && self.bug == Bug::WriteAfterTruncateLost {
            return reply.written(data.len() as u32);
        }
        let end = req.offset as usize + data.len();
        if f.data.len() < end {
            f.data.resize(end, 0);
        }
        f.data[req.offset as usize..end].copy_from_slice(data);
        f.size = if self.bug == Bug::SizeOfLastWrite {
            data.len() as u64
        } else {
            f.data.len() as u64
        };
        reply.written(data.len() as u32)
    }

    fn statfs(&self, _: &RequestContext<'_>, _: Inode, reply: ReplyStatfs) {
        let mut st = Statfs::new();
        if self.bug == Bug::StatfsZero {
            st.bsize = 0;
        }
        reply.statfs(st)
    }

    fn rename(&self, _: &RequestContext<'_>, _: &RenameRequest<'_>, reply: ReplyEmpty) {
        reply.error(if self.bug == Bug::RefusesRename {
            Errno::EOPNOTSUPP
        } else {
            Errno::ENOSYS
        })
    }

    fn flush(&self, _: &RequestContext<'_>, _: Inode, fh: FileHandle, _: LockOwner, reply: ReplyEmpty) {
        if self.bug == Bug::FlushFrees {
            self.inner.lock().unwrap().handles.remove(&fh.0);
        }
        reply.ok()
    }

    fn release(
        &self,
        _: &RequestContext<'_>,
        _: Inode,
        fh: FileHandle,
        _: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        self.inner.lock().unwrap().handles.remove(&fh.0);
        reply.ok()
    }

    fn readdir(
        &self,
        _: &RequestContext<'_>,
        ino: Inode,
        _: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != Inode::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let i = self.inner.lock().unwrap();
        let dots = [(1, 1, b".".to_vec()), (2, 1, b"..".to_vec())];
        let kind = |n: &[u8]| {
            if n.starts_with(b".") {
                FileKind::Directory
            } else {
                FileKind::RegularFile
            }
        };
        let all = dots.into_iter().chain(self.listing(&i));
        for (cookie, ino, name) in all.filter(|e| e.0 > offset) {
            if reply.add(Inode(ino), cookie, kind(&name), &name).is_full() {
                break;
            }
        }
        reply.ok()
    }

    fn readdirplus(
        &self,
        _: &RequestContext<'_>,
        ino: Inode,
        _: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        if ino != Inode::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let mut i = self.inner.lock().unwrap();
        let listing = self.listing(&i);
        for (cookie, ino, name) in listing.into_iter().filter(|e| e.0 > offset) {
            let e = self.entry(&mut i, ino);
            if reply.add(&e, cookie, &name).is_full() {
                // Not sent: not counted.
                let _ = i.lookups.get_mut(&ino).map(|c| *c -= 1);
                break;
            }
        }
        reply.ok()
    }
}

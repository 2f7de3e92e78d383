//! notes: between hello and memfs. A root directory with three generated,
//! read-only files and one file you can write:
//!
//! - `uptime`: seconds since the filesystem was mounted;
//! - `hostname`: this machine's name;
//! - `reads`: how many READ requests the filesystem has served;
//! - `notes`: an ordinary file kept in memory (write, truncate, append,
//!   chmod, touch); no other file can be created.
//!
//! ```sh
//! cargo run --example notes -- /mnt/notes     # Ctrl-C unmounts
//! cat /mnt/notes/uptime; echo hello >> /mnt/notes/notes
//! ```
//!
//! What it shows: generated content is made once per open (a reader that
//! reads in pieces must not see two versions) and kept under the file
//! handle until RELEASE; as its size is not known in advance it is opened
//! with `DIRECT_IO` (its attributes say size 0, and without the flag the
//! kernel would read nothing); the writable file handles truncation in
//! `setattr` (the library does not ask for `ATOMIC_O_TRUNC`, so `echo > notes`
//! arrives as a SETATTR of size 0); `reply.result` with `?` in helpers.

#[path = "common/cli.rs"]
mod cli; // -f, -d, -o and --help as passthrough_ll takes them; errors printed with their text

use fuse_wire::reply::{ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite};
use fuse_wire::{
    AccessMode, Entry, Errno, FileAttr, FileHandle, FileKind, Filesystem, FopenFlags, Inode, OpenFlags,
    ReadRequest, ReleaseRequest, RequestContext, SetattrRequest, WriteRequest,
};
use std::collections::HashMap;
use std::ffi::CStr;
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

const UPTIME: Inode = Inode(2);
const HOSTNAME: Inode = Inode(3);
const READS: Inode = Inode(4);
const NOTES: Inode = Inode(5);

/// The files of the root directory, in listing order.
const FILES: [(&str, Inode); 4] = [
    ("uptime", UPTIME),
    ("hostname", HOSTNAME),
    ("reads", READS),
    ("notes", NOTES),
];

/// Names and attributes change only through us, so the kernel may cache
/// them a while; `notes` changes only through us too (writes and setattr
/// reply with fresh attributes).
const TTL: Duration = Duration::from_secs(1);

/// The writable file: its bytes and attributes under one lock.
struct Notes {
    data: Vec<u8>,
    attr: FileAttr,
}

pub struct NotesFs {
    mounted: Instant,
    reads: AtomicU64,
    notes: Mutex<Notes>,
    /// The content each open generated file was given, by file handle.
    snapshots: Mutex<HashMap<u64, Vec<u8>>>,
    next_fh: AtomicU64,
}

impl NotesFs {
    pub fn new() -> NotesFs {
        NotesFs {
            mounted: Instant::now(),
            reads: AtomicU64::new(0),
            notes: Mutex::new(Notes {
                data: Vec::new(),
                attr: FileAttr::new(NOTES.0, FileKind::RegularFile, 0o644),
            }),
            snapshots: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1), // 0 is the handle of `notes`
        }
    }

    fn notes(&self) -> std::sync::MutexGuard<'_, Notes> {
        self.notes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn snapshots(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<u8>>> {
        self.snapshots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn attr(&self, ino: Inode) -> Result<FileAttr, Errno> {
        match ino {
            Inode::ROOT => Ok(FileAttr::fixed(1, FileKind::Directory, 0o755)),
            // Size 0: the content is made at each open (see `open`).
            UPTIME | HOSTNAME | READS => Ok(FileAttr::fixed(ino.0, FileKind::RegularFile, 0o444)),
            NOTES => Ok(self.notes().attr),
            _ => Err(Errno::ENOENT),
        }
    }

    /// The content of a generated file, made now.
    fn generate(&self, ino: Inode) -> Result<Vec<u8>, Errno> {
        let text = match ino {
            UPTIME => format!("{}\n", self.mounted.elapsed().as_secs()),
            HOSTNAME => std::fs::read_to_string("/proc/sys/kernel/hostname")?,
            READS => format!("{}\n", self.reads.load(Ordering::Relaxed)),
            _ => return Err(Errno::EISDIR),
        };
        Ok(text.into_bytes())
    }

    fn set_notes(&self, req: &SetattrRequest) -> Result<FileAttr, Errno> {
        if req.uid.is_some() || req.gid.is_some() {
            return Err(Errno::EPERM); // nobody else may own it
        }
        let mut n = self.notes();
        if let Some(size) = req.size {
            let size = usize::try_from(size).map_err(|_| Errno::EFBIG)?;
            n.data.resize(size, 0);
        }
        req.apply_to(&mut n.attr);
        Ok(n.attr)
    }

    fn write_notes(&self, req: &WriteRequest<'_>) -> Result<u32, Errno> {
        let mut n = self.notes();
        let start = usize::try_from(req.offset).map_err(|_| Errno::EFBIG)?;
        let end = start.checked_add(req.data.len()).ok_or(Errno::EFBIG)?;
        if n.data.len() < end {
            n.data.resize(end, 0);
        }
        // Without splice_write the data is always in memory.
        let data = req.data.bytes().ok_or(Errno::EIO)?;
        n.data[start..end].copy_from_slice(data);
        let (len, now) = (n.data.len() as u64, SystemTime::now());
        n.attr = n.attr.with_size(len);
        (n.attr.mtime, n.attr.ctime) = (now, now);
        Ok(req.data.len() as u32)
    }
}

impl Default for NotesFs {
    fn default() -> Self {
        NotesFs::new()
    }
}

impl Filesystem for NotesFs {
    // The nodes never go away: lookup counts need no bookkeeping, and the
    // default `forget` (which ignores them) is right.
    fn lookup(&self, _: &RequestContext<'_>, parent: Inode, name: &CStr, reply: ReplyEntry) {
        let found = FILES.iter().find(|(n, _)| n.as_bytes() == name.to_bytes());
        match found {
            Some(&(_, ino)) if parent == Inode::ROOT => {
                reply.result(self.attr(ino).map(|a| Entry::new(ino, a, TTL)))
            }
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _: &RequestContext<'_>, ino: Inode, _: Option<FileHandle>, reply: ReplyAttr) {
        reply.result(self.attr(ino).map(|a| (TTL, a)));
    }

    fn setattr(&self, _: &RequestContext<'_>, ino: Inode, req: &SetattrRequest, reply: ReplyAttr) {
        match ino {
            NOTES => reply.result(self.set_notes(req).map(|a| (TTL, a))),
            _ => reply.error(Errno::EACCES), // the generated files cannot change
        }
    }

    fn open(&self, _: &RequestContext<'_>, ino: Inode, flags: OpenFlags, reply: ReplyOpen) {
        match ino {
            NOTES => reply.opened(FileHandle(0), FopenFlags::empty()),
            Inode::ROOT => reply.error(Errno::EISDIR),
            _ if flags.access_mode() != AccessMode::Read => reply.error(Errno::EACCES),
            _ => match self.generate(ino) {
                Ok(content) => {
                    let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                    self.snapshots().insert(fh, content);
                    // Without DIRECT_IO the kernel would trust the size 0
                    // above and return nothing to `cat`.
                    reply.opened(FileHandle(fh), FopenFlags::DIRECT_IO)
                }
                Err(e) => reply.error(e),
            },
        }
    }

    fn read(&self, _: &RequestContext<'_>, ino: Inode, fh: FileHandle, req: ReadRequest, reply: ReplyData) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        // The part of `len` bytes this READ asks for; a shorter reply than
        // `req.size` (empty at the end) tells the reader the file ends there.
        let window = |len: usize| {
            let start = usize::try_from(req.offset).unwrap_or(usize::MAX).min(len);
            start..start.saturating_add(req.size as usize).min(len)
        };
        if ino == NOTES {
            let n = self.notes();
            return reply.data(&n.data[window(n.data.len())]);
        }
        match self.snapshots().get(&fh.0) {
            Some(d) => reply.data(&d[window(d.len())]),
            None => reply.error(Errno::EBADF),
        }
    }

    fn release(
        &self,
        _: &RequestContext<'_>,
        _: Inode,
        fh: FileHandle,
        _: ReleaseRequest,
        reply: ReplyEmpty,
    ) {
        self.snapshots().remove(&fh.0);
        reply.ok();
    }

    fn write(
        &self,
        _: &RequestContext<'_>,
        ino: Inode,
        _: FileHandle,
        req: WriteRequest<'_>,
        reply: ReplyWrite,
    ) {
        match ino {
            NOTES => reply.result(self.write_notes(&req)),
            _ => reply.error(Errno::EBADF),
        }
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
        let dots = [
            (".", Inode::ROOT, FileKind::Directory),
            ("..", Inode::ROOT, FileKind::Directory),
        ];
        let files = FILES.iter().map(|&(n, ino)| (n, ino, FileKind::RegularFile));
        // Each entry carries the cookie of the one after it.
        for (i, (name, ino, kind)) in dots.into_iter().chain(files).enumerate().skip(offset as usize) {
            if reply.add(ino, i as u64 + 1, kind, name).is_full() {
                break;
            }
        }
        reply.ok();
    }
}

const COMMAND: cli::Command = cli::Command {
    name: "notes",
    about: "Serves at MOUNTPOINT three generated read-only files (uptime, hostname,\n\
            reads) and one writable file kept in memory (notes).",
    own_options: false,
    stats: false,
};

fn main() -> ExitCode {
    COMMAND.run(|args| {
        let mut opts = args.mount;
        opts.default_permissions = true; // the kernel checks modes: no access checks here
        opts.fsname.get_or_insert_with(|| "notes".into());
        let report = fuse_wire::serve(NotesFs::new(), &args.mountpoint, &opts)?;
        eprintln!("served {} requests", report.stats.total_requests());
        Ok(())
    })
}

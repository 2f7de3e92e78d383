//! Open files and directories: the handle table and directory streams.
//!
//! A handle is one OPEN/OPENDIR/CREATE, with its descriptor while it has
//! one: an idle regular file closes it and opens the file again at its next
//! request ([`HandleTable::open`]; the budget and what is pinned are
//! `openfds.rs`'s). Handles live in a sharded map keyed by the file handle
//! number the kernel echoes back, so reads and writes on different files
//! never meet on a lock, and reads and writes on the same file share
//! nothing but the shard's brief lookup and the handle's own descriptor
//! slot (the I/O itself is positional: `pread`/`pwrite`).
//!
//! Under a keeper each handle has a record in the memory the keeper holds
//! (its node and open flags; see `durable::OpenRecords`), written before
//! the open is answered and cleared at release, so a successor opens every
//! file still open again ([`HandleTable::restore`]). A handle whose open
//! file description itself matters (it holds a `flock` lock), or that
//! finds no free record, has its descriptor deposited with the keeper's
//! vault instead, and the successor serves that very description.

use crate::durable::{APPEND_KEY, FhCounter, Keep, Mirror, OPEN_PER_SHARD, OpenRecords};
use crate::fdcache::Cached;
use crate::inodes::{InodeData, InodeTable};
use crate::openfds::OpenBudget;
use crate::sys;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Shards of the handle table (a file handle number's shard is the number
/// modulo this).
pub const SHARDS: usize = 64;

/// One shard: its handles, and under a keeper its free open file records.
#[derive(Default)]
struct Shard {
    map: HashMap<u64, Entry>,
    /// Free record slots, the lowest last.
    free: Vec<u32>,
}

struct Entry {
    handle: Arc<Handle>,
    /// Its open file record, if it has one.
    record: Option<u32>,
}

/// One open file or directory.
pub struct Handle {
    /// Its descriptor, while it has one (see `openfds.rs`).
    file: Mutex<FileSlot>,
    /// Used since its ring last looked (CLOCK's reference bit).
    referenced: AtomicBool,
    /// The source flags to open it again with, if it may be (a regular
    /// file without `O_DIRECT`); `None`: it is pinned for its life.
    reopen: Option<i32>,
    /// Who opened it: a pin is charged to this user.
    pub uid: u32,
    /// The budget its pin is charged to, once in the table.
    budget: Option<Arc<Budget>>,
    pub inode: Arc<InodeData>,
    /// Counted in the inode's passthrough opens (released on drop).
    pub passthrough: bool,
    /// Counted in the inode's opens served without passthrough although
    /// passthrough is on (released on drop).
    pub served: bool,
    /// For files opened with `O_DIRECT`: how to serve unaligned I/O.
    pub direct: Option<Direct>,
    /// The directory stream (directories only; created on first READDIR).
    pub dir: Mutex<Option<DirStream>>,
    /// Opened with `O_APPEND` under a keeper: the source descriptor is not,
    /// and each write picks the end of the file itself (see
    /// `PassthroughFs::write_as_caller`).
    pub append: bool,
    /// Under a keeper: its descriptor is deposited with the vault.
    deposited: AtomicBool,
    /// The node id it is an open file of (0: not known, a deposited file
    /// taken up from a predecessor without a record).
    pub node: u64,
}

/// The budget of open files' descriptors, over handles.
pub type Budget = OpenBudget<Handle>;

/// A descriptor charged to a user beside the handles (see
/// [`HandleTable::charge`]).
pub type Charge = crate::openfds::Charge<Handle>;

/// The descriptor state of a handle. Invariant: `fd` is set while the
/// handle is on a ring (`in_ring`) or pinned, or while a request that
/// reopened it has yet to put it on one; the inode is pinned (holds its
/// node descriptor) exactly while `fd` is set.
struct FileSlot {
    fd: Option<Arc<OwnedFd>>,
    in_ring: bool,
    /// Pinned: keeps its descriptor until released, charged to its user.
    pinned: bool,
}

/// A handle with its descriptor, open for as long as this lives (an
/// eviction meanwhile closes it only when the last user is done).
pub struct Open {
    pub handle: Arc<Handle>,
    fd: Arc<OwnedFd>,
}

impl std::ops::Deref for Open {
    type Target = Handle;

    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl Open {
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// `pread` at `offset`, meeting `O_DIRECT`'s alignment rules if the
    /// handle has them.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let Some(d) = &self.direct else {
            return sys::pread(self.fd(), buf, offset);
        };
        if !d.range_ok(offset, buf.len()) {
            return sys::pread(d.buffered.as_fd(), buf, offset);
        }
        if d.mem_ok(buf.as_ptr()) {
            return sys::pread(self.fd(), buf, offset);
        }
        with_bounce(buf.len(), d.mem_align, |b| {
            let n = sys::pread(self.fd(), b, offset)?;
            buf[..n].copy_from_slice(&b[..n]);
            Ok(n)
        })
    }

    /// `pwrite` at `offset`, meeting `O_DIRECT`'s alignment rules if the
    /// handle has them.
    pub fn write_at(&self, data: &[u8], offset: u64) -> io::Result<usize> {
        let Some(d) = &self.direct else {
            return sys::pwrite(self.fd(), data, offset);
        };
        if !d.range_ok(offset, data.len()) {
            return sys::pwrite(d.buffered.as_fd(), data, offset);
        }
        if d.mem_ok(data.as_ptr()) {
            return sys::pwrite(self.fd(), data, offset);
        }
        with_bounce(data.len(), d.mem_align, |b| {
            b.copy_from_slice(data);
            sys::pwrite(self.fd(), b, offset)
        })
    }
}

/// What an `O_DIRECT` handle needs besides its descriptor. The kernel copies
/// the caller's data into the request, so a caller's aligned buffer arrives
/// wherever the request buffer puts it: data at a misaligned address goes
/// through an aligned per-thread bounce buffer, and a misaligned offset or
/// length (which `O_DIRECT` on the source would refuse with `EINVAL`, while
/// the FUSE mount accepted it) goes through a second descriptor without
/// `O_DIRECT`.
pub struct Direct {
    /// Required alignment of the memory address.
    pub mem_align: usize,
    /// Required alignment of the file offset and the length.
    pub offset_align: u64,
    /// The same file opened without `O_DIRECT`.
    pub buffered: OwnedFd,
}

/// Used when the source does not report its direct I/O alignment.
const DEFAULT_DIO_ALIGN: u32 = 4096;

impl Direct {
    /// Opens the buffered twin of `fd` (opened with `flags`, which include
    /// `O_DIRECT`) and asks the source for its direct I/O alignment.
    pub fn new(fd: BorrowedFd<'_>, flags: i32) -> io::Result<Self> {
        let twin = flags & !(libc::O_DIRECT | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
        let buffered = sys::openat(sys::Dir::Cwd, &sys::proc_path(fd), twin, 0)?;
        let (mut mem, mut off) = (0, 0);
        if let Ok(st) = sys::statx(fd, libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN)
            && st.stx_mask & libc::STATX_DIOALIGN != 0
        {
            (mem, off) = (st.stx_dio_mem_align, st.stx_dio_offset_align);
        }
        let pick = |a: u32| {
            if a == 0 || !a.is_power_of_two() {
                DEFAULT_DIO_ALIGN
            } else {
                a
            }
        };
        Ok(Self {
            mem_align: pick(mem) as usize,
            offset_align: pick(off) as u64,
            buffered,
        })
    }

    fn range_ok(&self, offset: u64, len: usize) -> bool {
        offset.is_multiple_of(self.offset_align) && (len as u64).is_multiple_of(self.offset_align)
    }

    fn mem_ok(&self, p: *const u8) -> bool {
        p.align_offset(self.mem_align) == 0
    }
}

thread_local! {
    /// The bounce buffer for direct I/O from misaligned request memory.
    static BOUNCE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on a `len`-byte slice aligned to `align` (a power of two).
fn with_bounce<T>(len: usize, align: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    BOUNCE.with(|b| match b.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < len + align {
                v.resize(len + align, 0);
            }
            let at = v.as_ptr().align_offset(align);
            f(&mut v[at..at + len])
        }
        // Re-entered: a fresh buffer.
        Err(_) => {
            let mut v = vec![0u8; len + align];
            let at = v.as_ptr().align_offset(align);
            f(&mut v[at..at + len])
        }
    })
}

impl Handle {
    /// A handle of `inode` owning `fd`, opened by `uid`; pinned (see
    /// [`Self::reopen_with`]). The inode keeps a descriptor of its own
    /// while the handle's is open (see `InodeData::pin`).
    pub fn new(fd: OwnedFd, inode: Arc<InodeData>, passthrough: bool, uid: u32) -> Self {
        inode.pin(fd.as_fd());
        inode.opened();
        Self {
            file: Mutex::new(FileSlot {
                fd: Some(Arc::new(fd)),
                in_ring: false,
                pinned: false,
            }),
            referenced: AtomicBool::new(false),
            reopen: None,
            uid,
            budget: None,
            inode,
            passthrough,
            served: false,
            direct: None,
            dir: Mutex::new(None),
            append: false,
            deposited: AtomicBool::new(false),
            node: 0,
        }
    }

    /// Lets the handle close its descriptor when idle and open the file
    /// again with `flags` (source flags, nothing in them that creates or
    /// truncates): for a regular file without `O_DIRECT`.
    pub fn reopen_with(mut self, flags: i32) -> Self {
        if self.inode.kind == libc::S_IFREG && self.direct.is_none() {
            self.reopen = Some(flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_TMPFILE));
        }
        self
    }

    fn slot(&self) -> MutexGuard<'_, FileSlot> {
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Its descriptor if it has one now, marked used.
    pub fn current(&self) -> Option<Arc<OwnedFd>> {
        let fd = self.slot().fd.clone();
        if fd.is_some() && !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
        fd
    }

    /// Puts `fd`, just opened again, in the slot, unless a racing request
    /// did first (then that one); and whether it went on a ring, so the
    /// caller must admit it there.
    fn install(&self, fd: OwnedFd) -> (Arc<OwnedFd>, bool) {
        let mut s = self.slot();
        if let Some(f) = &s.fd {
            return (f.clone(), false);
        }
        self.inode.pin(fd.as_fd());
        let fd = Arc::new(fd);
        s.fd = Some(fd.clone());
        let admit = !s.in_ring && !s.pinned;
        s.in_ring |= admit;
        (fd, admit)
    }

    /// The node descriptor of an inode anchored by one (tests).
    #[cfg(test)]
    fn inode_fd_for_tests(&self) -> BorrowedFd<'_> {
        self.inode.fd_of_anchor().expect("anchored by a descriptor")
    }

    pub fn dir(&self) -> MutexGuard<'_, Option<DirStream>> {
        self.dir.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Cached for Handle {
    fn take_referenced(&self) -> bool {
        self.referenced.load(Ordering::Relaxed) && self.referenced.swap(false, Ordering::Relaxed)
    }

    /// Off its ring: closes the descriptor (when the last request using it
    /// is done), unless the handle is pinned or its file lost its last
    /// name (a new open could not reach it: then it is pinned, charged to
    /// its user past any share).
    fn evict_fd(&self) {
        let mut s = self.slot();
        s.in_ring = false;
        if s.pinned {
            return;
        }
        let Some(fd) = s.fd.clone() else { return };
        if sys::stat_fd(fd.as_fd()).is_ok_and(|st| st.st_nlink == 0) {
            s.pinned = true;
            if let Some(b) = &self.budget {
                b.force(self.uid);
            }
            return;
        }
        s.fd = None;
        drop(s);
        self.inode.unpin();
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let s = self.file.get_mut().unwrap_or_else(|e| e.into_inner());
        if s.fd.take().is_some() {
            self.inode.unpin();
        }
        if s.pinned
            && let Some(b) = &self.budget
        {
            b.uncharge(self.uid);
        }
        self.inode.closed();
        if self.passthrough {
            let mut pt = self.inode.passthrough();
            pt.opens = pt.opens.saturating_sub(1);
            if pt.opens == 0 {
                // Closes the backing id in the kernel (files still open keep working).
                pt.backing = None;
            }
        } else if self.served {
            let mut pt = self.inode.passthrough();
            pt.served = pt.served.saturating_sub(1);
        }
    }
}

/// The vault key of handle `fh`: its number, and whether it appends.
fn deposit_key(fh: u64, h: &Handle) -> u64 {
    if h.append { fh | APPEND_KEY } else { fh }
}

/// Sharded map from file handle to [`Handle`].
pub struct HandleTable {
    shards: Box<[Mutex<Shard>]>,
    next: AtomicU64,
    /// Under a keeper: what it holds for the handles.
    kept: Option<Kept>,
    /// Under a keeper: handles open now (low 32 bits) and handles opened
    /// ever (high 32 bits, wrapping), in one word (see [`Opens`]).
    opens: AtomicU64,
    /// Which handles keep their descriptors.
    budget: Arc<Budget>,
}

/// Whom the pins of files taken up from a predecessor are charged to (their
/// openers are not known): a user of their own, so that they take no real
/// user's share.
pub const KEPT_UID: u32 = u32::MAX;

/// What a keeper holds for the handle table.
pub struct Kept {
    /// Its vault, for descriptors that a new open cannot replace.
    keep: Arc<dyn Keep>,
    /// The open file records.
    records: OpenRecords,
    /// The file handle numbers, counted where the keeper keeps them.
    next: FhCounter,
}

impl Kept {
    /// The vault `keep`, and the records and counter in `mirror`'s region.
    pub fn new(keep: Arc<dyn Keep>, mirror: &Mirror) -> Self {
        Self {
            keep,
            records: mirror.open_records(),
            next: mirror.fh_counter(),
        }
    }
}

/// How a successor opens a file of a predecessor again: the node, the
/// flags the kernel gave, and what that open returns.
pub type Reopen<'a> = dyn Fn(&Arc<InodeData>, i32) -> io::Result<OwnedFd> + 'a;

impl HandleTable {
    pub fn new(budget: Arc<Budget>) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            next: AtomicU64::new(1),
            kept: None,
            opens: AtomicU64::new(0),
            budget,
        }
    }

    /// Records every handle in `records` (and deposits with `keep` what a
    /// new open cannot replace) from now on, after taking up the files a
    /// predecessor left open: each record's node (in `inodes`) is opened
    /// again with `reopen`, unless its descriptor was deposited; `deposits`
    /// are those descriptors by file handle number, each of a record or
    /// reattached to its inode found by source key and file handle. A file
    /// whose inode the table does not hold, or that does not open again, is
    /// dropped with an error logged (the kernel then gets `EBADF` for it).
    pub fn restore(
        &mut self,
        kept: Kept,
        deposits: Vec<(u64, OwnedFd)>,
        inodes: &InodeTable,
        reopen: &Reopen<'_>,
        source_flags: impl Fn(i32) -> i32,
    ) {
        let Kept { keep, records, next } = &kept;
        let mut max = 0;
        let mut deposits: HashMap<u64, (u64, OwnedFd)> = deposits
            .into_iter()
            .map(|(key, fd)| (key & !APPEND_KEY, (key, fd)))
            .collect();
        for (i, shard) in self.shards.iter().enumerate() {
            let mut s = shard.lock().unwrap_or_else(|e| e.into_inner());
            let mut used = vec![false; OPEN_PER_SHARD];
            for r in records.load(i) {
                max = max.max(r.fh);
                let taken = match deposits.remove(&r.fh) {
                    Some((_, fd)) => attach(r.fh, fd, inodes, &source_flags).map(|h| (h, true)),
                    None => inodes
                        .get(r.node)
                        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESTALE))
                        .and_then(|inode| {
                            let fd = reopen(&inode, r.flags)?;
                            with_direct(Handle::new(fd, inode, false, KEPT_UID), r.flags, &source_flags)
                                .map(|h| h.reopen_with(source_flags(r.flags)))
                        })
                        .map(|h| (h, false)),
                };
                match taken {
                    Ok((mut h, deposited)) => {
                        h.append = r.append;
                        h.deposited = AtomicBool::new(deposited);
                        h.node = r.node;
                        used[r.slot] = true;
                        let handle = self.taken_up(r.fh, h, deposited);
                        let e = Entry {
                            handle,
                            record: Some(r.slot as u32),
                        };
                        s.map.insert(r.fh, e);
                    }
                    Err(e) => {
                        log::error!(
                            "open file {} (node {}) of the predecessor: not taken up ({e}); \
                             requests on it fail",
                            r.fh,
                            r.node
                        );
                        records.clear(i, r.slot);
                    }
                }
            }
            s.free = (0..OPEN_PER_SHARD as u32)
                .rev()
                .filter(|&j| !used[j as usize])
                .collect();
        }
        // Descriptors deposited without a record.
        for (fh, (key, fd)) in deposits {
            match attach(fh, fd, inodes, &source_flags) {
                Ok(mut h) => {
                    h.append = key & APPEND_KEY != 0;
                    h.deposited = AtomicBool::new(true);
                    let e = Entry {
                        handle: self.taken_up(fh, h, true),
                        record: None,
                    };
                    self.shard(fh).map.insert(fh, e);
                    max = max.max(fh);
                }
                Err(e) => {
                    log::error!("open file {fh} of the predecessor: not taken up ({e}); closed");
                    if let Err(e) = keep.withdraw(key) {
                        log::warn!("withdrawing it: {e}");
                    }
                }
            }
        }
        // Never below what was taken up (a region written by a daemon
        // that counted elsewhere).
        next.above(max);
        self.kept = Some(kept);
        self.opens.store(self.len() as u64, Ordering::SeqCst);
    }

    /// A handle taken up from a predecessor, under this table's budget:
    /// pinned (charged to [`KEPT_UID`]) if its descriptor was deposited or
    /// it cannot be opened again.
    ///
    /// One that is not goes on its ring at once (evicting the oldest), so
    /// that taking up more files than the budget holds never has them all
    /// open at once.
    fn taken_up(&self, fh: u64, mut h: Handle, deposited: bool) -> Arc<Handle> {
        h.uid = KEPT_UID;
        h.budget = Some(self.budget.clone());
        let s = h.file.get_mut().unwrap_or_else(|e| e.into_inner());
        if deposited || h.reopen.is_none() {
            s.pinned = true;
            self.budget.force(KEPT_UID);
        }
        let h = Arc::new(h);
        self.admit_new(fh, &h);
        h
    }

    fn shard(&self, fh: u64) -> MutexGuard<'_, Shard> {
        self.shards[(fh % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `h`, an open of node `node` with `flags` (as the kernel gave
    /// them); under a keeper it is recorded (or deposited) first. A handle
    /// that cannot close its descriptor when idle (or is deposited) is
    /// pinned, charged to its user: `EMFILE` past that user's share.
    pub fn insert(&self, mut h: Handle, node: u64, flags: i32) -> io::Result<u64> {
        h.node = node;
        h.budget = Some(self.budget.clone());
        if h.reopen.is_none() {
            self.pin_new(&mut h)?;
        }
        let Some(k) = &self.kept else {
            let fh = self.next.fetch_add(1, Ordering::Relaxed);
            let handle = Arc::new(h);
            let e = Entry {
                handle: handle.clone(),
                record: None,
            };
            self.shard(fh).map.insert(fh, e);
            self.admit_new(fh, &handle);
            return Ok(fh);
        };
        let fh = k.next.next();
        if fh >= APPEND_KEY {
            return Err(io::Error::from_raw_os_error(libc::ENFILE));
        }
        let shard_i = (fh % SHARDS as u64) as usize;
        let mut s = self.shard(fh);
        let record = s.free.pop();
        match record {
            Some(slot) => k.records.set(shard_i, slot as usize, fh, node, flags, h.append),
            None => {
                self.pin_new(&mut h)?;
                let fd = h.slot().fd.clone();
                let deposited = match &fd {
                    Some(fd) => k.keep.deposit(deposit_key(fh, &h), fd.as_fd()),
                    None => Err(io::Error::from_raw_os_error(libc::EBADF)),
                };
                deposited.inspect_err(|e| {
                    log::error!("keeping the descriptor of a new open file with the keeper: {e}");
                })?;
                h.deposited.store(true, Ordering::Relaxed);
            }
        }
        let handle = Arc::new(h);
        let e = Entry {
            handle: handle.clone(),
            record,
        };
        s.map.insert(fh, e);
        drop(s);
        self.opens.fetch_add(OPENED_ONE | 1, Ordering::SeqCst);
        self.admit_new(fh, &handle);
        Ok(fh)
    }

    /// Pins the new handle `h`, charged to its user, if the share allows.
    fn pin_new(&self, h: &mut Handle) -> io::Result<()> {
        let s = h.file.get_mut().unwrap_or_else(|e| e.into_inner());
        if s.pinned {
            return Ok(());
        }
        if !self.budget.charge(h.uid) {
            log::info!(
                "uid {}: {} open files that keep their descriptors (its share; {} of all users): \
                 answering EMFILE",
                h.uid,
                self.budget.share(),
                self.budget.pinned()
            );
            return Err(io::Error::from_raw_os_error(libc::EMFILE));
        }
        s.pinned = true;
        Ok(())
    }

    /// Puts a new unpinned handle on its ring.
    fn admit_new(&self, fh: u64, h: &Arc<Handle>) {
        let mut s = h.slot();
        if s.pinned || s.in_ring || s.fd.is_none() {
            return;
        }
        s.in_ring = true;
        drop(s);
        self.budget.admit(fh as usize, Arc::downgrade(h));
    }

    /// Handle `fh` with its descriptor: opened again with `reopen` (given
    /// the handle and its flags) if it was closed while idle, and put back
    /// on its ring.
    pub fn open(
        &self,
        fh: u64,
        reopen: impl FnOnce(&Handle, i32) -> io::Result<OwnedFd>,
    ) -> io::Result<Open> {
        let handle = self
            .get(fh)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        self.ready(fh, handle, reopen)
    }

    /// Charges a descriptor that is no handle's (a POSIX lock owner's) to
    /// `uid`, until the result drops: `ENOLCK` past that user's share.
    pub fn charge(&self, uid: u32) -> io::Result<Charge> {
        self.budget.charge_held(uid).ok_or_else(|| {
            log::info!(
                "uid {uid}: {} descriptors that stay open (its share): answering ENOLCK",
                self.budget.share()
            );
            io::Error::from_raw_os_error(libc::ENOLCK)
        })
    }

    /// [`Self::open`] of a handle already found.
    pub fn ready(
        &self,
        fh: u64,
        handle: Arc<Handle>,
        reopen: impl FnOnce(&Handle, i32) -> io::Result<OwnedFd>,
    ) -> io::Result<Open> {
        if let Some(fd) = handle.current() {
            return Ok(Open { handle, fd });
        }
        // Only a handle that may be opened again ever loses its descriptor.
        let flags = handle
            .reopen
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))?;
        let (fd, admit) = handle.install(reopen(&handle, flags)?);
        if admit {
            self.budget.admit(fh as usize, Arc::downgrade(&handle));
        }
        Ok(Open { handle, fd })
    }

    /// Pins handle `fh` (`open`): its open file description now holds
    /// something a new open would not have (a `flock` lock). Charged to its
    /// user: `ENOLCK` past that user's share. Under a keeper the descriptor
    /// is deposited with the vault too. Returns the handle with the
    /// descriptor it keeps, on which the lock must be taken: `open`'s, or
    /// the one a racing request opened again and pinned first.
    pub fn pin(&self, fh: u64, open: Open) -> io::Result<Open> {
        let h = &open.handle;
        let fd = {
            let mut s = h.slot();
            if !s.pinned {
                if !self.budget.charge(h.uid) {
                    log::info!(
                        "uid {}: {} open files that keep their descriptors (its share): answering ENOLCK",
                        h.uid,
                        self.budget.share()
                    );
                    return Err(io::Error::from_raw_os_error(libc::ENOLCK));
                }
                s.pinned = true;
                if s.fd.is_none() {
                    // Closed while idle since `open` was made: this one again.
                    h.inode.pin(open.fd());
                    s.fd = Some(open.fd.clone());
                }
            }
            s.fd.clone().unwrap_or_else(|| open.fd.clone())
        };
        let open = Open {
            handle: open.handle,
            fd,
        };
        self.deposit(fh, &open)?;
        Ok(open)
    }

    pub fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        self.shard(fh).map.get(&fh).map(|e| e.handle.clone())
    }

    /// Whether the handle's descriptor is deposited with a keeper's vault.
    pub fn is_deposited(h: &Handle) -> bool {
        h.deposited.load(Ordering::Acquire)
    }

    /// Under a keeper: deposits handle `fh`'s descriptor with the vault
    /// (once), because its open file description now holds something a new
    /// open would not have (a `flock` lock); it is pinned already.
    fn deposit(&self, fh: u64, h: &Open) -> io::Result<()> {
        let Some(k) = &self.kept else { return Ok(()) };
        if h.deposited.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        k.keep.deposit(deposit_key(fh, h), h.fd()).inspect_err(|e| {
            h.deposited.store(false, Ordering::Release);
            log::error!("keeping the descriptor of open file {fh} with the keeper: {e}");
        })
    }

    /// Removes handle `fh`; under a keeper its record is cleared and its
    /// descriptor withdrawn if it was deposited.
    pub fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        let mut s = self.shard(fh);
        let e = s.map.remove(&fh)?;
        if let Some(k) = &self.kept {
            self.opens.fetch_sub(1, Ordering::SeqCst);
            if let Some(slot) = e.record {
                k.records.clear((fh % SHARDS as u64) as usize, slot as usize);
                s.free.push(slot);
            }
            drop(s);
            if e.handle.deposited.load(Ordering::Acquire)
                && let Err(err) = k.keep.withdraw(deposit_key(fh, &e.handle))
            {
                log::warn!("withdrawing the descriptor of open file {fh} from the keeper: {err}");
            }
        }
        Some(e.handle)
    }

    /// Under a keeper: how many files are open, and a mark that moves with
    /// every open, read before a removal (see `PassthroughFs::before_removal`).
    /// One word, touched only by opens and releases under a keeper.
    pub fn opens(&self) -> Opens {
        Opens(self.opens.load(Ordering::SeqCst))
    }

    /// Every open handle (a daemon retiring: see
    /// `PassthroughFs::keep_removed_open_files`).
    pub fn all(&self) -> Vec<Arc<Handle>> {
        self.shards
            .iter()
            .flat_map(|s| {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                s.map.values().map(|e| e.handle.clone()).collect::<Vec<_>>()
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).map.len())
            .sum()
    }
}

/// In [`HandleTable::opens`]: one more file opened ever.
const OPENED_ONE: u64 = 1 << 32;

/// What [`HandleTable::opens`] read.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Opens(u64);

impl Opens {
    /// Whether any file was open.
    pub fn any(self) -> bool {
        self.0 as u32 != 0
    }

    /// Whether a file was opened between `self` and `later`.
    pub fn opened_since(self, later: Opens) -> bool {
        self.0 >> 32 != later.0 >> 32
    }
}

/// A handle of the deposited descriptor `fd` of open file `fh`, reattached
/// to its inode in `inodes` (found by source key and file handle).
fn attach(
    fh: u64,
    fd: OwnedFd,
    inodes: &InodeTable,
    source_flags: &impl Fn(i32) -> i32,
) -> io::Result<Handle> {
    let inode = sys::stat_fd(fd.as_fd()).and_then(|st| inodes.find_open(fd.as_fd(), &st))?;
    // A directory's position is the predecessor's (the descriptor's file
    // description is shared): back to where a new stream starts, so that
    // the stream's idea of it holds.
    if inode.is_dir()
        && let Err(e) = sys::lseek(fd.as_fd(), 0, libc::SEEK_SET)
    {
        log::error!("open directory {fh} of the predecessor: rewinding it: {e}");
    }
    let flags = sys::get_fl(fd.as_fd()).unwrap_or(libc::O_RDONLY);
    with_direct(Handle::new(fd, inode, false, KEPT_UID), flags, source_flags)
}

/// `h`, with its `O_DIRECT` twin if `flags` ask for direct I/O.
fn with_direct(mut h: Handle, flags: i32, source_flags: &impl Fn(i32) -> i32) -> io::Result<Handle> {
    if flags & libc::O_DIRECT != 0 && h.inode.kind == libc::S_IFREG {
        let fd = h
            .current()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        h.direct = Some(Direct::new(fd.as_fd(), source_flags(flags))?);
    }
    Ok(h)
}

/// One record of `getdents64`.
pub struct DirRecord<'a> {
    pub ino: u64,
    /// Cookie of the position after this record (telldir value).
    pub next: i64,
    pub typ: u8,
    /// The name with its NUL.
    pub name: &'a CStr,
    len: usize,
}

/// A directory stream over `getdents64`, positioned by the kernel's
/// cookies (the `d_off` values): a READDIR at another offset seeks first.
pub struct DirStream {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Cookie of the next unread record (0: the beginning).
    pos: i64,
    eof: bool,
}

impl DirStream {
    pub fn new() -> Self {
        Self {
            buf: vec![0; 32 * 1024],
            start: 0,
            end: 0,
            pos: 0,
            eof: false,
        }
    }

    /// Moves to cookie `offset` unless already there.
    pub fn seek(&mut self, fd: BorrowedFd<'_>, offset: i64) -> io::Result<()> {
        if offset == self.pos {
            return Ok(());
        }
        sys::lseek(fd, offset, libc::SEEK_SET)?;
        self.start = 0;
        self.end = 0;
        self.pos = offset;
        self.eof = false;
        Ok(())
    }

    /// The next record without consuming it; `None` at the end.
    pub fn peek(&mut self, fd: BorrowedFd<'_>) -> io::Result<Option<DirRecord<'_>>> {
        if self.start >= self.end {
            if self.eof {
                return Ok(None);
            }
            let n = sys::getdents64(fd, &mut self.buf)?;
            if n == 0 {
                self.eof = true;
                return Ok(None);
            }
            self.start = 0;
            self.end = n;
        }
        parse_record(&self.buf[self.start..self.end])
            .map(Some)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))
    }

    /// Consumes the record [`DirStream::peek`] returned (its length and cookie).
    pub fn advance(&mut self, len: usize, next: i64) {
        self.start += len;
        self.pos = next;
    }
}

impl DirRecord<'_> {
    pub fn len(&self) -> usize {
        self.len
    }
}

/// Parses one `struct linux_dirent64` at the start of `b`: d_ino (u64),
/// d_off (i64), d_reclen (u16), d_type (u8), then the NUL-terminated name.
fn parse_record(b: &[u8]) -> Option<DirRecord<'_>> {
    const NAME: usize = 19;
    if b.len() < NAME + 1 {
        return None;
    }
    let ino = u64::from_ne_bytes(b[0..8].try_into().ok()?);
    let next = i64::from_ne_bytes(b[8..16].try_into().ok()?);
    let reclen = u16::from_ne_bytes(b[16..18].try_into().ok()?) as usize;
    if reclen < NAME + 1 || reclen > b.len() {
        return None;
    }
    let typ = b[18];
    let name = CStr::from_bytes_until_nul(&b[NAME..reclen]).ok()?;
    Some(DirRecord {
        ino,
        next,
        typ,
        name,
        len: reclen,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_handles_serve_misaligned_memory_and_ranges() {
        let path = std::env::temp_dir().join(format!("pt-direct-{}", std::process::id()));
        std::fs::write(&path, b"").unwrap();
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        let flags = libc::O_RDWR | libc::O_DIRECT;
        let fd = match sys::openat(sys::Dir::Cwd, &c, flags, 0) {
            Ok(fd) => fd,
            // A temporary directory without direct I/O (tmpfs): nothing to show.
            Err(_) => return std::fs::remove_file(&path).unwrap(),
        };
        let pfd = sys::openat(sys::Dir::Cwd, &c, libc::O_PATH, 0).unwrap();
        let st = sys::stat_fd(pfd.as_fd()).unwrap();
        let fd = Arc::new(fd);
        let dup = fd.try_clone().unwrap();
        let mut h = Handle::new(dup, Arc::new(InodeData::new(pfd, &st)), false, 0);
        h.direct = Some(Direct::new(fd.as_fd(), flags).unwrap());
        let h = Open {
            handle: Arc::new(h),
            fd,
        };
        let data: Vec<u8> = (0..3 * 4096 + 1).map(|i| (i % 251) as u8).collect();
        // Aligned range from a misaligned address, then a misaligned range.
        assert_eq!(h.write_at(&data[1..8193], 0).unwrap(), 8192);
        assert_eq!(h.write_at(&data[..100], 8192 + 7).unwrap(), 100);
        let mut back = vec![0u8; 8192 + 1];
        assert_eq!(h.read_at(&mut back[1..], 0).unwrap(), 8192);
        assert_eq!(&back[1..], &data[1..8193]);
        let mut tail = [0u8; 100];
        assert_eq!(h.read_at(&mut tail, 8192 + 7).unwrap(), 100);
        assert_eq!(&tail[..], &data[..100]);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn idle_files_close_their_descriptors_and_pinned_ones_are_charged() {
        let dir = std::env::temp_dir().join(format!("pt-budget-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cpath = |p: &std::path::Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // One file per ring keeps its descriptor; 2 pinned, 1 per user.
        let t = HandleTable::new(Arc::new(Budget::with(16, 2, 1)));
        let mut fhs = Vec::new();
        for i in 0..40 {
            let p = dir.join(format!("f{i}"));
            std::fs::write(&p, format!("file {i}")).unwrap();
            let pfd = sys::openat(sys::Dir::Cwd, &cpath(&p), libc::O_PATH, 0).unwrap();
            let st = sys::stat_fd(pfd.as_fd()).unwrap();
            let inode = Arc::new(InodeData::new(pfd, &st));
            let fd = sys::openat(sys::Dir::Cwd, &cpath(&p), libc::O_RDWR, 0).unwrap();
            let h = Handle::new(fd, inode, false, 1000).reopen_with(libc::O_RDWR | libc::O_TRUNC);
            fhs.push(t.insert(h, i + 2, libc::O_RDWR).unwrap());
        }
        let open_now = |fh: u64| t.get(fh).unwrap().current().is_some();
        assert!(
            fhs.iter().filter(|&&fh| open_now(fh)).count() <= 16,
            "at most one file per ring keeps its descriptor"
        );
        // An idle one opens again, with its flags less O_TRUNC, and reads
        // its own bytes.
        let first = fhs[0];
        assert!(!open_now(first));
        let reopened = std::cell::Cell::new(0);
        let reopen = |h: &Handle, flags: i32| {
            reopened.set(reopened.get() + 1);
            assert_eq!(flags, libc::O_RDWR, "nothing that creates or truncates");
            sys::openat(sys::Dir::Cwd, &sys::proc_path(h.inode_fd_for_tests()), flags, 0)
        };
        let o = t.open(first, reopen).unwrap();
        let mut buf = [0u8; 16];
        let n = o.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf[..n], b"file 0");
        assert_eq!(reopened.get(), 1);
        // With its descriptor now: no second reopen.
        drop(t.open(first, reopen).unwrap());
        assert_eq!(reopened.get(), 1);
        // Pinned (a flock lock): charged to its user, kept across evictions.
        let o = t.pin(first, o).unwrap();
        sys::flock(o.fd(), libc::LOCK_EX).unwrap();
        drop(o);
        // The same user's second pin is past its share; another user's is not.
        let second = t.open(fhs[1], reopen).unwrap();
        let e = t
            .pin(fhs[1], t.open(fhs[1], reopen).unwrap())
            .err()
            .expect("past the share");
        assert_eq!(e.raw_os_error(), Some(libc::ENOLCK));
        let mut theirs = Handle::new(
            second.fd().try_clone_to_owned().unwrap(),
            second.inode.clone(),
            false,
            0,
        );
        theirs.reopen = None;
        let fh = t.insert(theirs, 99, libc::O_RDWR).expect("another user's share");
        drop(second);
        // Everyone evicted again: the pinned file keeps its descriptor and its lock.
        for &fh in &fhs[2..] {
            drop(t.open(fh, reopen).unwrap());
        }
        assert!(open_now(first));
        let other = sys::openat(sys::Dir::Cwd, &cpath(&dir.join("f0")), libc::O_RDONLY, 0).unwrap();
        let busy = sys::flock(other.as_fd(), libc::LOCK_EX | libc::LOCK_NB).unwrap_err();
        assert_eq!(busy.raw_os_error(), Some(libc::EWOULDBLOCK));
        // Released: the charges go back.
        drop(t.remove(first));
        drop(t.remove(fh));
        assert_eq!(t.budget.pinned(), 0);
        sys::flock(other.as_fd(), libc::LOCK_EX | libc::LOCK_NB).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dirent_records_parse_and_reject_garbage() {
        let mut rec = vec![0u8; 24];
        rec[0..8].copy_from_slice(&7u64.to_ne_bytes());
        rec[8..16].copy_from_slice(&99i64.to_ne_bytes());
        rec[16..18].copy_from_slice(&24u16.to_ne_bytes());
        rec[18] = libc::DT_REG;
        rec[19..22].copy_from_slice(b"abc");
        let r = parse_record(&rec).unwrap();
        assert_eq!((r.ino, r.next, r.typ, r.len()), (7, 99, libc::DT_REG, 24));
        assert_eq!(r.name.to_bytes(), b"abc");
        rec[16..18].copy_from_slice(&200u16.to_ne_bytes());
        assert!(parse_record(&rec).is_none());
        assert!(parse_record(&rec[..10]).is_none());
    }
}

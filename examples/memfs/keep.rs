//! memfs under a keeper (`-o keeper`): what it hands to its successor at a
//! graceful upgrade, and what it does after a crash.
//!
//! # Graceful upgrade (`SIGUSR2` to the keeper)
//!
//! The retiring daemon writes its whole filesystem into a memory file
//! ([`save`]): every inode with its number, link, lookup and open counts
//! (memfs's file handles are all 0: the open count is the handle state),
//! attributes, extended attributes, contents (pages, holes left out),
//! directory entries with their readdir cookies and the next cookie, the
//! next inode number, and the lock table. It deposits that file in the
//! keeper's vault and hands back a small state naming it, with its length
//! and checksum. Files are emptied as they are written, so the memory
//! taken does not double.
//!
//! The successor ([`restore`]) reads it back and checks it as it goes: the
//! format's magic and version, every length against what is left, the
//! checksum, and the tree's invariants (a root directory, entries naming
//! inodes that exist with their type, link counts that match the entries,
//! a directory's parent, directories that hang from the root, cookies
//! below the next one, inode numbers below the next one), and whether the
//! tree fits this daemon's `size=` and `nr_inodes=`. A state that fails
//! any check is refused with an error saying why, and the daemon exits
//! non-zero rather than serve something else than what its predecessor
//! held (the keeper then starts the previous binary again, with the same
//! state). The capacity's usage is counted anew from what was restored.
//!
//! The memory file is withdrawn from the vault once read, before anything
//! is served: the keeper drops a state only when it hears that the daemon
//! serves, and a daemon that dies in between (having served a request or
//! not) must not be followed by one serving the tree as it was at the
//! upgrade. Its successor finds the state naming a file the keeper no
//! longer holds, and starts empty as after a crash.
//!
//! # Crash
//!
//! memfs's tree lives in the daemon's memory: a daemon killed takes it
//! along. Its successor starts from an empty root. What it does keep is
//! the next inode number, in a word of shared memory the keeper holds
//! (the vault), so that no inode number the kernel may still hold is ever
//! given to another file: every request for a node id the dead daemon gave
//! out answers `ESTALE` (open files, cached names until they are looked up
//! again, then `ENOENT`), never another file's data.

use super::data::{DirData, FileData, Xattrs};
use super::{Content, Data, MemFs, MemFsConfig, Node, Time};
use fuse_wire::session::Inode;
use fuse_wire::session::keeper::Restore;
use fuse_wire::session::region::SharedRegion;
use fuse_wire::session::vault::Vault;
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, RwLock};

/// The vault key of the word holding the next inode number.
const IDS_KEY: u64 = 1;
/// The vault key of the memory file a retiring daemon writes its tree to.
const STATE_KEY: u64 = 2;

/// The state handed back: which memory file, how long, its checksum.
const STATE_MAGIC: &[u8; 8] = b"MEMFS-S1";
/// The memory file's first bytes; the version follows.
const FILE_MAGIC: &[u8; 8] = b"MEMFSKPT";
const VERSION: u32 = 1;

/// Why a state is refused.
pub fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// Where inode numbers come from: a counter of this process, or under a
/// keeper a word of shared memory that outlives it.
pub struct Ids {
    shared: Option<SharedRegion>,
    local: AtomicU64,
    /// Numbers below this were given out by a daemon that died with its
    /// tree: a request for one that is not in the table answers ESTALE.
    lost_below: u64,
}

impl Ids {
    /// A counter of this process, from the first number after the root's.
    pub fn local() -> Ids {
        Ids {
            shared: None,
            local: AtomicU64::new(Inode::ROOT.0 + 1),
            lost_below: 0,
        }
    }

    fn counter(&self) -> &AtomicU64 {
        match &self.shared {
            Some(r) => &r.words()[0],
            None => &self.local,
        }
    }

    /// A number never given out before on this mount.
    pub fn next(&self) -> u64 {
        self.counter().fetch_add(1, Relaxed)
    }

    /// The number [`next`](Self::next) would give.
    fn peek(&self) -> u64 {
        self.counter().load(Relaxed)
    }

    /// Whether `ino`, not in the table, belonged to a daemon that crashed.
    pub fn lost(&self, ino: u64) -> bool {
        ino < self.lost_below
    }
}

/// A 64-bit FNV-1a checksum of what passes through.
struct Checksum(u64);

impl Checksum {
    fn new() -> Self {
        Checksum(0xcbf2_9ce4_8422_2325)
    }

    fn add(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Writes the state's fields, little endian, summing them.
pub struct Enc<W: Write> {
    w: W,
    sum: Checksum,
    len: u64,
}

impl<W: Write> Enc<W> {
    fn new(w: W) -> Self {
        Enc {
            w,
            sum: Checksum::new(),
            len: 0,
        }
    }

    pub fn raw(&mut self, b: &[u8]) -> io::Result<()> {
        self.sum.add(b);
        self.len += b.len() as u64;
        self.w.write_all(b)
    }

    pub fn u8(&mut self, v: u8) -> io::Result<()> {
        self.raw(&[v])
    }

    pub fn u32(&mut self, v: u32) -> io::Result<()> {
        self.raw(&v.to_le_bytes())
    }

    pub fn u64(&mut self, v: u64) -> io::Result<()> {
        self.raw(&v.to_le_bytes())
    }

    /// A length-prefixed byte string.
    pub fn bytes(&mut self, b: &[u8]) -> io::Result<()> {
        self.u32(u32::try_from(b.len()).map_err(|_| bad("a name or value longer than 4 GiB"))?)?;
        self.raw(b)
    }
}

/// Reads the state's fields, checking each against what is left.
pub struct Dec<R: Read> {
    r: R,
    sum: Checksum,
    left: u64,
}

impl<R: Read> Dec<R> {
    fn new(r: R, len: u64) -> Self {
        Dec {
            r,
            sum: Checksum::new(),
            left: len,
        }
    }

    pub fn raw(&mut self, b: &mut [u8]) -> io::Result<()> {
        if (b.len() as u64) > self.left {
            return Err(bad("the state ends early"));
        }
        self.r.read_exact(b)?;
        self.left -= b.len() as u64;
        self.sum.add(b);
        Ok(())
    }

    pub fn u8(&mut self) -> io::Result<u8> {
        let mut b = [0u8; 1];
        self.raw(&mut b)?;
        Ok(b[0])
    }

    pub fn u32(&mut self) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.raw(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    pub fn u64(&mut self) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.raw(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// A length-prefixed byte string of at most `max` bytes.
    pub fn bytes(&mut self, max: usize, what: &str) -> io::Result<Vec<u8>> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(bad(format!("{what} of {n} bytes (at most {max})")));
        }
        let mut v = vec![0u8; n];
        self.raw(&mut v)?;
        Ok(v)
    }

    /// A count of records that take at least `each` bytes: refused when
    /// they could not fit in what is left.
    pub fn count(&mut self, each: u64, what: &str) -> io::Result<usize> {
        let n = self.u64()?;
        if n.saturating_mul(each.max(1)) > self.left {
            return Err(bad(format!("{n} {what}: more than the state holds")));
        }
        Ok(n as usize)
    }
}

fn write_time<W: Write>(e: &mut Enc<W>, t: Time) -> io::Result<()> {
    e.u64(t.sec as u64)?;
    e.u32(t.nsec)
}

fn read_time<R: Read>(d: &mut Dec<R>) -> io::Result<Time> {
    let sec = d.u64()? as i64;
    let nsec = d.u32()?;
    if nsec >= 1_000_000_000 {
        return Err(bad("a time with more than a second of nanoseconds"));
    }
    Ok(Time { sec, nsec })
}

const FILE: u8 = 0;
const DIR: u8 = 1;
const SYMLINK: u8 = 2;
const SPECIAL: u8 = 3;

/// Serves memfs from a keeper's connection: restored at an upgrade, empty
/// (inode numbers kept) after a crash. `Ok(true)`: retired.
pub fn serve(
    link: fuse_wire::session::keeper::KeeperLink,
    config: MemFsConfig,
    session: fuse_wire::SessionConfig,
) -> Result<bool, fuse_wire::session::SessionError> {
    link.serve(|r| restore(config, r), save, session)
}

/// Builds the filesystem a daemon under a keeper serves: see the module's
/// documentation.
pub fn restore(config: MemFsConfig, r: Restore<'_>) -> io::Result<MemFs> {
    let vault = r.vault;
    let region = vault.region(IDS_KEY, 8)?;
    let left: Vec<(u64, OwnedFd)> = vault.take_deposits();
    let mut state_file = None;
    for (key, fd) in left {
        if key == STATE_KEY {
            state_file = Some(fd);
        } else {
            log::warn!(
                "memfs: the keeper holds a descriptor under key {key}, which memfs never deposits; dropping it"
            );
            vault.withdraw(key)?;
        }
    }
    let issued = region.words()[0].load(Relaxed);
    // After a crash the tree died with the daemon. Numbers it gave out are
    // never given again, and answer ESTALE.
    let start_empty = |region: SharedRegion| {
        let floor = issued.max(Inode::ROOT.0 + 1);
        region.words()[0].store(floor, Relaxed);
        if issued > Inode::ROOT.0 + 1 {
            log::warn!(
                "memfs: the previous daemon died with its files; starting empty (node ids below {floor} answer ESTALE)"
            );
        }
        MemFs::build(config.clone(), shared_ids(region, floor), Some(vault.clone()))
    };
    let fs = match (r.state, state_file.take()) {
        // A new mount: a new region (zero), or, should a first daemon have
        // died after handing numbers out, the numbers it gave.
        (None, _) => start_empty(region),
        (Some(state), Some(file)) if !state.is_empty() => {
            let fs = read_state(config.clone(), state, file, region, Some(&vault)).map_err(|e| {
                bad(format!(
                    "memfs: refusing the state handed over at the upgrade: {e}"
                ))
            })?;
            // Taken, before anything is served: should this daemon die
            // before the keeper hears that it serves, the keeper hands the
            // same state to the next one, which must not serve the tree
            // as it was (it starts empty, below).
            vault.withdraw(STATE_KEY)?;
            log::info!("memfs: restored {} inodes from the upgrade", fs.inode_count());
            fs
        }
        (Some(state), file) => {
            if !state.is_empty() {
                log::warn!("memfs: the state handed over was taken by a daemon that died before serving");
            }
            if file.is_some() {
                // Left by a retiring daemon whose state did not reach the
                // keeper: nobody will read it.
                vault.withdraw(STATE_KEY)?;
            }
            start_empty(region)
        }
    };
    Ok(fs)
}

fn shared_ids(region: SharedRegion, lost_below: u64) -> Ids {
    Ids {
        shared: Some(region),
        local: AtomicU64::new(0),
        lost_below,
    }
}

/// Writes the filesystem to a memory file deposited in the vault, and
/// returns the state that names it (empty, after logging why, when that
/// fails: the successor then starts as after a crash). Called once, as the
/// daemon retires: files are emptied as they are written.
pub fn save(fs: &MemFs) -> Vec<u8> {
    match try_save(fs) {
        Ok(state) => state,
        Err(e) => {
            log::error!("memfs: saving the filesystem for the successor failed, it will start empty: {e}");
            Vec::new()
        }
    }
}

fn try_save(fs: &MemFs) -> io::Result<Vec<u8>> {
    let vault = fs
        .vault
        .as_ref()
        .ok_or_else(|| io::Error::other("not under a keeper"))?;
    let mut file = memory_file()?;
    let (len, sum) = encode(fs, BufWriter::with_capacity(1 << 20, &mut file))?;
    vault.deposit(STATE_KEY, file.as_fd())?;
    let mut state = Vec::with_capacity(32);
    state.extend_from_slice(STATE_MAGIC);
    state.extend_from_slice(&STATE_KEY.to_le_bytes());
    state.extend_from_slice(&len.to_le_bytes());
    state.extend_from_slice(&sum.to_le_bytes());
    log::info!(
        "memfs: {} inodes saved for the successor ({len} bytes)",
        fs.inode_count()
    );
    Ok(state)
}

/// Writes the tree, then its checksum, to `w`: the bytes written and the
/// checksum.
fn encode<W: Write>(fs: &MemFs, w: W) -> io::Result<(u64, u64)> {
    let mut e = Enc::new(w);
    write_tree(fs, &mut e)?;
    let sum = e.sum.0;
    e.u64(sum)?;
    e.w.flush()?;
    Ok((e.len, sum))
}

/// Reads back what [`encode`] wrote (`len` bytes, checksum `sum`).
fn decode<R: Read>(
    config: MemFsConfig,
    r: R,
    len: u64,
    sum: u64,
    region: SharedRegion,
    vault: Option<&Vault>,
) -> io::Result<MemFs> {
    let mut d = Dec::new(r, len.saturating_sub(8));
    let fs = read_tree(config, &mut d, region, vault)?;
    let computed = d.sum.0;
    if d.left != 0 {
        return Err(bad(format!("{} bytes left after the tree", d.left)));
    }
    d.left = 8;
    let stored = d.u64()?;
    if stored != sum || computed != sum {
        return Err(bad(format!(
            "checksum mismatch (file {computed:#x}, stored {stored:#x}, state {sum:#x})"
        )));
    }
    Ok(fs)
}

fn memory_file() -> io::Result<std::fs::File> {
    // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"memfs-state".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just made for us, owned by nothing else.
    Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

fn write_tree<W: Write>(fs: &MemFs, e: &mut Enc<W>) -> io::Result<()> {
    e.raw(FILE_MAGIC)?;
    e.u32(VERSION)?;
    e.u64(fs.ids.peek())?;
    let (bytes, inodes) = fs.usage();
    e.u64(bytes)?;
    e.u64(inodes)?;
    let nodes = fs.all_nodes();
    e.u64(nodes.len() as u64)?;
    for n in &nodes {
        e.u64(n.ino)?;
        e.u32(n.nlink.load(Acquire))?;
        e.u64(n.lookups.load(Acquire))?;
        e.u32(n.opens.load(Acquire))?;
        e.u64(n.parent.load(Acquire))?;
        let mut d = n.write();
        e.u32(d.mode)?;
        e.u32(d.uid)?;
        e.u32(d.gid)?;
        e.u32(d.rdev)?;
        write_time(e, d.atime)?;
        write_time(e, d.mtime)?;
        write_time(e, d.ctime)?;
        d.xattrs.encode(e)?;
        match &mut d.content {
            Content::File(f) => {
                e.u8(FILE)?;
                f.drain_into(e)?;
            }
            Content::Dir(dir) => {
                e.u8(DIR)?;
                dir.encode(e)?;
            }
            Content::Symlink(t) => {
                e.u8(SYMLINK)?;
                e.bytes(t)?;
            }
            Content::Special => e.u8(SPECIAL)?,
        }
    }
    fs.locks.encode(e)
}

fn read_state(
    config: MemFsConfig,
    state: &[u8],
    file: OwnedFd,
    region: SharedRegion,
    vault: Option<&Vault>,
) -> io::Result<MemFs> {
    let field = |i: usize| -> u64 {
        let b = state.get(8 + i * 8..16 + i * 8).unwrap_or_default();
        u64::from_le_bytes(b.try_into().unwrap_or_default())
    };
    if state.len() != 32 || &state[..8] != STATE_MAGIC {
        return Err(bad(format!(
            "not a memfs state of this version ({} bytes starting {:?})",
            state.len(),
            String::from_utf8_lossy(&state[..state.len().min(8)])
        )));
    }
    let (key, len, sum) = (field(0), field(1), field(2));
    if key != STATE_KEY {
        return Err(bad(format!("the state names vault key {key}, not {STATE_KEY}")));
    }
    let mut f = std::fs::File::from(file);
    let actual = f.metadata()?.len();
    if actual != len {
        return Err(bad(format!(
            "the memory file holds {actual} bytes, the state says {len}"
        )));
    }
    f.rewind()?;
    decode(
        config,
        BufReader::with_capacity(1 << 20, f),
        len,
        sum,
        region,
        vault,
    )
}

fn read_tree<R: Read>(
    config: MemFsConfig,
    d: &mut Dec<R>,
    region: SharedRegion,
    vault: Option<&Vault>,
) -> io::Result<MemFs> {
    let mut magic = [0u8; 8];
    d.raw(&mut magic)?;
    if &magic != FILE_MAGIC {
        return Err(bad("not a memfs tree"));
    }
    let version = d.u32()?;
    if version != VERSION {
        return Err(bad(format!(
            "a tree of version {version}; this memfs reads {VERSION}"
        )));
    }
    let next = d.u64()?;
    let (saved_bytes, saved_inodes) = (d.u64()?, d.u64()?);
    // The shared word may be ahead (it never goes back).
    let next = next.max(region.words()[0].load(Relaxed));
    if next <= Inode::ROOT.0 {
        return Err(bad(format!("next inode number {next}")));
    }
    region.words()[0].store(next, Relaxed);
    let fs = MemFs::empty(config, shared_ids(region, 0), vault.cloned());
    let count = d.count(64, "inodes")?;
    for _ in 0..count {
        let ino = d.u64()?;
        if ino == 0 || ino >= next {
            return Err(bad(format!("inode {ino} (the next number is {next})")));
        }
        let nlink = d.u32()?;
        let lookups = d.u64()?;
        let opens = d.u32()?;
        let parent = d.u64()?;
        let (mode, uid, gid, rdev) = (d.u32()?, d.u32()?, d.u32()?, d.u32()?);
        let (atime, mtime, ctime) = (read_time(d)?, read_time(d)?, read_time(d)?);
        let xattrs = Xattrs::decode(d)?;
        let content = match (d.u8()?, mode & libc::S_IFMT) {
            (FILE, libc::S_IFREG) => Content::File(FileData::decode(d, super::MAX_SIZE)?),
            (DIR, libc::S_IFDIR) => Content::Dir(DirData::decode(d)?),
            (SYMLINK, libc::S_IFLNK) => {
                Content::Symlink(d.bytes(libc::PATH_MAX as usize, "a symlink target")?.into())
            }
            (SPECIAL, libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFCHR | libc::S_IFBLK) => Content::Special,
            (tag, kind) => {
                return Err(bad(format!(
                    "inode {ino}: contents of kind {tag} for mode {mode:#o} ({kind:#o})"
                )));
            }
        };
        let mut data = Data {
            mode,
            uid,
            gid,
            rdev,
            atime,
            mtime,
            ctime,
            xattrs,
            content,
            charged: 0,
        };
        data.charged = data.usage();
        let node = Node {
            ino,
            nlink: AtomicU32::new(nlink),
            lookups: AtomicU64::new(lookups),
            opens: AtomicU32::new(opens),
            parent: AtomicU64::new(parent),
            data: RwLock::new(data),
            cap: fs.cap.clone(),
        };
        // Counted before it can be dropped, which gives it back.
        fs.cap.force_bytes(node.read().charged);
        fs.cap.force_inodes(1);
        if fs.get(Inode(ino)).is_ok() {
            return Err(bad(format!("inode {ino} twice")));
        }
        fs.insert(Arc::new(node));
    }
    check_tree(&fs)?;
    // As tmpfs refuses a remount to a size below what it holds: a daemon
    // started with smaller limits than the tree takes refuses it.
    let (bytes, inodes) = fs.usage();
    let over = |used: u64, max: u64| max != super::capacity::UNLIMITED && used > max;
    if over(bytes, fs.cap.max_bytes()) || over(inodes, fs.cap.max_inodes()) {
        return Err(bad(format!(
            "the tree takes {bytes} bytes and {inodes} inodes; this daemon allows {} and {} (size=, nr_inodes=)",
            fs.cap.max_bytes(),
            fs.cap.max_inodes()
        )));
    }
    fs.locks.decode(d, |ino| {
        fs.get(Inode(ino)).is_ok_and(|n| n.opens.load(Acquire) > 0)
    })?;
    let (bytes, inodes) = fs.usage();
    if (bytes, inodes) != (saved_bytes, saved_inodes) {
        log::warn!(
            "memfs: the predecessor counted {saved_bytes} bytes and {saved_inodes} inodes in use; the tree restored holds {bytes} and {inodes}"
        );
    }
    Ok(fs)
}

/// The tree's invariants, so that a state that decodes but makes no sense
/// is refused rather than served.
fn check_tree(fs: &MemFs) -> io::Result<()> {
    use std::collections::HashMap;
    let root = fs.get(Inode::ROOT).map_err(|_| bad("no root directory"))?;
    if root.read().mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(bad("the root is not a directory"));
    }
    // Names of each inode, subdirectories of each directory.
    let mut names: HashMap<u64, u64> = HashMap::new();
    let mut subdirs: HashMap<u64, u64> = HashMap::new();
    let mut extra_links = 0u64;
    // Taken out of the table first: no shard lock is held while looking
    // an inode up.
    let nodes = fs.all_nodes();
    for node in &nodes {
        let d = node.read();
        let Content::Dir(dir) = &d.content else {
            continue;
        };
        {
            for (_, e) in dir.after(0) {
                if e.ino == node.ino || e.ino == Inode::ROOT.0 {
                    return Err(bad(format!("directory {} names itself or the root", node.ino)));
                }
                let child = fs.get(Inode(e.ino)).map_err(|_| {
                    bad(format!(
                        "directory {} names inode {}, which is not there",
                        node.ino, e.ino
                    ))
                })?;
                let kind = child.read().mode & libc::S_IFMT;
                if kind != e.kind {
                    return Err(bad(format!("an entry of inode {} has the wrong type", e.ino)));
                }
                *names.entry(e.ino).or_default() += 1;
                if kind == libc::S_IFDIR {
                    *subdirs.entry(node.ino).or_default() += 1;
                    if child.parent.load(Acquire) != node.ino {
                        return Err(bad(format!(
                            "directory {} is in {}, its parent says otherwise",
                            e.ino, node.ino
                        )));
                    }
                }
            }
        }
    }
    let mut reachable = std::collections::HashSet::from([Inode::ROOT.0]);
    for node in &nodes {
        let d = node.read();
        {
            let nlink = u64::from(node.nlink.load(Acquire));
            let named = names.get(&node.ino).copied().unwrap_or(0);
            let ok = if d.mode & libc::S_IFMT == libc::S_IFDIR {
                let removed = nlink == 0 && named == 0 && d.dir().is_ok_and(|x| x.is_empty());
                let root = node.ino == Inode::ROOT.0;
                removed
                    || (named == u64::from(!root)
                        && nlink == 2 + subdirs.get(&node.ino).copied().unwrap_or(0)
                        && below_root(fs, node.ino, nodes.len(), &mut reachable))
            } else {
                extra_links += nlink.saturating_sub(1);
                nlink == named
            };
            if !ok {
                return Err(bad(format!(
                    "inode {} has {nlink} links and {named} names",
                    node.ino
                )));
            }
        }
    }
    fs.cap.force_inodes(extra_links);
    Ok(())
}

/// Whether directory `ino` is below the root by its parents (no loop
/// cut off from the tree); `reachable` remembers those found so.
fn below_root(fs: &MemFs, ino: u64, most: usize, reachable: &mut std::collections::HashSet<u64>) -> bool {
    let mut path = Vec::new();
    let mut at = ino;
    while !reachable.contains(&at) {
        if path.len() > most {
            return false;
        }
        path.push(at);
        match fs.get(Inode(at)) {
            Ok(n) => at = n.parent.load(Acquire),
            Err(_) => return false,
        }
    }
    reachable.extend(path);
    true
}

impl MemFs {
    /// Every inode, taken out of the table (no shard lock held after).
    fn all_nodes(&self) -> Vec<Arc<Node>> {
        self.shards
            .iter()
            .flat_map(|s| {
                let s = s.read().unwrap_or_else(|e| e.into_inner());
                s.values().cloned().collect::<Vec<_>>()
            })
            .collect()
    }

    /// An empty table (not even a root), for a restore to fill.
    fn empty(config: MemFsConfig, ids: Ids, vault: Option<Vault>) -> MemFs {
        let cap = Arc::new(super::Capacity::new(config.size, config.nr_inodes));
        MemFs {
            shards: (0..super::SHARDS)
                .map(|_| RwLock::new(std::collections::HashMap::new()))
                .collect(),
            ids,
            rename_lock: std::sync::Mutex::new(()),
            config,
            locks: Arc::new(super::Locks::new(cap.clone())),
            cap,
            vault,
        }
    }

    /// A new filesystem (a root directory) taking inode numbers from `ids`.
    fn build(config: MemFsConfig, ids: Ids, vault: Option<Vault>) -> MemFs {
        let fs = MemFs::empty(config, ids, vault);
        fs.add_root();
        fs
    }
}

#[cfg(test)]
mod tests {
    use super::super::data::DirEntry;
    use super::*;
    use std::io::Cursor;

    fn config() -> MemFsConfig {
        MemFsConfig {
            size: 0,
            nr_inodes: 0,
            ..MemFsConfig::default()
        }
    }

    /// Adds `name` in `parent` as a request would, with some attributes.
    fn add(fs: &MemFs, parent: u64, name: &[u8], mode: u32, content: Content) -> Arc<Node> {
        let ino = fs.ids.next();
        let t = |n: i64| Time {
            sec: 1_700_000_000 + n,
            nsec: 7 + n as u32,
        };
        let mut d = Data {
            mode,
            uid: 1000,
            gid: 100,
            rdev: 0,
            atime: t(1),
            mtime: t(2),
            ctime: t(3),
            xattrs: Xattrs::default(),
            content,
            charged: 0,
        };
        d.charged = d.usage();
        fs.cap.force_bytes(d.charged);
        fs.cap.force_inodes(1);
        let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
        let node = Arc::new(Node {
            ino,
            nlink: AtomicU32::new(if is_dir { 2 } else { 1 }),
            lookups: AtomicU64::new(ino * 3),
            opens: AtomicU32::new((ino % 3) as u32),
            parent: AtomicU64::new(parent),
            data: RwLock::new(d),
            cap: fs.cap.clone(),
        });
        let p = fs.get(Inode(parent)).unwrap();
        let mut pd = p.write();
        let cost = pd.dir().unwrap().insert_cost(name.len());
        fs.charge(&mut pd, cost).unwrap();
        pd.dir_mut().unwrap().insert(name, ino, mode & libc::S_IFMT);
        fs.settle(&mut pd);
        if is_dir {
            p.nlink.fetch_add(1, AcqRel);
        }
        fs.insert(node.clone());
        node
    }

    /// A tree with a bit of everything: files with pages and holes, a
    /// subdirectory, a hard link, a symlink, a device, xattrs, gaps in the
    /// cookies, an unlinked open file.
    fn sample() -> MemFs {
        let fs = MemFs::new(config());
        let f = add(
            &fs,
            1,
            b"file",
            libc::S_IFREG | 0o644,
            Content::File(FileData::default()),
        );
        fs.do_write(Inode(f.ino), 10, b"hello", false).unwrap();
        fs.do_write(Inode(f.ino), 3 << 20, &[9u8; 5000], false).unwrap();
        let dir = add(
            &fs,
            1,
            b"dir",
            libc::S_IFDIR | 0o1755,
            Content::Dir(DirData::default()),
        );
        for i in 0..20 {
            let n = add(
                &fs,
                dir.ino,
                format!("n{i}").as_bytes(),
                libc::S_IFREG | 0o600,
                Content::File(FileData::default()),
            );
            if i % 3 == 0 {
                let mut dd = dir.write();
                dd.dir_mut().unwrap().remove(format!("n{i}").as_bytes());
                fs.settle(&mut dd);
                n.nlink.store(0, Release);
                fs.maybe_free(&n);
            }
        }
        // A second name of "file".
        {
            let mut dd = dir.write();
            dd.dir_mut().unwrap().insert(b"link", f.ino, libc::S_IFREG);
            fs.settle(&mut dd);
            f.nlink.fetch_add(1, AcqRel);
            fs.cap.force_inodes(1);
        }
        add(
            &fs,
            dir.ino,
            b"sym",
            libc::S_IFLNK | 0o777,
            Content::Symlink((*b"../file").into()),
        );
        let dev = add(&fs, 1, b"dev", libc::S_IFCHR | 0o600, Content::Special);
        dev.write().rdev = 0x0103;
        {
            let mut d = f.write();
            d.xattrs.set(b"user.a", b"1");
            d.xattrs.set(b"trusted.b", &[2; 300]);
            fs.settle(&mut d);
        }
        let gone = add(
            &fs,
            1,
            b"gone",
            libc::S_IFREG | 0o600,
            Content::File(FileData::default()),
        );
        fs.do_write(Inode(gone.ino), 0, b"still open", false).unwrap();
        gone.opens.store(1, Release);
        let root = fs.get(Inode::ROOT).unwrap();
        let mut rd = root.write();
        rd.dir_mut().unwrap().remove(b"gone");
        fs.settle(&mut rd);
        gone.nlink.store(0, Release);
        // Locks: two processes' POSIX locks on "file" (split and merged
        // ranges), one on the unlinked open file, and flock holders.
        let lock = |start, end, typ, pid| fuse_wire::session::Lock { start, end, typ, pid };
        let (rd, wr) = (libc::F_RDLCK, libc::F_WRLCK);
        for (ino, owner, flock, l) in [
            (f.ino, 11, false, lock(0, 99, rd, 100)),
            (f.ino, 11, false, lock(200, u64::MAX, wr, 100)),
            (f.ino, 12, false, lock(50, 150, rd, 101)),
            (f.ino, 11, false, lock(20, 30, libc::F_UNLCK, 100)),
            (gone.ino, 13, false, lock(0, 9, wr, 102)),
            (f.ino, 14, true, lock(0, u64::MAX, rd, 103)),
            (f.ino, 15, true, lock(0, u64::MAX, rd, 104)),
        ] {
            assert!(fs.locks.set(ino, owner, flock, l), "{owner} {l:?}");
        }
        fs
    }

    /// Everything a client could see, as text.
    fn describe(fs: &MemFs) -> Vec<String> {
        let mut nodes: Vec<Arc<Node>> = fs
            .shards
            .iter()
            .flat_map(|s| s.read().unwrap().values().cloned().collect::<Vec<_>>())
            .collect();
        nodes.sort_by_key(|n| n.ino);
        let mut out = vec![format!("usage {:?} next {}", fs.usage(), fs.ids.peek())];
        out.extend(fs.locks.held());
        for n in nodes {
            let d = n.read();
            let counts = (
                n.nlink.load(Relaxed),
                n.lookups.load(Relaxed),
                n.opens.load(Relaxed),
                n.parent.load(Relaxed),
            );
            let xattrs: Vec<(&[u8], Option<&[u8]>)> =
                d.xattrs.names().map(|k| (k, d.xattrs.get(k))).collect();
            let content = match &d.content {
                Content::File(f) => {
                    let mut buf = vec![0u8; f.size() as usize];
                    f.read(0, &mut buf);
                    let sum = buf
                        .iter()
                        .fold(0u64, |s, &b| s.wrapping_mul(31).wrapping_add(u64::from(b)));
                    format!(
                        "file size {} pages {} sum {sum} hole {:?}",
                        f.size(),
                        f.pages(),
                        f.seek_hole(0)
                    )
                }
                Content::Dir(dir) => format!(
                    "dir {:?}",
                    dir.after(0)
                        .map(|(c, e): (u64, &DirEntry)| (c, e.ino, e.kind, e.name.to_vec()))
                        .collect::<Vec<_>>()
                ),
                Content::Symlink(t) => format!("symlink {t:?}"),
                Content::Special => "special".into(),
            };
            out.push(format!(
                "{} {counts:?} {:?} {xattrs:?} {content} charged {}",
                n.ino,
                n.attr(&d),
                d.charged
            ));
        }
        out
    }

    fn region() -> SharedRegion {
        SharedRegion::create("memfs-keep-test", 8).unwrap()
    }

    fn round_trip(fs: &MemFs) -> io::Result<MemFs> {
        let mut bytes = Vec::new();
        let (len, sum) = encode(fs, &mut bytes)?;
        assert_eq!(len, bytes.len() as u64);
        decode(config(), Cursor::new(bytes), len, sum, region(), None)
    }

    #[test]
    fn a_tree_comes_back_as_it_was() {
        let fs = sample();
        let before = describe(&fs);
        let back = round_trip(&fs).unwrap();
        assert_eq!(describe(&back), before);
        // A name added now gets the cookie it would have had.
        let cookie_of = |fs: &MemFs| {
            let root = fs.get(Inode::ROOT).unwrap();
            let mut d = root.write();
            let dir = d.dir_mut().unwrap();
            dir.insert(b"later", 99, libc::S_IFREG);
            dir.get(b"later").map(|_| dir.after(0).last().map(|(c, _)| c))
        };
        assert_eq!(cookie_of(&back), cookie_of(&sample()));
        // Inode numbers go on from where they were.
        assert_eq!(back.ids.next(), sample().ids.peek());
    }

    #[test]
    fn saving_empties_the_files() {
        let fs = sample();
        let (used, _) = fs.usage();
        round_trip(&fs).unwrap();
        let pages: u64 = fs
            .shards
            .iter()
            .flat_map(|s| s.read().unwrap().values().cloned().collect::<Vec<_>>())
            .map(|n| match &n.read().content {
                Content::File(f) => f.pages(),
                _ => 0,
            })
            .sum();
        assert_eq!(pages, 0, "pages left after saving ({used} bytes were used)");
    }

    #[test]
    fn a_damaged_or_cut_state_is_refused_never_served() {
        let mut bytes = Vec::new();
        let (len, sum) = encode(&sample(), &mut bytes).unwrap();
        let try_with = |b: Vec<u8>, len: u64| decode(config(), Cursor::new(b), len, sum, region(), None);
        // Every byte of the first kilobyte, then every 97th: one bit flipped.
        for i in (0..bytes.len()).filter(|i| *i < 1024 || i % 97 == 0) {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(try_with(b, len).is_err(), "byte {i} flipped: accepted");
        }
        for cut in (0..bytes.len()).step_by(61).chain([bytes.len() - 1]) {
            let b = bytes[..cut].to_vec();
            assert!(try_with(b.clone(), cut as u64).is_err(), "cut at {cut}: accepted");
            assert!(
                try_with(b, len).is_err(),
                "cut at {cut}, whole length claimed: accepted"
            );
        }
        assert!(try_with(bytes, len).is_ok());
    }

    #[test]
    fn a_consistent_looking_state_that_breaks_the_tree_is_refused() {
        // Each fault written with a valid checksum: the tree's checks catch it.
        type Fault = (&'static str, fn(&MemFs));
        let faults: [Fault; 5] = [
            ("a link count off by one", |fs| {
                let root = fs.get(Inode::ROOT).unwrap();
                let ino = root.read().dir().unwrap().get(b"file").unwrap().ino;
                fs.get(Inode(ino)).unwrap().nlink.fetch_add(1, AcqRel);
            }),
            ("an entry naming no inode", |fs| {
                let root = fs.get(Inode::ROOT).unwrap();
                root.write()
                    .dir_mut()
                    .unwrap()
                    .insert(b"ghost", 4242, libc::S_IFREG);
            }),
            ("an entry of the wrong type", |fs| {
                let root = fs.get(Inode::ROOT).unwrap();
                let mut d = root.write();
                let ino = d.dir().unwrap().get(b"file").unwrap().ino;
                d.dir_mut().unwrap().replace(b"file", ino, libc::S_IFDIR);
            }),
            ("two directories in each other, cut off from the root", |fs| {
                let root = fs.get(Inode::ROOT).unwrap();
                let a = add(
                    fs,
                    1,
                    b"a",
                    libc::S_IFDIR | 0o755,
                    Content::Dir(DirData::default()),
                );
                let b = add(
                    fs,
                    a.ino,
                    b"b",
                    libc::S_IFDIR | 0o755,
                    Content::Dir(DirData::default()),
                );
                let mut rd = root.write();
                rd.dir_mut().unwrap().remove(b"a");
                root.nlink.fetch_sub(1, AcqRel);
                b.write().dir_mut().unwrap().insert(b"a", a.ino, libc::S_IFDIR);
                b.nlink.fetch_add(1, AcqRel);
                a.parent.store(b.ino, Release);
            }),
            ("an inode number not below the next one", |fs| {
                fs.ids.counter().store(3, Relaxed);
            }),
        ];
        for (what, fault) in faults {
            let fs = sample();
            fault(&fs);
            let e = round_trip(&fs).err();
            assert!(e.is_some(), "{what}: accepted");
        }
    }

    #[test]
    fn a_tree_larger_than_the_limits_is_refused() {
        let fs = sample();
        let (bytes, inodes) = fs.usage();
        let mut enc = Vec::new();
        let (len, sum) = encode(&fs, &mut enc).unwrap();
        let with = |size, nr_inodes| {
            let config = MemFsConfig {
                size,
                nr_inodes,
                ..MemFsConfig::default()
            };
            decode(config, Cursor::new(enc.clone()), len, sum, region(), None).map(|_| ())
        };
        // What the predecessor held (its locks included) fits exactly.
        with(bytes, inodes).unwrap();
        assert!(with(bytes - 1, inodes).is_err(), "a size below the bytes held");
        assert!(
            with(bytes, inodes - 1).is_err(),
            "an inode limit below the inodes held"
        );
    }

    #[test]
    fn the_handed_state_must_name_the_right_file() {
        let fs = sample();
        let mut file = memory_file().unwrap();
        let (len, sum) = encode(&fs, &mut file).unwrap();
        let state = |magic: &[u8; 8], key: u64, len: u64| {
            let mut s = magic.to_vec();
            for v in [key, len, sum] {
                s.extend_from_slice(&v.to_le_bytes());
            }
            s
        };
        let fd = || file.try_clone().unwrap().into();
        let read = |s: Vec<u8>| read_state(config(), &s, fd(), region(), None).map(|_| ());
        read(state(STATE_MAGIC, STATE_KEY, len)).unwrap();
        for (what, s) in [
            ("another magic", state(b"MEMFS-S0", STATE_KEY, len)),
            ("another key", state(STATE_MAGIC, 7, len)),
            ("another length", state(STATE_MAGIC, STATE_KEY, len + 8)),
            ("a short state", state(STATE_MAGIC, STATE_KEY, len)[..24].to_vec()),
        ] {
            let e = read(s).expect_err(what);
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{what}: {e}");
        }
    }
}

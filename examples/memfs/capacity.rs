//! memfs's capacity: how many bytes and inodes the filesystem may hold
//! (`-o size=`, `-o nr_inodes=`, as tmpfs spells them), what is in use, what
//! each kind of record is charged, and the parsing of those options.
//!
//! Both counters are atomics. Growth reserves with a compare-and-swap loop
//! that never lets the total pass the limit, so concurrent writers and
//! creators cannot overshoot it together; release is a plain subtraction.
//! No lock is taken, and a write that allocates nothing new touches neither
//! counter.
//!
//! # What is charged
//!
//! Bytes are charged for the memory memfs really holds, not for the bytes
//! a caller stored: a one-byte write into a hole costs a page, an empty file
//! costs its inode record. Each charge below is an upper bound of what the
//! record costs the allocator (its allocations rounded as glibc rounds them,
//! with the maps' slack), checked by the unit tests of this example (see
//! `alloc_count.rs`):
//!
//! - [`INODE_COST`] per inode alive (the root included): its record and its
//!   slot in the inode table;
//! - [`PAGE_COST`] per page of file contents that holds data (a [`PAGE`] of
//!   memory and its entry in the file's page map; holes are free);
//! - [`DIRENT_COST`] plus the name's length per directory entry;
//! - [`XATTR_COST`] plus the name's and value's lengths per extended
//!   attribute;
//! - [`TARGET_COST`] plus its length for a symbolic link's target;
//! - [`MAP_COST`] for each map that is not empty (a file's pages, a
//!   directory's entries, an inode's extended attributes): the first nodes
//!   of a map cost more than its later entries;
//! - [`LOCK_COST`] per lock record memfs serves (`-o posix_lock`, `-o
//!   flock`), and [`LOCK_OWNER_COST`] per lock owner holding records on a
//!   file.
//!
//! What counts as an inode: every inode alive (the root included) and every
//! hard link beyond an inode's first name, as tmpfs counts them.

use fuse_wire::session::Errno;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const ENOSPC: Errno = Errno::new_or_eio(libc::ENOSPC);

/// The unit of file contents: memory is taken and charged a page at a time.
pub const PAGE: u64 = 4096;
/// A page of file contents and its entry in the file's page map.
pub const PAGE_COST: u64 = PAGE + 128;
/// An inode's record and its slot in the inode table.
pub const INODE_COST: u64 = 512;
/// The first nodes of a map that holds something.
pub const MAP_COST: u64 = 512;
/// A directory entry, besides its name.
pub const DIRENT_COST: u64 = 320;
/// An extended attribute, besides its name and value.
pub const XATTR_COST: u64 = 192;
/// A symbolic link's target, besides its bytes.
pub const TARGET_COST: u64 = 32;
/// A lock record.
pub const LOCK_COST: u64 = 256;
/// A lock owner holding records on a file.
pub const LOCK_OWNER_COST: u64 = 1024;

/// A limit of 0 means "no limit" (as `size=0` on tmpfs).
pub const UNLIMITED: u64 = 0;

/// Limits and usage of one filesystem.
#[derive(Debug)]
pub struct Capacity {
    max_bytes: u64,
    max_inodes: u64,
    bytes: AtomicU64,
    inodes: AtomicU64,
}

/// Takes `n` from `used` if the total stays within `max` (0: no limit).
fn reserve(used: &AtomicU64, max: u64, n: u64) -> Result<(), Errno> {
    if n == 0 {
        return Ok(());
    }
    let limit = if max == UNLIMITED { u64::MAX } else { max };
    used.fetch_update(Relaxed, Relaxed, |u| u.checked_add(n).filter(|&t| t <= limit))
        .map(|_| ())
        .map_err(|_| ENOSPC)
}

fn release(used: &AtomicU64, n: u64) {
    if n != 0 {
        let _ = used.fetch_update(Relaxed, Relaxed, |u| Some(u.saturating_sub(n)));
    }
}

impl Capacity {
    pub fn new(max_bytes: u64, max_inodes: u64) -> Capacity {
        Capacity {
            max_bytes,
            max_inodes,
            bytes: AtomicU64::new(0),
            inodes: AtomicU64::new(0),
        }
    }

    /// The byte limit (0: none).
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The inode limit (0: none).
    pub fn max_inodes(&self) -> u64 {
        self.max_inodes
    }

    pub fn bytes_used(&self) -> u64 {
        self.bytes.load(Relaxed)
    }

    pub fn inodes_used(&self) -> u64 {
        self.inodes.load(Relaxed)
    }

    /// Bytes that may still be reserved (`u64::MAX` without a limit).
    pub fn bytes_free(&self) -> u64 {
        match self.max_bytes {
            UNLIMITED => u64::MAX,
            max => max.saturating_sub(self.bytes_used()),
        }
    }

    /// Reserves `n` bytes, or fails with ENOSPC and reserves nothing.
    pub fn reserve_bytes(&self, n: u64) -> Result<(), Errno> {
        reserve(&self.bytes, self.max_bytes, n)
    }

    /// Counts `n` bytes whatever the limit (for corrections only).
    pub fn force_bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Relaxed);
    }

    pub fn release_bytes(&self, n: u64) {
        release(&self.bytes, n)
    }

    /// Reserves one inode (or hard link), or fails with ENOSPC.
    pub fn reserve_inode(&self) -> Result<(), Errno> {
        reserve(&self.inodes, self.max_inodes, 1)
    }

    /// Counts `n` inodes whatever the limit (the root, and what a restore
    /// brings back).
    pub fn force_inodes(&self, n: u64) {
        self.inodes.fetch_add(n, Relaxed);
    }

    pub fn release_inode(&self) {
        release(&self.inodes, 1)
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes (2 GiB if unknown).
pub fn total_memory() -> u64 {
    meminfo("MemTotal:").unwrap_or(2 << 30)
}

/// A `/proc/meminfo` line's value, in bytes.
pub fn meminfo(key: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    })
}

/// The default byte limit: half of the RAM, as tmpfs.
pub fn default_size() -> u64 {
    total_memory() / 2
}

/// The default inode limit: one per page of half the RAM, as tmpfs.
pub fn default_inodes() -> u64 {
    (total_memory() / 2 / 4096).max(1024)
}

/// Parses a tmpfs-style size: a number with an optional `k`, `m`, `g`, `t`
/// suffix (powers of 1024), or `N%` of the RAM. `0` means no limit.
pub fn parse_size(s: &str) -> Option<u64> {
    if let Some(pct) = s.strip_suffix('%') {
        let pct: u64 = pct.parse().ok()?;
        return Some((total_memory() as u128 * pct as u128 / 100).min(u64::MAX as u128) as u64);
    }
    parse_count(s)
}

/// Parses a number with an optional `k`, `m`, `g`, `t` suffix.
pub fn parse_count(s: &str) -> Option<u64> {
    let (digits, shift) = match s.chars().last()?.to_ascii_lowercase() {
        'k' => (&s[..s.len() - 1], 10),
        'm' => (&s[..s.len() - 1], 20),
        'g' => (&s[..s.len() - 1], 30),
        't' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    let n: u64 = digits.parse().ok()?;
    n.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_tmpfs() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("3M"), Some(3 << 20));
        assert_eq!(parse_size("2g"), Some(2 << 30));
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("100%"), Some(total_memory()));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999999t"), None);
    }

    #[test]
    fn reservation_never_passes_the_limit() {
        let c = Capacity::new(10, 2);
        assert!(c.reserve_bytes(6).is_ok());
        assert!(c.reserve_bytes(5).is_err());
        assert!(c.reserve_bytes(4).is_ok());
        assert_eq!(c.bytes_free(), 0);
        c.release_bytes(10);
        assert_eq!(c.bytes_used(), 0);
        assert!(c.reserve_inode().is_ok());
        assert!(c.reserve_inode().is_ok());
        assert!(c.reserve_inode().is_err());
    }
}

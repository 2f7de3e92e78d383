//! Shared memory that outlives the daemon that writes it: an anonymous
//! file (`memfd_create`) mapped `MAP_SHARED`, whose descriptor a keeper
//! holds ([`crate::vault`]), so that a successor maps the same pages after a
//! crash and finds what its predecessor wrote up to its last store.
//!
//! The mapping is only ever seen as a slice of [`AtomicU64`]: processes that
//! share it may write at any time (and die in the middle of a record), so
//! plain references to its bytes would be data races. Records built from
//! words say themselves when they are complete (a word written last).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// A shared, fixed-size mapping of a memory file.
#[derive(Debug)]
pub struct SharedRegion {
    fd: OwnedFd,
    ptr: std::ptr::NonNull<AtomicU64>,
    words: usize,
}

// SAFETY: the mapping is only reached through atomics, which any thread may
// use at once; the pointer is valid until drop.
unsafe impl Send for SharedRegion {}
// SAFETY: as above.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// A new zeroed region of at least `len` bytes (rounded up to whole
    /// pages) in a new memory file named `name` (as `/proc/PID/fd` shows it).
    pub fn create(name: &str, len: usize) -> io::Result<SharedRegion> {
        let fd = memory_file(name)?;
        let len = round_to_pages(len.max(1));
        std::fs::File::from(fd.try_clone()?).set_len(len as u64)?;
        Self::map(fd, len)
    }

    /// Maps a memory file received from another process (its whole size).
    /// Refuses an empty file or one that is not a multiple of 8 bytes.
    pub fn from_fd(fd: OwnedFd) -> io::Result<SharedRegion> {
        let st = nix::sys::stat::fstat(fd.as_fd()).map_err(io::Error::from)?;
        let len = usize::try_from(st.st_size).unwrap_or(0);
        if len == 0 || !len.is_multiple_of(8) || st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a shared region (an empty or odd-sized file, or not a regular file)",
            ));
        }
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<SharedRegion> {
        use std::os::fd::AsRawFd;
        // SAFETY: a new shared mapping of `len` bytes of a file at least
        // that long; the result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(p.cast::<AtomicU64>())
            .ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(SharedRegion {
            fd,
            ptr,
            words: len / 8,
        })
    }

    /// The region as words. Page-aligned, so every word is aligned.
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is `words * 8` bytes, page-aligned, lives as
        // long as `self`, and is only ever accessed through atomics (by this
        // and other processes), which AtomicU64 permits for shared memory.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.words) }
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.words * 8
    }

    /// Never empty (at least a page); for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.words == 0
    }

    /// The memory file, to hand to a keeper or a successor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Gives the pages wholly inside `offset..offset + len` (bytes) back
    /// to the system (`fallocate(PUNCH_HOLE)`): they read as zeros again
    /// and take no memory until written. Of a page only partly inside, the
    /// whole words inside are zeroed instead. For kept memory a filesystem is done
    /// with (a staged upload that was sent), so that what the region holds
    /// is what is in use, not its high-water mark.
    pub fn release(&self, offset: usize, len: usize) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let end = offset.saturating_add(len).min(self.len());
        if offset >= end {
            return Ok(());
        }
        let page = round_to_pages(1);
        let (first, last) = (offset.div_ceil(page) * page, end / page * page);
        let zero = |from: usize, to: usize| {
            let (a, b) = (from.div_ceil(8), to / 8);
            for w in self.words().get(a..b).unwrap_or_default() {
                w.store(0, Ordering::Relaxed);
            }
        };
        if first >= last {
            zero(offset, end);
            return Ok(());
        }
        zero(offset, first);
        zero(last, end);
        // SAFETY: fallocate on our own memory file, within its size.
        let r = unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                first as libc::off_t,
                (last - first) as libc::off_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Zeroes every word (a region reused for a new connection).
    pub fn clear(&self) {
        for w in self.words() {
            w.store(0, Ordering::Relaxed);
        }
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; nothing borrows
        // it any more (`words()` borrows `self`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.words * 8) };
    }
}

/// A new empty memory file (`memfd_create`, close-on-exec) named `name`.
pub fn memory_file(name: &str) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: memfd_create with a valid C string; the result is checked.
    let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor memfd_create just returned, owned by nobody else.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) })
}

/// Stores `bytes` into `words`, eight to a word (little-endian, the last
/// word padded with zeros). Returns false if they do not fit.
pub fn store_bytes(words: &[AtomicU64], bytes: &[u8]) -> bool {
    if bytes.len() > words.len() * 8 {
        return false;
    }
    for (w, chunk) in words.iter().zip(bytes.chunks(8)) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        w.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
    true
}

/// Loads `out.len()` bytes stored by [`store_bytes`]. Returns false if
/// `words` is too short.
pub fn load_bytes(words: &[AtomicU64], out: &mut [u8]) -> bool {
    if out.len() > words.len() * 8 {
        return false;
    }
    for (w, chunk) in words.iter().zip(out.chunks_mut(8)) {
        let b = w.load(Ordering::Relaxed).to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    true
}

/// Stores `bytes` at byte `offset` of `words` (little-endian words, as
/// [`store_bytes`] lays them out), leaving the other bytes of the words at
/// either end as they were. Returns false, storing nothing, if they do not
/// fit. The words at the ends are read and written back: two writers of
/// bytes that share a word must not run at once.
pub fn store_bytes_at(words: &[AtomicU64], offset: usize, bytes: &[u8]) -> bool {
    let Some(end) = offset.checked_add(bytes.len()) else {
        return false;
    };
    if end > words.len() * 8 {
        return false;
    }
    let mut at = offset;
    let mut rest = bytes;
    while !rest.is_empty() {
        let (w, skip) = (&words[at / 8], at % 8);
        let n = (8 - skip).min(rest.len());
        let v = if n == 8 {
            u64::from_le_bytes(rest[..8].try_into().unwrap_or_default())
        } else {
            let mut b = w.load(Ordering::Relaxed).to_le_bytes();
            b[skip..skip + n].copy_from_slice(&rest[..n]);
            u64::from_le_bytes(b)
        };
        w.store(v, Ordering::Relaxed);
        at += n;
        rest = &rest[n..];
    }
    true
}

/// Loads `out.len()` bytes from byte `offset` of `words`, as
/// [`store_bytes_at`] stored them. Returns false if they are not all there.
pub fn load_bytes_at(words: &[AtomicU64], offset: usize, out: &mut [u8]) -> bool {
    match offset.checked_add(out.len()) {
        Some(end) if end <= words.len() * 8 => {}
        _ => return false,
    }
    let mut at = offset;
    let mut filled = 0;
    while filled < out.len() {
        let (b, skip) = (words[at / 8].load(Ordering::Relaxed).to_le_bytes(), at % 8);
        let n = (8 - skip).min(out.len() - filled);
        out[filled..filled + n].copy_from_slice(&b[skip..skip + n]);
        at += n;
        filled += n;
    }
    true
}

fn round_to_pages(len: usize) -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .unwrap_or(4096)
        .max(8);
    len.div_ceil(page) * page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_mapping_of_the_file_sees_the_first_ones_stores() {
        let a = SharedRegion::create("test-region", 100).unwrap();
        assert!(a.len() >= 100 && a.len().is_multiple_of(8));
        a.words()[3].store(0xfeed, Ordering::Release);
        assert!(store_bytes(&a.words()[4..8], b"hello, shared world"));
        let b = SharedRegion::from_fd(a.fd().try_clone_to_owned().unwrap()).unwrap();
        drop(a);
        assert_eq!(b.words()[3].load(Ordering::Acquire), 0xfeed);
        let mut out = [0u8; 19];
        assert!(load_bytes(&b.words()[4..8], &mut out));
        assert_eq!(&out, b"hello, shared world");
        assert!(!store_bytes(&b.words()[..1], b"nine byte"));
    }

    #[test]
    fn bytes_at_any_offset_round_trip_and_leave_their_neighbours_alone() {
        let r = SharedRegion::create("test-region-at", 3 * 4096).unwrap();
        let words = r.words();
        assert!(store_bytes_at(words, 0, &[0xaa; 64]));
        // Unaligned at both ends, across several words.
        assert!(store_bytes_at(words, 3, b"unaligned, across words"));
        let mut out = [0u8; 64];
        assert!(load_bytes_at(words, 0, &mut out));
        let mut want = [0xaau8; 64];
        want[3..26].copy_from_slice(b"unaligned, across words");
        assert_eq!(out, want);
        // Within one word.
        assert!(store_bytes_at(words, 33, b"ab"));
        let mut two = [0u8; 4];
        assert!(load_bytes_at(words, 32, &mut two));
        assert_eq!(two, [0xaa, b'a', b'b', 0xaa]);
        // Past the end: refused, nothing stored.
        let len = r.len();
        assert!(!store_bytes_at(words, len - 2, b"abc"));
        assert!(!load_bytes_at(words, len - 2, &mut [0u8; 3]));
        assert!(!store_bytes_at(words, usize::MAX, b"a"));
        assert!(store_bytes_at(words, len - 3, b"abc"));
    }

    #[test]
    fn released_bytes_read_as_zeros_and_the_rest_stays() {
        let r = SharedRegion::create("test-region-release", 4 * 4096).unwrap();
        let words = r.words();
        assert!(store_bytes_at(words, 0, &[7u8; 4 * 4096]));
        // From the middle of page 0 to the middle of page 3: page 0's tail
        // and page 3's head zeroed, pages 1 and 2 punched.
        r.release(100, 3 * 4096).unwrap();
        // A range inside one word zeroes nothing (no whole word), and
        // ranges past the end are cut to it.
        r.release(4097, 3).unwrap();
        r.release(r.len() - 1, 100).unwrap();
        let mut all = vec![0u8; 4 * 4096];
        assert!(load_bytes_at(words, 0, &mut all));
        assert!(all[..96].iter().all(|&b| b == 7), "before the range");
        assert!(
            all[104..3 * 4096 + 96].iter().all(|&b| b == 0),
            "inside the range"
        );
        assert!(all[3 * 4096 + 104..].iter().all(|&b| b == 7), "after the range");
    }

    #[test]
    fn a_file_that_is_no_region_is_refused() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert!(SharedRegion::from_fd(f.into()).is_err());
    }
}

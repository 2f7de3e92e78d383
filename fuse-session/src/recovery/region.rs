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
    fn a_file_that_is_no_region_is_refused() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert!(SharedRegion::from_fd(f.into()).is_err());
    }
}

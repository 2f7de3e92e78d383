//! Page-aligned buffers: the workers' receive buffers and the scratch buffer
//! of [`crate::reply::ReplyData::with_buffer`].
//!
//! A receive buffer is placed so that the payload of a WRITE (after the
//! 40-byte `fuse_in_header` and the 40-byte `fuse_write_in`) starts on a page
//! boundary: a filesystem can then hand the borrowed data straight to an
//! `O_DIRECT` write of its backing file, without copying it into an aligned
//! buffer first.

use std::mem::size_of;

/// The alignment `O_DIRECT` needs on every Linux filesystem we meet.
pub(crate) const PAGE: usize = 4096;

/// Where a WRITE's data starts in a request (protocol 7.9 and later).
pub(crate) const WRITE_PAYLOAD_OFFSET: usize =
    size_of::<fuse_proto::abi::InHeader>() + size_of::<fuse_proto::abi::WriteIn>();

/// A byte buffer of fixed length whose byte `skew` is page-aligned.
pub(crate) struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes; byte `skew` of the result lies on a page boundary.
    pub(crate) fn new(len: usize, skew: usize) -> Self {
        let raw = vec![0u8; len + PAGE];
        let addr = raw.as_ptr() as usize + skew % PAGE;
        let start = (PAGE - addr % PAGE) % PAGE;
        Self { raw, start, len }
    }

    /// A receive buffer of `len` bytes for a worker, its pages faulted in.
    ///
    /// The kernel copies a request into the buffer through
    /// `get_user_pages`; for a page not yet faulted in it takes the slow
    /// path, which gives up when a fatal signal is pending, and the kernel
    /// then ends the request it was copying with `EIO`
    /// (`fuse_dev_do_read`). So a daemon killed while one of its workers
    /// reads (under a keeper: any crash) would fail that client's request,
    /// where a request in a faulted-in buffer is copied whole and sent
    /// again to the successor. The pages are written once here, so they
    /// are present from the start.
    pub(crate) fn receive(len: usize) -> Self {
        let mut b = Self::new(len, WRITE_PAYLOAD_OFFSET);
        for i in (0..b.raw.len()).step_by(PAGE) {
            // SAFETY: `i` is within `raw`; a volatile write, so that the
            // store is not left out as one of a zero into zeroed memory.
            unsafe { std::ptr::write_volatile(b.raw.as_mut_ptr().add(i), 0) };
        }
        b
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }

    /// Grows (rarely) to at least `len` bytes, keeping the alignment of byte 0.
    pub(crate) fn ensure(&mut self, len: usize) {
        if self.len < len {
            *self = Self::new(len, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_payload_is_page_aligned() {
        for len in [8192, 1 << 20, 1 << 20 | 4096] {
            let mut b = AlignedBuf::receive(len);
            assert_eq!(b.len(), len);
            let s = b.as_mut_slice();
            assert_eq!(s.len(), len);
            assert_eq!(s[WRITE_PAYLOAD_OFFSET..].as_ptr() as usize % PAGE, 0);
        }
    }

    #[test]
    fn scratch_start_is_page_aligned() {
        let mut b = AlignedBuf::new(100, 0);
        assert_eq!(b.as_mut_slice().as_ptr() as usize % PAGE, 0);
        b.ensure(10_000);
        assert!(b.len() >= 10_000);
        assert_eq!(b.as_mut_slice().as_ptr() as usize % PAGE, 0);
    }
}

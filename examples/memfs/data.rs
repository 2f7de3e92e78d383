//! What memfs keeps per file and per directory: sparse file contents in
//! chunks, and directory entries with stable readdir cookies.

use std::collections::{BTreeMap, HashMap};

/// Contents are stored in chunks of this size (the last bytes of a chunk may
/// be missing: they read as zeros). A chunk that does not exist is a hole.
pub const CHUNK: u64 = 64 * 1024;

/// The contents of a regular file.
///
/// Invariant: every stored byte at or beyond `size` is zero, so growing the
/// file (by truncate or by a write past the end) never exposes old data.
#[derive(Default)]
pub struct FileData {
    size: u64,
    chunks: BTreeMap<u64, Vec<u8>>,
    /// Bytes held by `chunks` (for `st_blocks`).
    allocated: u64,
}

impl FileData {
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes of memory backing the file.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Copies the bytes at `offset` into `out`, up to the end of the file;
    /// returns how many were copied. Holes read as zeros.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> usize {
        // Nothing to copy: also keeps the chunk range below from ending
        // before it starts.
        if offset >= self.size || out.is_empty() {
            return 0;
        }
        let n = (self.size - offset).min(out.len() as u64) as usize;
        let out = &mut out[..n];
        out.fill(0);
        let end = offset + n as u64;
        for (&idx, chunk) in self.chunks.range(offset / CHUNK..=(end - 1) / CHUNK) {
            let base = idx * CHUNK;
            let from = offset.max(base);
            let to = end.min(base + chunk.len() as u64);
            if from < to {
                let src = &chunk[(from - base) as usize..(to - base) as usize];
                out[(from - offset) as usize..(to - offset) as usize].copy_from_slice(src);
            }
        }
        n
    }

    /// Writes `data` at `offset`, extending the file (the gap reads as zeros).
    /// The caller checks that `offset + data.len()` does not overflow.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let end = offset + data.len() as u64;
        let mut pos = offset;
        while pos < end {
            let idx = pos / CHUNK;
            let base = idx * CHUNK;
            let to = end.min(base + CHUNK);
            let chunk = self.chunks.entry(idx).or_default();
            let need = (to - base) as usize;
            if chunk.len() < need {
                self.allocated += (need - chunk.len()) as u64;
                chunk.resize(need, 0);
            }
            chunk[(pos - base) as usize..need]
                .copy_from_slice(&data[(pos - offset) as usize..(to - offset) as usize]);
            pos = to;
        }
        self.size = self.size.max(end);
    }

    /// How much of a write of `len` bytes at `offset` fits in `budget` new
    /// bytes of memory, and what that part costs: `(bytes, cost)`. Writing
    /// into a chunk first backs it up to the written end, so the cost of a
    /// prefix only grows with its length; the answer is the longest prefix
    /// whose cost is at most `budget` (the whole write when it fits).
    pub fn fit(&self, offset: u64, len: u64, budget: u64) -> (u64, u64) {
        let end = offset.saturating_add(len);
        let (mut pos, mut cost) = (offset, 0u64);
        while pos < end {
            let idx = pos / CHUNK;
            let base = idx * CHUNK;
            let to = end.min(base + CHUNK);
            let have = self.chunks.get(&idx).map_or(0, |c| c.len() as u64);
            let extra = (to - base).saturating_sub(have);
            if cost + extra > budget {
                // The chunk can grow to `base + have + what is left`.
                let reach = base + have + (budget - cost);
                if reach > pos {
                    cost = budget;
                    pos = reach;
                }
                break;
            }
            cost += extra;
            pos = to;
        }
        (pos - offset, cost)
    }

    /// Sets the size; shrinking drops the bytes past the new end.
    pub fn truncate(&mut self, size: u64) {
        if size < self.size {
            let first_gone = size.div_ceil(CHUNK);
            for (_, chunk) in self.chunks.split_off(&first_gone) {
                self.allocated -= chunk.len() as u64;
            }
            if !size.is_multiple_of(CHUNK)
                && let Some(chunk) = self.chunks.get_mut(&(size / CHUNK))
            {
                let keep = (size % CHUNK) as usize;
                if chunk.len() > keep {
                    self.allocated -= (chunk.len() - keep) as u64;
                    chunk.truncate(keep);
                }
            }
        }
        self.size = size;
    }

    /// Backs `[offset, offset + len)` with memory (fallocate mode 0 or
    /// KEEP_SIZE); with `extend`, the file grows to cover the range.
    pub fn allocate(&mut self, offset: u64, len: u64, extend: bool) {
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let idx = pos / CHUNK;
            let base = idx * CHUNK;
            let to = end.min(base + CHUNK);
            let chunk = self.chunks.entry(idx).or_default();
            let need = (to - base) as usize;
            if chunk.len() < need {
                self.allocated += (need - chunk.len()) as u64;
                chunk.resize(need, 0);
            }
            pos = to;
        }
        if extend {
            self.size = self.size.max(end);
        }
    }

    /// Zeroes `[offset, offset + len)` and frees the chunks it covers
    /// entirely (fallocate PUNCH_HOLE); the size does not change.
    pub fn punch_hole(&mut self, offset: u64, len: u64) {
        let end = offset.saturating_add(len);
        if len == 0 {
            return;
        }
        let idxs: Vec<u64> = self
            .chunks
            .range(offset / CHUNK..=(end - 1) / CHUNK)
            .map(|(&i, _)| i)
            .collect();
        for idx in idxs {
            let base = idx * CHUNK;
            if offset <= base && end >= base + CHUNK {
                if let Some(chunk) = self.chunks.remove(&idx) {
                    self.allocated -= chunk.len() as u64;
                }
            } else if let Some(chunk) = self.chunks.get_mut(&idx) {
                let from = (offset.max(base) - base) as usize;
                let to = ((end.min(base + CHUNK) - base) as usize).min(chunk.len());
                if from < to {
                    chunk[from..to].fill(0);
                }
            }
        }
    }

    /// SEEK_DATA: the first offset at or after `offset` inside a chunk, or
    /// `None` (ENXIO) when there is no data there before the end of the file.
    pub fn seek_data(&self, offset: u64) -> Option<u64> {
        if offset >= self.size {
            return None;
        }
        let (&idx, _) = self.chunks.range(offset / CHUNK..).next()?;
        let pos = offset.max(idx * CHUNK);
        (pos < self.size).then_some(pos)
    }

    /// SEEK_HOLE: the first offset at or after `offset` that is in no chunk,
    /// or the end of the file (which counts as a hole); `None` (ENXIO) when
    /// `offset` is at or past the end.
    pub fn seek_hole(&self, offset: u64) -> Option<u64> {
        if offset >= self.size {
            return None;
        }
        let mut idx = offset / CHUNK;
        for (&i, _) in self.chunks.range(idx..) {
            if i != idx {
                break;
            }
            idx += 1;
        }
        Some(offset.max(idx.saturating_mul(CHUNK)).min(self.size))
    }
}

/// One name in a directory.
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    /// The `S_IFMT` bits of the inode (its type never changes).
    pub kind: u32,
}

/// A directory's entries.
///
/// Each entry gets a cookie when it is added, from a counter that only
/// grows; readdir returns entries in cookie order and resumes after the
/// cookie the kernel hands back. An entry's cookie never changes while it
/// exists, so a directory listing that is interrupted by creates and
/// unlinks (or resumed with `seekdir`) neither repeats nor skips the
/// entries that stayed. Cookies 1 and 2 belong to "." and "..".
pub struct DirData {
    by_name: HashMap<Vec<u8>, u64>,
    by_cookie: BTreeMap<u64, DirEntry>,
    next_cookie: u64,
}

/// The cookie after "."; the first real entry gets the one after this.
pub const DOTDOT_COOKIE: u64 = 2;

impl Default for DirData {
    fn default() -> Self {
        Self {
            by_name: HashMap::new(),
            by_cookie: BTreeMap::new(),
            next_cookie: DOTDOT_COOKIE + 1,
        }
    }
}

impl DirData {
    pub fn get(&self, name: &[u8]) -> Option<&DirEntry> {
        self.by_name.get(name).and_then(|c| self.by_cookie.get(c))
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Adds a name that is not present.
    pub fn insert(&mut self, name: &[u8], ino: u64, kind: u32) {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.by_name.insert(name.to_vec(), cookie);
        let name = name.to_vec();
        self.by_cookie.insert(cookie, DirEntry { name, ino, kind });
    }

    /// Points an existing name at another inode, keeping its cookie.
    pub fn replace(&mut self, name: &[u8], ino: u64, kind: u32) {
        if let Some(e) = self.by_name.get(name).and_then(|c| self.by_cookie.get_mut(c)) {
            e.ino = ino;
            e.kind = kind;
        }
    }

    pub fn remove(&mut self, name: &[u8]) -> Option<DirEntry> {
        let cookie = self.by_name.remove(name)?;
        self.by_cookie.remove(&cookie)
    }

    /// Entries whose cookie is greater than `after`, in cookie order.
    pub fn after(&self, after: u64) -> impl Iterator<Item = (u64, &DirEntry)> {
        self.by_cookie
            .range(after.saturating_add(1)..)
            .map(|(&c, e)| (c, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read of 0 bytes inside the file (READ of size 0, COPY_FILE_RANGE
    /// of length 0) used to ask the chunk map for a backwards range.
    #[test]
    fn empty_reads_inside_the_file() {
        let mut f = FileData::default();
        f.write(0, &vec![1u8; 3 * CHUNK as usize]);
        for off in [0, 1, CHUNK, 2 * CHUNK] {
            assert_eq!(f.read(off, &mut []), 0);
        }
    }

    #[test]
    fn fit_is_the_longest_prefix_within_budget() {
        let mut f = FileData::default();
        f.write(0, &[1u8; 100]);
        // Overwriting costs nothing; growing chunk 0 to 150 costs 50.
        assert_eq!(f.fit(0, 150, u64::MAX), (150, 50));
        assert_eq!(f.fit(0, 150, 20), (120, 20));
        // A write at 200 must first fill 100..200 of its chunk.
        assert_eq!(f.fit(200, 10, 100), (0, 0));
        assert_eq!(f.fit(200, 10, 105), (5, 105));
        // Across chunks: the second chunk starts empty.
        assert_eq!(f.fit(CHUNK - 10, 20, u64::MAX), (20, CHUNK - 100 + 10));
    }
}

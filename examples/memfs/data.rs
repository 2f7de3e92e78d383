//! What memfs keeps per file, per directory and per inode's extended
//! attributes: sparse file contents in pages, directory entries with stable
//! readdir cookies, and attribute maps; each reports what it is charged
//! (see `capacity.rs`), in constant time.

use super::capacity::{DIRENT_COST, MAP_COST, PAGE, PAGE_COST, XATTR_COST};
use super::keep::{Dec, Enc, bad};
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::sync::Arc;

/// Bytes in a page, as an index.
const PAGE_LEN: usize = PAGE as usize;

/// A page of file contents: always `PAGE` bytes long.
type Page = Box<[u8]>;

fn new_page() -> Page {
    // Zeroed by the allocator (calloc), which skips the work for fresh memory.
    vec![0u8; PAGE_LEN].into_boxed_slice()
}

/// The contents of a regular file, a page at a time. A page that does not
/// exist is a hole; a page is allocated when a write or fallocate first
/// touches it, as tmpfs does.
///
/// Invariant: every stored byte at or beyond `size` is zero, so growing the
/// file (by truncate or by a write past the end) never exposes old data.
#[derive(Default)]
pub struct FileData {
    size: u64,
    pages: BTreeMap<u64, Page>,
}

impl FileData {
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Pages of memory backing the file.
    pub fn pages(&self) -> u64 {
        self.pages.len() as u64
    }

    /// What the contents are charged (see `capacity.rs`).
    pub fn cost(&self) -> u64 {
        cost_with_pages(self.pages())
    }

    /// Pages a write or allocation of `[offset, offset + len)` would add.
    pub fn new_pages(&self, offset: u64, len: u64) -> u64 {
        if len == 0 {
            return 0;
        }
        let (first, last) = (offset / PAGE, (offset + len - 1) / PAGE);
        let present = self.pages.range(first..=last).count() as u64;
        last - first + 1 - present
    }

    /// The longest prefix of a write of `len` bytes at `offset` that adds
    /// at most `budget` pages: the whole write when it fits, otherwise up
    /// to the first page that would pass the budget (as tmpfs, which stops
    /// a write at the first page it cannot allocate).
    pub fn fit(&self, offset: u64, len: u64, budget: u64) -> u64 {
        if len == 0 {
            return 0;
        }
        let end = offset + len;
        let mut added = 0;
        let mut page = offset / PAGE;
        while page * PAGE < end {
            if !self.pages.contains_key(&page) {
                if added == budget {
                    return (page * PAGE).saturating_sub(offset);
                }
                added += 1;
            }
            page += 1;
        }
        len
    }

    /// Copies the bytes at `offset` into `out`, up to the end of the file;
    /// returns how many were copied. Holes read as zeros.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> usize {
        // Nothing to copy: also keeps the page range below from ending
        // before it starts.
        if offset >= self.size || out.is_empty() {
            return 0;
        }
        let n = (self.size - offset).min(out.len() as u64) as usize;
        let out = &mut out[..n];
        let end = offset + n as u64;
        let mut pos = offset;
        for (&idx, page) in self.pages.range(offset / PAGE..=(end - 1) / PAGE) {
            let base = idx * PAGE;
            let from = offset.max(base);
            let to = end.min(base + PAGE);
            // The hole before this page.
            out[(pos - offset) as usize..(from - offset) as usize].fill(0);
            let src = &page[(from - base) as usize..(to - base) as usize];
            out[(from - offset) as usize..(to - offset) as usize].copy_from_slice(src);
            pos = to;
        }
        out[(pos - offset) as usize..].fill(0);
        n
    }

    /// Writes `data` at `offset`, extending the file (the gap reads as
    /// zeros). The caller checks that `offset + data.len()` does not
    /// overflow, and has charged the pages it adds.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let end = offset + data.len() as u64;
        let mut pos = offset;
        while pos < end {
            let idx = pos / PAGE;
            let base = idx * PAGE;
            let to = end.min(base + PAGE);
            let page = self.pages.entry(idx).or_insert_with(new_page);
            page[(pos - base) as usize..(to - base) as usize]
                .copy_from_slice(&data[(pos - offset) as usize..(to - offset) as usize]);
            pos = to;
        }
        self.size = self.size.max(end);
    }

    /// Sets the size; shrinking drops the pages past the new end and zeroes
    /// the rest of the last one.
    pub fn truncate(&mut self, size: u64) {
        if size < self.size {
            drop(self.pages.split_off(&size.div_ceil(PAGE)));
            release_if_empty(&mut self.pages);
            if !size.is_multiple_of(PAGE)
                && let Some(page) = self.pages.get_mut(&(size / PAGE))
            {
                page[(size % PAGE) as usize..].fill(0);
            }
        }
        self.size = size;
    }

    /// Backs `[offset, offset + len)` with pages (fallocate mode 0 or
    /// KEEP_SIZE); with `extend`, the file grows to cover the range. The
    /// caller has charged the pages it adds.
    pub fn allocate(&mut self, offset: u64, len: u64, extend: bool) {
        if len == 0 {
            return;
        }
        let end = offset + len;
        for idx in offset / PAGE..=(end - 1) / PAGE {
            self.pages.entry(idx).or_insert_with(new_page);
        }
        if extend {
            self.size = self.size.max(end);
        }
    }

    /// Zeroes `[offset, offset + len)` and frees the pages it covers
    /// entirely (fallocate PUNCH_HOLE); the size does not change.
    pub fn punch_hole(&mut self, offset: u64, len: u64) {
        let end = offset.saturating_add(len);
        if len == 0 {
            return;
        }
        // Whole pages go; the partial ones at either end are zeroed.
        let (first_whole, end_whole) = (offset.div_ceil(PAGE), end / PAGE);
        if first_whole < end_whole {
            let mut tail = self.pages.split_off(&first_whole);
            let mut rest = tail.split_off(&end_whole);
            self.pages.append(&mut rest);
            release_if_empty(&mut self.pages);
        }
        for idx in [offset / PAGE, (end - 1) / PAGE] {
            let base = idx * PAGE;
            if let Some(page) = self.pages.get_mut(&idx) {
                let from = (offset.max(base) - base) as usize;
                let to = (end.min(base.saturating_add(PAGE)) - base) as usize;
                page[from..to].fill(0);
            }
        }
    }

    /// SEEK_DATA: the first offset at or after `offset` inside a page, or
    /// `None` (ENXIO) when there is no data there before the end of the file.
    pub fn seek_data(&self, offset: u64) -> Option<u64> {
        if offset >= self.size {
            return None;
        }
        let (&idx, _) = self.pages.range(offset / PAGE..).next()?;
        let pos = offset.max(idx * PAGE);
        (pos < self.size).then_some(pos)
    }

    /// SEEK_HOLE: the first offset at or after `offset` that is in no page,
    /// or the end of the file (which counts as a hole); `None` (ENXIO) when
    /// `offset` is at or past the end.
    pub fn seek_hole(&self, offset: u64) -> Option<u64> {
        if offset >= self.size {
            return None;
        }
        let mut idx = offset / PAGE;
        for (&i, _) in self.pages.range(idx..) {
            if i != idx {
                break;
            }
            idx += 1;
        }
        Some(offset.max(idx.saturating_mul(PAGE)).min(self.size))
    }
}

/// Handing a file over to a successor (see `keep.rs`).
impl FileData {
    /// Writes the size and the pages, freeing each page once written.
    pub fn drain_into<W: Write>(&mut self, e: &mut Enc<W>) -> io::Result<()> {
        e.u64(self.size)?;
        e.u64(self.pages.len() as u64)?;
        while let Some((idx, page)) = self.pages.pop_first() {
            e.u64(idx)?;
            e.raw(&page)?;
        }
        Ok(())
    }

    /// Reads what [`drain_into`](Self::drain_into) wrote; refuses a size
    /// past `max_size`, pages out of order or past it, and stored bytes
    /// past the size that are not zero (the invariant above).
    pub fn decode<R: Read>(d: &mut Dec<R>, max_size: u64) -> io::Result<FileData> {
        let size = d.u64()?;
        if size > max_size {
            return Err(bad(format!("a file of {size} bytes")));
        }
        let n = d.count(8 + PAGE, "pages")?;
        let mut f = FileData {
            size,
            pages: BTreeMap::new(),
        };
        let mut last = None;
        for _ in 0..n {
            let idx = d.u64()?;
            if last.is_some_and(|l| idx <= l) || idx > max_size / PAGE {
                return Err(bad(format!("page {idx} out of order or out of range")));
            }
            last = Some(idx);
            let mut page = new_page();
            d.raw(&mut page)?;
            let base = idx * PAGE;
            let from = size.saturating_sub(base).min(PAGE) as usize;
            if page[from..].iter().any(|&b| b != 0) {
                return Err(bad(format!("page {idx} holds data past the end of the file")));
            }
            f.pages.insert(idx, page);
        }
        Ok(f)
    }
}

/// What a file's contents are charged with `pages` pages.
pub fn cost_with_pages(pages: u64) -> u64 {
    match pages {
        0 => 0,
        n => MAP_COST + n * PAGE_COST,
    }
}

/// One name in a directory.
#[derive(Clone, Debug)]
pub struct DirEntry {
    /// Shared with the directory's name index: one allocation per name.
    pub name: Arc<[u8]>,
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
    by_name: HashMap<Arc<[u8]>, u64>,
    by_cookie: BTreeMap<u64, DirEntry>,
    next_cookie: u64,
    /// The names' bytes, for the charge.
    name_bytes: u64,
}

/// The cookie after "."; the first real entry gets the one after this.
pub const DOTDOT_COOKIE: u64 = 2;

impl Default for DirData {
    fn default() -> Self {
        Self {
            by_name: HashMap::new(),
            by_cookie: BTreeMap::new(),
            next_cookie: DOTDOT_COOKIE + 1,
            name_bytes: 0,
        }
    }
}

/// What one entry named `name_len` bytes is charged.
pub fn dirent_cost(name_len: usize) -> u64 {
    DIRENT_COST + name_len as u64
}

/// Gives back a hash map's memory once it is mostly empty, and all of it
/// once it is empty (a map never shrinks by itself: memory freed by
/// removals would stay uncharged). Halving the capacity when a quarter is
/// used keeps the cost of resizing proportional to the changes.
pub fn shrink<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    if map.is_empty() {
        *map = HashMap::new();
    } else if map.len() * 4 <= map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}

/// Frees the root node that an emptied B-tree map keeps.
pub fn release_if_empty<K, V>(map: &mut BTreeMap<K, V>) {
    if map.is_empty() {
        *map = BTreeMap::new();
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

    /// What the entries are charged (see `capacity.rs`).
    pub fn cost(&self) -> u64 {
        match self.len() as u64 {
            0 => 0,
            n => MAP_COST + n * DIRENT_COST + self.name_bytes,
        }
    }

    /// What adding an entry named `name_len` bytes adds to [`cost`](Self::cost).
    pub fn insert_cost(&self, name_len: usize) -> u64 {
        let first = if self.is_empty() { MAP_COST } else { 0 };
        first + dirent_cost(name_len)
    }

    /// Adds a name that is not present.
    pub fn insert(&mut self, name: &[u8], ino: u64, kind: u32) {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let name: Arc<[u8]> = Arc::from(name);
        self.name_bytes += name.len() as u64;
        self.by_name.insert(name.clone(), cookie);
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
        shrink(&mut self.by_name);
        let e = self.by_cookie.remove(&cookie)?;
        release_if_empty(&mut self.by_cookie);
        self.name_bytes -= e.name.len() as u64;
        Some(e)
    }

    /// Entries whose cookie is greater than `after`, in cookie order.
    pub fn after(&self, after: u64) -> impl Iterator<Item = (u64, &DirEntry)> {
        self.by_cookie
            .range(after.saturating_add(1)..)
            .map(|(&c, e)| (c, e))
    }
}

/// Handing a directory over to a successor (see `keep.rs`).
impl DirData {
    /// Writes the next cookie and the entries in cookie order.
    pub fn encode<W: Write>(&self, e: &mut Enc<W>) -> io::Result<()> {
        e.u64(self.next_cookie)?;
        e.u64(self.by_cookie.len() as u64)?;
        for (&cookie, entry) in &self.by_cookie {
            e.u64(cookie)?;
            e.u64(entry.ino)?;
            e.u32(entry.kind)?;
            e.bytes(&entry.name)?;
        }
        Ok(())
    }

    /// Reads what [`encode`](Self::encode) wrote, with the same cookies;
    /// refuses cookies out of order or not below the next one, and names
    /// that are not valid or not unique.
    pub fn decode<R: Read>(d: &mut Dec<R>) -> io::Result<DirData> {
        let next_cookie = d.u64()?;
        if next_cookie <= DOTDOT_COOKIE {
            return Err(bad(format!("a directory's next cookie is {next_cookie}")));
        }
        let n = d.count(24, "directory entries")?;
        let mut dir = DirData {
            next_cookie,
            ..DirData::default()
        };
        let mut last = DOTDOT_COOKIE;
        for _ in 0..n {
            let cookie = d.u64()?;
            let ino = d.u64()?;
            let kind = d.u32()?;
            let name = d.bytes(255, "a name")?;
            if cookie <= last || cookie >= next_cookie {
                return Err(bad(format!("cookie {cookie} out of order (next {next_cookie})")));
            }
            last = cookie;
            if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
                return Err(bad(format!("the name {:?}", String::from_utf8_lossy(&name))));
            }
            let name: Arc<[u8]> = Arc::from(name);
            if dir.by_name.insert(name.clone(), cookie).is_some() {
                return Err(bad(format!(
                    "the name {:?} twice",
                    String::from_utf8_lossy(&name)
                )));
            }
            dir.name_bytes += name.len() as u64;
            dir.by_cookie.insert(cookie, DirEntry { name, ino, kind });
        }
        Ok(dir)
    }
}

/// An inode's extended attributes.
#[derive(Default)]
pub struct Xattrs {
    map: BTreeMap<Box<[u8]>, Box<[u8]>>,
    /// Names' and values' bytes, for the charge.
    bytes: u64,
}

impl Xattrs {
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.map.get(name).map(|v| &v[..])
    }

    pub fn contains(&self, name: &[u8]) -> bool {
        self.map.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &[u8]> {
        self.map.keys().map(|k| &k[..])
    }

    /// What the attributes are charged (see `capacity.rs`).
    pub fn cost(&self) -> u64 {
        match self.map.len() as u64 {
            0 => 0,
            n => MAP_COST + n * XATTR_COST + self.bytes,
        }
    }

    /// What [`cost`](Self::cost) would be with `name` set to a value of
    /// `value_len` bytes.
    pub fn cost_with(&self, name: &[u8], value_len: usize) -> u64 {
        let new = XATTR_COST + (name.len() + value_len) as u64;
        match self.map.get(name) {
            Some(old) => self.cost() - old.len() as u64 + value_len as u64,
            None if self.map.is_empty() => MAP_COST + new,
            None => self.cost() + new,
        }
    }

    pub fn set(&mut self, name: &[u8], value: &[u8]) {
        self.bytes += value.len() as u64;
        match self.map.get_mut(name) {
            Some(v) => {
                self.bytes -= v.len() as u64;
                *v = value.into();
            }
            None => {
                self.bytes += name.len() as u64;
                self.map.insert(name.into(), value.into());
            }
        }
    }

    /// Writes the attributes, in name order.
    pub fn encode<W: Write>(&self, e: &mut Enc<W>) -> io::Result<()> {
        e.u64(self.map.len() as u64)?;
        for (k, v) in &self.map {
            e.bytes(k)?;
            e.bytes(v)?;
        }
        Ok(())
    }

    /// Reads what [`encode`](Self::encode) wrote; refuses names out of
    /// order (or twice), empty or too long, and values too long.
    pub fn decode<R: Read>(d: &mut Dec<R>) -> io::Result<Xattrs> {
        let n = d.count(8, "extended attributes")?;
        let mut x = Xattrs::default();
        for _ in 0..n {
            let name = d.bytes(255, "an extended attribute's name")?;
            let value = d.bytes(64 << 10, "an extended attribute's value")?;
            if name.is_empty() || x.map.last_key_value().is_some_and(|(k, _)| **k >= *name) {
                return Err(bad("extended attribute names out of order"));
            }
            x.set(&name, &value);
        }
        Ok(x)
    }

    /// Removes `name`; whether it was there.
    pub fn remove(&mut self, name: &[u8]) -> bool {
        match self.map.remove(name) {
            Some(v) => {
                self.bytes -= (name.len() + v.len()) as u64;
                release_if_empty(&mut self.map);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read of 0 bytes inside the file (READ of size 0, COPY_FILE_RANGE
    /// of length 0) used to ask the page map for a backwards range.
    #[test]
    fn empty_reads_inside_the_file() {
        let mut f = FileData::default();
        f.write(0, &vec![1u8; 3 * PAGE_LEN]);
        for off in [0, 1, PAGE, 2 * PAGE] {
            assert_eq!(f.read(off, &mut []), 0);
        }
    }

    #[test]
    fn sparse_writes_take_one_page_each() {
        let mut f = FileData::default();
        for i in 0..10 {
            assert_eq!(f.new_pages(i * 128 * 1024, 1), 1);
            f.write(i * 128 * 1024, b"x");
        }
        assert_eq!(f.pages(), 10);
        assert_eq!(f.cost(), MAP_COST + 10 * PAGE_COST);
        let mut buf = vec![7u8; 128 * 1024 + 1];
        assert_eq!(f.read(0, &mut buf), buf.len());
        assert_eq!(
            (buf[0], buf[1], buf[PAGE_LEN], buf[128 * 1024]),
            (b'x', 0, 0, b'x')
        );
        assert_eq!(buf.iter().filter(|&&b| b != 0).count(), 2);
        // Overwriting costs nothing; a write across a page boundary into
        // a hole costs the pages it touches.
        assert_eq!(f.new_pages(0, PAGE), 0);
        assert_eq!(f.new_pages(PAGE - 1, 2), 1);
        assert_eq!(f.new_pages(0, 128 * 1024 + 1), 31);
    }

    #[test]
    fn fit_stops_at_the_first_page_past_the_budget() {
        let mut f = FileData::default();
        f.write(0, &[1u8; 100]);
        // Page 0 is there: anything within it fits without a new page.
        assert_eq!(f.fit(0, PAGE, 0), PAGE);
        // Into page 1 and 2: the budget decides how many.
        assert_eq!(f.fit(10, 2 * PAGE, 0), PAGE - 10);
        assert_eq!(f.fit(10, 2 * PAGE, 1), 2 * PAGE - 10);
        assert_eq!(f.fit(10, 2 * PAGE, 2), 2 * PAGE);
        // A write starting in a hole gets nothing without a page.
        assert_eq!(f.fit(PAGE + 5, 10, 0), 0);
        assert_eq!(f.fit(PAGE + 5, 10, 1), 10);
    }

    #[test]
    fn truncate_punch_and_seek_work_in_pages() {
        let mut f = FileData::default();
        f.write(0, &vec![9u8; 4 * PAGE_LEN]);
        f.punch_hole(PAGE / 2, 2 * PAGE);
        // Page 1 is gone; pages 0 and 2 are zeroed in part.
        assert_eq!(f.pages(), 3);
        assert_eq!(f.seek_hole(0), Some(PAGE));
        assert_eq!(f.seek_data(PAGE), Some(2 * PAGE));
        let mut buf = vec![0u8; 4 * PAGE_LEN];
        f.read(0, &mut buf);
        let nines = buf.iter().filter(|&&b| b == 9).count() as u64;
        assert_eq!(nines, 4 * PAGE - 2 * PAGE);
        assert_eq!(buf[PAGE_LEN / 2 - 1], 9);
        assert_eq!(buf[PAGE_LEN / 2], 0);
        assert_eq!(buf[5 * PAGE_LEN / 2], 9);
        // Shrinking drops whole pages and zeroes the tail of the last one,
        // so growing again shows zeros.
        f.truncate(PAGE + 1);
        assert_eq!(f.pages(), 1);
        f.truncate(PAGE / 4);
        f.truncate(PAGE);
        let mut page = vec![1u8; PAGE_LEN];
        f.read(0, &mut page);
        assert!(page[PAGE_LEN / 4..].iter().all(|&b| b == 0));
        assert_eq!(f.seek_hole(0), Some(PAGE));
        f.truncate(0);
        assert_eq!((f.pages(), f.cost()), (0, 0));
    }

    #[test]
    fn directory_and_xattr_costs_follow_their_contents() {
        let mut d = DirData::default();
        assert_eq!(d.cost(), 0);
        assert_eq!(d.insert_cost(3), MAP_COST + dirent_cost(3));
        d.insert(b"abc", 5, libc::S_IFREG);
        assert_eq!(d.cost(), MAP_COST + dirent_cost(3));
        assert_eq!(d.insert_cost(10), dirent_cost(10));
        d.insert(b"0123456789", 6, libc::S_IFREG);
        assert_eq!(d.cost(), MAP_COST + dirent_cost(3) + dirent_cost(10));
        assert_eq!(d.remove(b"abc").map(|e| e.ino), Some(5));
        assert_eq!(d.cost(), MAP_COST + dirent_cost(10));
        d.remove(b"0123456789");
        assert_eq!(d.cost(), 0);

        let mut x = Xattrs::default();
        assert_eq!(x.cost_with(b"user.a", 10), MAP_COST + XATTR_COST + 16);
        x.set(b"user.a", &[1; 10]);
        assert_eq!(x.cost(), MAP_COST + XATTR_COST + 16);
        assert_eq!(x.cost_with(b"user.a", 2), MAP_COST + XATTR_COST + 8);
        x.set(b"user.a", &[1; 2]);
        assert_eq!(x.cost(), MAP_COST + XATTR_COST + 8);
        assert_eq!(x.cost_with(b"user.bb", 0), x.cost() + XATTR_COST + 7);
        assert!(x.remove(b"user.a"));
        assert!(!x.remove(b"user.a"));
        assert_eq!(x.cost(), 0);
    }
}

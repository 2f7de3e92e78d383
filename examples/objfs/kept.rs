//! What objfs keeps outside its process: the names behind the node ids the
//! kernel holds, and the bytes of every upload not sent yet, in one
//! shared region (`fuse_wire::session::region`). Under a keeper the
//! region is the vault's, so a successor finds both as the dead daemon
//! left them; alone, it is a memory file of this process.
//!
//! Layout, in 8-byte words:
//!
//! - a header: magic, then the three sizes it was made with (nodes,
//!   staging slots, bytes a slot holds), refused if they differ;
//! - node slots: a state word, the name's length, then the name (255
//!   bytes at most). Node id = `generation << 32 | (slot + 2)`: a slot
//!   given again gets a new generation and so a new node id, so an id the
//!   kernel still holds for a removed object never names another one
//!   (it answers ESTALE);
//! - staging slots: a state word, the node id, the staged length, flags;
//!   file handle = `generation << 32 | (slot + 1)`;
//! - the staged bytes, `max_object` per staging slot.
//!
//! A state word is `generation << 2 | tag`: tag 0 vacant, 1 live, 2
//! claimed (being written). A slot claimed by a daemon that died before it
//! went live is vacant again for the successor. Only the state word is
//! raced for (compare-and-swap); the other words of a slot are written by
//! whoever holds it.

use fuse_wire::session::region::{SharedRegion, load_bytes_at, store_bytes_at};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::*};

const MAGIC: u64 = u64::from_le_bytes(*b"OBJFS-K1");
const HEADER: usize = 8;
const NAME_MAX: usize = 255;
const NODE_WORDS: usize = 2 + NAME_MAX.div_ceil(8) + 1;
const STAGE_WORDS: usize = 4;

const VACANT: u64 = 0;
const LIVE: u64 = 1;
const CLAIMED: u64 = 2;

/// A staged upload was written to since it was last sent.
pub const WRITTEN: u64 = 1;
/// A staged upload differs from the object (written or truncated).
pub const DIRTY: u64 = 2;

/// The sizes of the tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    pub nodes: usize,
    pub staging: usize,
    pub max_object: usize,
}

impl Sizes {
    /// Bytes of the region these sizes need.
    pub fn bytes(&self) -> usize {
        (HEADER + self.nodes * NODE_WORDS + self.staging * STAGE_WORDS) * 8
            + self.staging * self.max_object.next_multiple_of(8)
    }
}

/// The tables, over a region.
pub struct Kept {
    region: SharedRegion,
    sizes: Sizes,
}

/// A staged upload's words, as loaded.
#[derive(Clone, Copy, Debug)]
pub struct Staged {
    pub node: u64,
    pub len: u64,
    pub flags: u64,
}

impl Kept {
    /// Tables over `region`: new ones (`fresh`), or those a predecessor
    /// left, which must carry the magic and the same sizes: a blank or
    /// different region is refused, never taken for new (it would give the
    /// node ids the kernel holds to other objects).
    pub fn open(region: SharedRegion, sizes: Sizes, fresh: bool) -> io::Result<Kept> {
        if region.len() < sizes.bytes() {
            return Err(bad("the kept region is smaller than the tables need"));
        }
        let kept = Kept { region, sizes };
        let w = kept.region.words();
        let header = [
            MAGIC,
            sizes.nodes as u64,
            sizes.staging as u64,
            sizes.max_object as u64,
        ];
        if fresh {
            kept.region.clear();
            for (i, v) in header.iter().enumerate() {
                w[i].store(*v, Release);
            }
            return Ok(kept);
        }
        let found: Vec<u64> = (0..4).map(|i| w[i].load(Acquire)).collect();
        if found[0] != MAGIC {
            return Err(bad(
                "the kept tables are blank or not objfs's: the node ids the kernel holds cannot be resolved",
            ));
        }
        if found[1..] != header[1..] {
            return Err(bad(format!(
                "the kept tables were made for nodes={} staging={} max_object={}: start with those",
                found[1], found[2], found[3]
            )));
        }
        // Slots a dead daemon claimed but never made live are free again.
        for i in 0..sizes.nodes {
            release_claim(kept.node_state(i));
        }
        for k in 0..sizes.staging {
            release_claim(kept.stage_state(k));
        }
        Ok(kept)
    }

    fn words(&self) -> &[AtomicU64] {
        self.region.words()
    }

    fn node_base(&self, i: usize) -> usize {
        HEADER + i * NODE_WORDS
    }

    fn node_state(&self, i: usize) -> &AtomicU64 {
        &self.words()[self.node_base(i)]
    }

    fn stage_base(&self, k: usize) -> usize {
        HEADER + self.sizes.nodes * NODE_WORDS + k * STAGE_WORDS
    }

    fn stage_state(&self, k: usize) -> &AtomicU64 {
        &self.words()[self.stage_base(k)]
    }

    fn data_offset(&self, k: usize) -> usize {
        (HEADER + self.sizes.nodes * NODE_WORDS + self.sizes.staging * STAGE_WORDS) * 8
            + k * self.sizes.max_object.next_multiple_of(8)
    }

    pub fn max_object(&self) -> usize {
        self.sizes.max_object
    }

    // ---- nodes ----

    /// A new node for `name`: its id. `None` when every slot is taken.
    pub fn add_node(&self, name: &[u8]) -> Option<u64> {
        let i = claim(self.sizes.nodes, |i| self.node_state(i))?;
        let (base, generation) = (self.node_base(i), self.node_state(i).load(Acquire) >> 2);
        self.write_name(base, name);
        self.node_state(i).store(generation << 2 | LIVE, Release);
        Some(generation << 32 | (i as u64 + 2))
    }

    fn write_name(&self, base: usize, name: &[u8]) {
        let w = self.words();
        w[base + 1].store(name.len() as u64, Relaxed);
        store_bytes_at(&w[base + 2..base + NODE_WORDS], 0, name);
    }

    fn node_slot(&self, id: u64) -> Option<usize> {
        let i = usize::try_from((id & 0xffff_ffff).checked_sub(2)?).ok()?;
        (i < self.sizes.nodes && self.node_state(i).load(Acquire) == (id >> 32) << 2 | LIVE).then_some(i)
    }

    /// The name of node `id`, or `None` if it names nothing now (ESTALE).
    pub fn name(&self, id: u64) -> Option<Vec<u8>> {
        let base = self.node_base(self.node_slot(id)?);
        let w = self.words();
        let len = (w[base + 1].load(Relaxed) as usize).min(NAME_MAX);
        let mut name = vec![0; len];
        load_bytes_at(&w[base + 2..base + NODE_WORDS], 0, &mut name);
        Some(name)
    }

    /// Gives node `id` a new name (a rename). The name is rewritten with
    /// the slot claimed: a daemon dying halfway leaves it vacant (the id
    /// answers ESTALE), never a torn name.
    pub fn rename_node(&self, id: u64, name: &[u8]) -> bool {
        let Some(i) = self.node_slot(id) else {
            return false;
        };
        let generation = id >> 32;
        if self
            .node_state(i)
            .compare_exchange(generation << 2 | LIVE, generation << 2 | CLAIMED, AcqRel, Acquire)
            .is_err()
        {
            return false;
        }
        self.write_name(self.node_base(i), name);
        self.node_state(i).store(generation << 2 | LIVE, Release);
        true
    }

    /// Node `id` names nothing any more (its object was removed).
    pub fn remove_node(&self, id: u64) {
        if let Some(i) = self.node_slot(id) {
            let generation = id >> 32;
            let _ = self.node_state(i).compare_exchange(
                generation << 2 | LIVE,
                generation << 2 | VACANT,
                AcqRel,
                Acquire,
            );
        }
    }

    /// Every live node: (id, name).
    pub fn nodes(&self) -> Vec<(u64, Vec<u8>)> {
        (0..self.sizes.nodes)
            .filter_map(|i| {
                let s = self.node_state(i).load(Acquire);
                let id = (s >> 2) << 32 | (i as u64 + 2);
                (s & 3 == LIVE).then(|| self.name(id).map(|n| (id, n))).flatten()
            })
            .collect()
    }

    // ---- staged uploads ----

    /// A new staged upload for node `node`, empty: its file handle.
    pub fn add_staged(&self, node: u64) -> Option<u64> {
        let k = claim(self.sizes.staging, |k| self.stage_state(k))?;
        let (base, generation) = (self.stage_base(k), self.stage_state(k).load(Acquire) >> 2);
        let w = self.words();
        w[base + 1].store(node, Relaxed);
        w[base + 2].store(0, Relaxed);
        w[base + 3].store(0, Relaxed);
        self.stage_state(k).store(generation << 2 | LIVE, Release);
        Some(generation << 32 | (k as u64 + 1))
    }

    fn stage_slot(&self, fh: u64) -> Option<usize> {
        let k = usize::try_from((fh & 0xffff_ffff).checked_sub(1)?).ok()?;
        (k < self.sizes.staging && self.stage_state(k).load(Acquire) == (fh >> 32) << 2 | LIVE).then_some(k)
    }

    /// The staged upload of file handle `fh`, if it is one.
    pub fn staged(&self, fh: u64) -> Option<Staged> {
        let base = self.stage_base(self.stage_slot(fh)?);
        let w = self.words();
        Some(Staged {
            node: w[base + 1].load(Relaxed),
            len: w[base + 2].load(Acquire),
            flags: w[base + 3].load(Acquire),
        })
    }

    /// Every live staged upload: (file handle, what it holds).
    pub fn all_staged(&self) -> Vec<(u64, Staged)> {
        (0..self.sizes.staging)
            .filter_map(|k| {
                let s = self.stage_state(k).load(Acquire);
                let fh = (s >> 2) << 32 | (k as u64 + 1);
                (s & 3 == LIVE)
                    .then(|| self.staged(fh).map(|st| (fh, st)))
                    .flatten()
            })
            .collect()
    }

    /// Stores `data` at `offset` of upload `fh`; marks it written.
    /// `EFBIG` past `max_object`, `EBADF` for no live upload.
    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<(), libc::c_int> {
        let k = self.stage_slot(fh).ok_or(libc::EBADF)?;
        let end = offset.checked_add(data.len() as u64).ok_or(libc::EFBIG)?;
        if end > self.sizes.max_object as u64 {
            return Err(libc::EFBIG);
        }
        let at = self.data_offset(k) + offset as usize;
        if !store_bytes_at(self.words(), at, data) {
            return Err(libc::EIO);
        }
        let base = self.stage_base(k);
        self.words()[base + 2].fetch_max(end, AcqRel);
        self.words()[base + 3].fetch_or(WRITTEN | DIRTY, AcqRel);
        Ok(())
    }

    /// Sets the length of upload `fh` (a truncate, or the object's bytes
    /// loaded at open); bytes past a shorter length read as zeros if it
    /// grows again.
    pub fn set_len(&self, fh: u64, len: u64, flags: u64) -> Result<(), libc::c_int> {
        let k = self.stage_slot(fh).ok_or(libc::EBADF)?;
        if len > self.sizes.max_object as u64 {
            return Err(libc::EFBIG);
        }
        let base = self.stage_base(k);
        let old = self.words()[base + 2].swap(len, AcqRel);
        if old > len {
            let at = self.data_offset(k) + len as usize;
            // The word the new end falls in is zeroed by hand: a release
            // clears whole words only.
            let head = ((8 - len % 8) % 8).min(old - len) as usize;
            store_bytes_at(self.words(), at, &[0; 8][..head]);
            let _ = self.region.release(at, (old - len) as usize);
        }
        self.words()[base + 3].fetch_or(flags, AcqRel);
        Ok(())
    }

    /// Up to `size` bytes of upload `fh` from `offset`.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Option<Vec<u8>> {
        let k = self.stage_slot(fh)?;
        let len = self.words()[self.stage_base(k) + 2].load(Acquire);
        let start = offset.min(len);
        let mut out = vec![0; (len - start).min(u64::from(size)) as usize];
        load_bytes_at(self.words(), self.data_offset(k) + start as usize, &mut out);
        Some(out)
    }

    /// Clears `flags` of upload `fh` (it was sent).
    pub fn clear_flags(&self, fh: u64, flags: u64) {
        if let Some(k) = self.stage_slot(fh) {
            self.words()[self.stage_base(k) + 3].fetch_and(!flags, AcqRel);
        }
    }

    /// Upload `fh` is done with: its slot and its pages are free.
    pub fn remove_staged(&self, fh: u64) {
        if let Some(k) = self.stage_slot(fh) {
            let len = self.words()[self.stage_base(k) + 2].load(Acquire);
            let _ = self.region.release(self.data_offset(k), len as usize);
            let generation = fh >> 32;
            let _ = self.stage_state(k).compare_exchange(
                generation << 2 | LIVE,
                generation << 2 | VACANT,
                AcqRel,
                Acquire,
            );
        }
    }
}

/// Claims a vacant slot of `n` (the first found from a rotating start):
/// its state goes to the next generation, claimed.
fn claim<'a>(n: usize, state: impl Fn(usize) -> &'a AtomicU64) -> Option<usize> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let start = NEXT.fetch_add(1, Relaxed) as usize;
    for j in 0..n {
        let i = (start + j) % n;
        let s = state(i).load(Acquire);
        if s & 3 == VACANT
            && state(i)
                .compare_exchange(s, ((s >> 2) + 1) << 2 | CLAIMED, AcqRel, Acquire)
                .is_ok()
        {
            return Some(i);
        }
    }
    None
}

/// A slot left claimed by a dead daemon is vacant (its generation kept).
fn release_claim(state: &AtomicU64) {
    let s = state.load(Acquire);
    if s & 3 == CLAIMED {
        state.store(s & !3, Release);
    }
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes() -> Sizes {
        Sizes {
            nodes: 4,
            staging: 2,
            max_object: 100,
        }
    }

    fn kept(fresh: bool, from: Option<&Kept>) -> io::Result<Kept> {
        let region = match from {
            Some(k) => SharedRegion::from_fd(k.region.fd().try_clone_to_owned()?)?,
            None => SharedRegion::create("objfs-test", sizes().bytes())?,
        };
        Kept::open(region, sizes(), fresh)
    }

    #[test]
    fn a_successor_finds_the_names_and_staged_bytes() {
        let a = kept(true, None).unwrap();
        let id = a.add_node(b"photo.jpg").unwrap();
        let fh = a.add_staged(id).unwrap();
        a.write(fh, 3, b"bytes").unwrap();
        let b = kept(false, Some(&a)).unwrap();
        assert_eq!(b.name(id).as_deref(), Some(&b"photo.jpg"[..]));
        let st = b.staged(fh).unwrap();
        assert_eq!((st.node, st.len, st.flags), (id, 8, WRITTEN | DIRTY));
        assert_eq!(b.read(fh, 0, 100).unwrap(), b"\0\0\0bytes");
        assert_eq!(b.write(fh, 96, b"12345"), Err(libc::EFBIG));
    }

    #[test]
    fn a_removed_node_id_names_nothing_even_when_its_slot_is_given_again() {
        let k = kept(true, None).unwrap();
        let ids: Vec<u64> = (0..4)
            .map(|i| k.add_node(format!("n{i}").as_bytes()).unwrap())
            .collect();
        assert_eq!(k.add_node(b"full"), None);
        k.remove_node(ids[1]);
        let again = k.add_node(b"other").unwrap();
        assert_eq!(again & 0xffff_ffff, ids[1] & 0xffff_ffff, "the same slot");
        assert_ne!(again, ids[1], "with another node id");
        assert_eq!(k.name(ids[1]), None);
        assert_eq!(k.name(again).as_deref(), Some(&b"other"[..]));
    }

    #[test]
    fn blank_and_different_tables_are_refused() {
        let blank = kept(false, None);
        assert!(blank.err().unwrap().to_string().contains("blank"));
        let a = kept(true, None).unwrap();
        let region = SharedRegion::from_fd(a.region.fd().try_clone_to_owned().unwrap()).unwrap();
        let other = Sizes {
            staging: 1,
            ..sizes()
        };
        assert!(
            Kept::open(region, other, false)
                .err()
                .unwrap()
                .to_string()
                .contains("staging=2")
        );
    }

    #[test]
    fn a_truncated_upload_reads_zeros_where_it_grows_again() {
        let k = kept(true, None).unwrap();
        let fh = k.add_staged(7).unwrap();
        k.write(fh, 0, b"abcdef").unwrap();
        k.set_len(fh, 2, DIRTY).unwrap();
        k.write(fh, 4, b"z").unwrap();
        assert_eq!(k.read(fh, 0, 10).unwrap(), b"ab\0\0z");
        k.remove_staged(fh);
        assert!(k.staged(fh).is_none());
    }
}

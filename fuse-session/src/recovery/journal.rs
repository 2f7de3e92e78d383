//! The journal of requests in flight: what makes a request that a dead
//! daemon carried out take effect once, not twice, when the kernel sends it
//! again to the successor.
//!
//! The kernel keeps the requests a dead daemon read and did not answer, and
//! sends them again, marked, after `FUSE_NOTIFY_RESEND`
//! ([`crate::handover`]). Sending again is only safe for requests with no
//! effect or an idempotent one: a resent MKDIR that the dead daemon had done
//! would come back as EEXIST. So under a keeper every request whose effect
//! is not idempotent (or that counts a lookup, or makes a file handle) gets
//! a slot in shared memory the keeper holds ([`crate::region`]):
//!
//! 1. *started*, when a worker takes it, before the filesystem sees it;
//! 2. *answered*, with the reply's bytes, once the filesystem answered and
//!    before the reply is written to the kernel;
//! 3. free again once the reply is written.
//!
//! When a resent request arrives, the successor looks its unique up: an
//! *answered* one gets its recorded reply and never reaches the filesystem;
//! a *started* one reaches it as [`Replay::MaybeDone`], with the one word the
//! predecessor may have noted ([`crate::RequestContext::journal_note`]), so
//! that the filesystem checks whether the effect happened; one the journal
//! does not know is carried out as usual.
//!
//! Slots are a fixed array probed from the unique's hash, claimed with a
//! compare-and-swap: no lock, no allocation. A slot left behind by a daemon
//! that died after writing its reply (the kernel does not send that request
//! again) is reused once its epoch is over and a grace time has passed.

use crate::region::{SharedRegion, load_bytes, store_bytes};
use fuse_proto::consts::UNIQUE_RESEND;
use fuse_proto::{Opcode, Reply};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a request reaches the filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replay {
    /// A request no predecessor started: carry it out.
    Fresh,
    /// Sent again after a predecessor died while carrying it out: its
    /// effect may or may not have happened. Check (the kernel still holds
    /// the locks it took for the request, so the state of the names
    /// involved says), and answer as if carried out once.
    MaybeDone,
}

const MAGIC: u64 = u64::from_le_bytes(*b"FWJRNL01");
const HEADER_WORDS: usize = 8;
const SLOT_WORDS: usize = 72;
/// key, meta, note, reply length; then the reply.
const REPLY_WORDS: usize = SLOT_WORDS - 4;
/// The longest reply recorded (a CREATE's is 160 bytes).
pub const MAX_RECORDED: usize = REPLY_WORDS * 8;
/// Slots: more than requests can be in flight in one session.
pub const SLOTS: usize = 1024;
/// How long slots of an earlier daemon are kept for resent requests.
const GRACE: Duration = Duration::from_secs(30);

// Word 0 of a slot says everything about it in one atomic store, so that a
// daemon that dies between two stores never leaves a slot that looks like
// another request's: the unique (48 bits), the opcode (8), the epoch of the
// daemon that wrote it (5), whether a note was set (1), the phase (2). Zero
// is a free slot.
const PHASE_STARTED: u64 = 1;
const PHASE_ANSWERED: u64 = 2;
const NOTE_SET: u64 = 1 << 2;
const EPOCH_SHIFT: u32 = 3;
const EPOCH_MASK: u64 = 0x1f;
const OPCODE_SHIFT: u32 = 8;
const KEY_SHIFT: u32 = 16;
const MAX_KEY: u64 = (1 << 48) - 1;

fn key_of(w: u64) -> u64 {
    w >> KEY_SHIFT
}
fn opcode_of(w: u64) -> u64 {
    (w >> OPCODE_SHIFT) & 0xff
}

/// The journal, over a shared region.
#[derive(Debug)]
pub struct Journal {
    region: SharedRegion,
    epoch: u64,
    opened: Instant,
    grace_over: AtomicBool,
    full_logged: AtomicBool,
}

/// What [`Journal::begin`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Begin {
    /// A new slot for this request.
    New(usize),
    /// A predecessor started it and may have carried it out; its note.
    Started(usize, Option<u64>),
    /// A predecessor answered it: its reply's error and body.
    Answered(i32, Vec<u8>),
    /// Not tracked (every slot taken).
    Untracked,
}

impl Journal {
    /// The size of the shared region a journal needs.
    pub fn bytes_needed() -> usize {
        (HEADER_WORDS + SLOTS * SLOT_WORDS) * 8
    }

    /// The journal in `region`: a new one when `fresh` (a new connection),
    /// else the predecessor's, in a new epoch. `connection` is the
    /// connection's number (its `fuse_connection` in fdinfo), when known:
    /// a new journal records it, and a kept one recorded for another
    /// connection is refused. A kept journal that is blank (lost, or
    /// never written) is refused too: taking it for a new one would carry
    /// out again what the predecessor had done.
    pub fn open(region: SharedRegion, fresh: bool, connection: Option<u32>) -> io::Result<Journal> {
        if region.len() < Self::bytes_needed() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "journal region too small",
            ));
        }
        let w = region.words();
        let magic = w[0].load(Ordering::Acquire);
        let owner = connection.map_or(0, |c| u64::from(c) + 1);
        if fresh {
            region.clear();
            w[2].store(owner, Ordering::Relaxed);
            w[0].store(MAGIC, Ordering::Release);
        } else if magic == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the kept journal is blank: the record of the requests the predecessor served is lost; \
                 refusing to take over (what it carried out could be carried out twice)",
            ));
        } else if magic != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the kept journal is not one of this version",
            ));
        } else {
            let kept = w[2].load(Ordering::Relaxed);
            if kept != 0 && owner != 0 && kept != owner {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the kept journal belongs to connection {}, not to this one ({}): refusing to take over",
                        kept - 1,
                        owner - 1
                    ),
                ));
            }
        }
        let epoch = (w[1].fetch_add(1, Ordering::AcqRel) + 1) & EPOCH_MASK;
        Ok(Journal {
            region,
            epoch,
            opened: Instant::now(),
            grace_over: AtomicBool::new(false),
            full_logged: AtomicBool::new(false),
        })
    }

    fn slot(&self, i: usize) -> &[AtomicU64] {
        let at = HEADER_WORDS + i * SLOT_WORDS;
        &self.region.words()[at..at + SLOT_WORDS]
    }

    /// Takes a request: finds what a predecessor left of it (a resent
    /// one), or claims a slot.
    pub(crate) fn begin(&self, unique: u64, opcode: Opcode) -> Begin {
        let key = unique & !UNIQUE_RESEND;
        if key == 0 || key > MAX_KEY || opcode as u32 > 0xff {
            return Begin::Untracked;
        }
        if unique & UNIQUE_RESEND != 0
            && let Some(found) = self.find(key, opcode)
        {
            return found;
        }
        self.claim(key, opcode)
    }

    fn word(&self, key: u64, opcode: Opcode, phase: u64) -> u64 {
        (key << KEY_SHIFT) | (u64::from(opcode as u32) << OPCODE_SHIFT) | (self.epoch << EPOCH_SHIFT) | phase
    }

    fn find(&self, key: u64, opcode: Opcode) -> Option<Begin> {
        for i in 0..SLOTS {
            let s = self.slot(i);
            let w = s[0].load(Ordering::Acquire);
            if w == 0 || key_of(w) != key || opcode_of(w) != u64::from(opcode as u32) {
                continue;
            }
            if w & 3 == PHASE_ANSWERED {
                let len = (s[3].load(Ordering::Relaxed) as usize).min(MAX_RECORDED);
                let mut bytes = vec![0u8; len];
                load_bytes(&s[4..], &mut bytes);
                if s[0]
                    .compare_exchange(w, 0, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
                {
                    continue;
                }
                if len < 16 {
                    return Some(Begin::Answered(-libc::EIO, Vec::new()));
                }
                let error = i32::from_le_bytes(bytes[4..8].try_into().unwrap_or_default());
                return Some(Begin::Answered(error, bytes.split_off(16)));
            }
            let note = (w & NOTE_SET != 0).then(|| s[2].load(Ordering::Relaxed));
            let mine = self.word(key, opcode, PHASE_STARTED) | (w & NOTE_SET);
            if s[0]
                .compare_exchange(w, mine, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Some(Begin::Started(i, note));
            }
        }
        None
    }

    /// A slot an earlier daemon left, which no resent request took within
    /// the grace time.
    fn stale(&self, w: u64) -> bool {
        if (w >> EPOCH_SHIFT) & EPOCH_MASK == self.epoch {
            return false;
        }
        if self.grace_over.load(Ordering::Relaxed) {
            return true;
        }
        let over = self.opened.elapsed() >= GRACE;
        if over {
            self.grace_over.store(true, Ordering::Relaxed);
        }
        over
    }

    fn claim(&self, key: u64, opcode: Opcode) -> Begin {
        let start = (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % SLOTS;
        let mine = self.word(key, opcode, PHASE_STARTED);
        for n in 0..SLOTS {
            let i = (start + n) % SLOTS;
            let s = self.slot(i);
            let cur = s[0].load(Ordering::Relaxed);
            if cur != 0 && !self.stale(cur) {
                continue;
            }
            if s[0]
                .compare_exchange(cur, mine, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Begin::New(i);
            }
        }
        if !self.full_logged.swap(true, Ordering::Relaxed) {
            log::warn!("journal: all {SLOTS} slots taken; requests beyond them are not journaled");
        }
        Begin::Untracked
    }

    /// The filesystem's note for request `unique` in slot `i` (ignored
    /// once the slot holds another request).
    pub(crate) fn set_note(&self, i: usize, unique: u64, note: u64) {
        let s = self.slot(i);
        if key_of(s[0].load(Ordering::Acquire)) != unique & !UNIQUE_RESEND {
            return;
        }
        s[2].store(note, Ordering::Relaxed);
        s[0].fetch_or(NOTE_SET, Ordering::Release);
    }

    /// Records the reply of slot `i`'s request, before it is written. A
    /// reply too long to record leaves the request *started*.
    pub(crate) fn answer(&self, i: usize, reply: &Reply<'_>) {
        let len = reply.len();
        if len > MAX_RECORDED {
            return;
        }
        let mut buf = [0u8; MAX_RECORDED];
        if reply.copy_to(&mut buf).is_none() {
            return;
        }
        let s = self.slot(i);
        store_bytes(&s[4..], &buf[..len]);
        s[3].store(len as u64, Ordering::Relaxed);
        let w = s[0].load(Ordering::Relaxed);
        s[0].store((w & !3) | PHASE_ANSWERED, Ordering::Release);
    }

    /// Frees slot `i` once its reply is written.
    pub(crate) fn finish(&self, i: usize) {
        self.slot(i)[0].store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuse_proto::Errno;

    fn journal(fresh: bool, region: Option<&SharedRegion>) -> Journal {
        let r = match region {
            Some(r) => SharedRegion::from_fd(r.fd().try_clone_to_owned().unwrap()).unwrap(),
            None => SharedRegion::create("journal-test", Journal::bytes_needed()).unwrap(),
        };
        Journal::open(r, fresh, None).unwrap()
    }

    #[test]
    fn a_blank_or_foreign_kept_journal_is_refused() {
        let r = SharedRegion::create("journal-test", Journal::bytes_needed()).unwrap();
        let again = || SharedRegion::from_fd(r.fd().try_clone_to_owned().unwrap()).unwrap();
        let err = Journal::open(again(), false, Some(7)).unwrap_err();
        assert!(err.to_string().contains("the kept journal is blank"), "{err}");
        Journal::open(again(), true, Some(7)).unwrap();
        let err = Journal::open(again(), false, Some(8)).unwrap_err();
        assert!(
            err.to_string()
                .contains("belongs to connection 7, not to this one (8)"),
            "{err}"
        );
        Journal::open(again(), false, Some(7)).unwrap();
        // Unknown on either side: not checked.
        Journal::open(again(), false, None).unwrap();
        r.words()[0].store(u64::from_le_bytes(*b"FWJRNL00"), Ordering::Relaxed);
        let err = Journal::open(again(), false, Some(7)).unwrap_err();
        assert!(err.to_string().contains("not one of this version"), "{err}");
    }

    #[test]
    fn a_successor_finds_what_its_predecessor_left() {
        let dead = journal(true, None);
        let Begin::New(a) = dead.begin(10, Opcode::Mkdir) else {
            panic!()
        };
        let Begin::New(b) = dead.begin(12, Opcode::Unlink) else {
            panic!()
        };
        dead.set_note(b, 12, 77);
        let Begin::New(c) = dead.begin(14, Opcode::Create) else {
            panic!()
        };
        dead.answer(c, &Reply::error(14, Errno::EEXIST));
        let Begin::New(d) = dead.begin(16, Opcode::Mkdir) else {
            panic!()
        };
        dead.answer(d, &Reply::empty(16));
        dead.finish(d);
        assert_ne!(a, b);
        let next = journal(false, Some(&dead.region));
        drop(dead);
        assert!(matches!(next.begin(10 | UNIQUE_RESEND, Opcode::Mkdir), Begin::Started(i, None) if i == a));
        assert!(
            matches!(next.begin(12 | UNIQUE_RESEND, Opcode::Unlink), Begin::Started(i, Some(77)) if i == b)
        );
        assert_eq!(
            next.begin(14 | UNIQUE_RESEND, Opcode::Create),
            Begin::Answered(-libc::EEXIST, vec![])
        );
        // Answered and written: the kernel does not send it again; were it
        // sent, it would be new.
        assert!(matches!(
            next.begin(16 | UNIQUE_RESEND, Opcode::Mkdir),
            Begin::New(_)
        ));
        // Not resent: a new request with the same low bits is not confused
        // with a slot the predecessor left (uniques are not reused while
        // their requests live, but the marker tells).
        assert!(matches!(next.begin(12, Opcode::Unlink), Begin::New(i) if i != b));
        // A fresh journal forgets everything.
        let fresh = journal(true, Some(&next.region));
        assert!(matches!(
            fresh.begin(10 | UNIQUE_RESEND, Opcode::Mkdir),
            Begin::New(_)
        ));
    }

    #[test]
    fn an_entry_reply_comes_back_byte_for_byte() {
        let dead = journal(true, None);
        let out = fuse_proto::abi::EntryOut {
            nodeid: 5,
            generation: 9,
            ..Default::default()
        };
        let Begin::New(i) = dead.begin(20, Opcode::Lookup) else {
            panic!()
        };
        let reply = Reply::entry(20, &out, 45);
        dead.answer(i, &reply);
        let next = journal(false, Some(&dead.region));
        let Begin::Answered(0, body) = next.begin(20 | UNIQUE_RESEND, Opcode::Lookup) else {
            panic!()
        };
        assert_eq!(body, reply.to_vec()[16..]);
    }

    #[test]
    fn slots_run_out_without_blocking_and_come_back() {
        let j = journal(true, None);
        let taken: Vec<usize> = (1..=SLOTS as u64)
            .map(|u| match j.begin(u * 2, Opcode::Mkdir) {
                Begin::New(i) => i,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(j.begin(5, Opcode::Mkdir), Begin::Untracked);
        j.finish(taken[3]);
        assert!(matches!(j.begin(7, Opcode::Mkdir), Begin::New(i) if i == taken[3]));
    }
}

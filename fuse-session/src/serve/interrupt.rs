//! The registry of requests in flight, for INTERRUPT.
//!
//! Each worker owns a table of slots and a lock-free free list, so
//! registering and finishing a request touches only that worker's table (no
//! lock shared by all requests, no allocation). The first
//! [`SLOTS_PER_WORKER`] slots are made with the table; a worker with that
//! many requests in flight at once (an async filesystem's futures, an
//! io_uring queue's entries) takes more from chunks the table adds as it
//! needs them, up to [`MAX_SLOTS_PER_WORKER`], through a lock of that table
//! only: every request in flight stays interruptible, whatever their number,
//! and a worker that never has that many pays nothing for it. An INTERRUPT,
//! which is rare, scans every table for its target. An INTERRUPT whose
//! target is not (yet) registered is answered `EAGAIN`, which makes the
//! kernel send it again, and is remembered so that the target is marked
//! interrupted if it arrives later.
//!
//! A slot also counts the request's must-finish sections
//! ([`crate::MustFinish`]): an INTERRUPT that finds one open is held in the
//! slot, neither marking the request nor running its callback, and is
//! delivered when the last section ends (then the request is interrupted as
//! any other). Opening, closing and delivering take the slot's own lock, so
//! an INTERRUPT is delivered once whatever it races with.

use crossbeam_channel::{Receiver, Sender, bounded};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A callback run (once) when the request is interrupted.
pub type InterruptCallback = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct SlotState {
    unique: AtomicU64,
    interrupted: AtomicBool,
    /// The callback, and the must-finish sections open and whether an
    /// INTERRUPT waits for them to end; all three under one lock.
    callback: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    callback: Option<InterruptCallback>,
    sections: u32,
    interrupt_waits: bool,
}

/// One worker's table.
pub(crate) struct InflightTable {
    slots: Box<[SlotState]>,
    free_tx: Sender<u32>,
    free_rx: Receiver<u32>,
    /// Slots beyond the first [`SLOTS_PER_WORKER`], in chunks made when
    /// first needed.
    chunks: Box<[OnceLock<Box<[SlotState]>>]>,
    /// The free indices of `chunks`, and how many chunks exist.
    extra: Mutex<(Vec<u32>, usize)>,
}

/// A request's place in a table, or none when the table was full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot(Option<u32>);

impl Slot {
    pub(crate) const NONE: Slot = Slot(None);
}

/// Slots a table is made with.
pub(crate) const SLOTS_PER_WORKER: usize = 256;
/// Most requests in flight at once one table registers; beyond, a request
/// cannot be interrupted (the protocol allows it).
pub(crate) const MAX_SLOTS_PER_WORKER: usize = 65536;
const CHUNKS: usize = MAX_SLOTS_PER_WORKER / SLOTS_PER_WORKER - 1;
/// Most INTERRUPTs remembered before their target starts.
const MAX_PENDING: usize = 65536;
/// How long an unmatched INTERRUPT is remembered. Its target was already read
/// when the kernel sent it, so it registers once a thread serves it (at
/// once on `/dev/fuse`; over io_uring when a queue thread takes its ring
/// entry); older entries are targets that had already finished.
const PENDING_TTL: Duration = Duration::from_secs(60);

impl InflightTable {
    pub(crate) fn new() -> Self {
        let (free_tx, free_rx) = bounded(SLOTS_PER_WORKER);
        for i in 0..SLOTS_PER_WORKER as u32 {
            let _ = free_tx.send(i);
        }
        let slots = (0..SLOTS_PER_WORKER).map(|_| SlotState::default()).collect();
        Self {
            slots,
            free_tx,
            free_rx,
            chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
            extra: Mutex::new((Vec::new(), 0)),
        }
    }

    /// Slot `i`, of the first ones or of a chunk.
    fn slot(&self, i: u32) -> Option<&SlotState> {
        let i = i as usize;
        if i < SLOTS_PER_WORKER {
            return self.slots.get(i);
        }
        let (chunk, at) = ((i - SLOTS_PER_WORKER) / SLOTS_PER_WORKER, i % SLOTS_PER_WORKER);
        self.chunks.get(chunk)?.get()?.get(at)
    }

    /// A free index beyond the first slots, adding a chunk if none is free;
    /// `None` once [`MAX_SLOTS_PER_WORKER`] are taken.
    fn take_extra(&self) -> Option<u32> {
        let mut extra = self.extra.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = extra.0.pop() {
            return Some(i);
        }
        let n = extra.1;
        if n >= CHUNKS {
            return None;
        }
        let made =
            self.chunks[n].get_or_init(|| (0..SLOTS_PER_WORKER).map(|_| SlotState::default()).collect());
        let base = SLOTS_PER_WORKER * (n + 1);
        extra.1 = n + 1;
        extra.0.extend((base..base + made.len()).rev().map(|i| i as u32));
        extra.0.pop()
    }

    /// Registers `unique`; `Slot::NONE` if every slot is taken (the request
    /// then cannot be interrupted, which the protocol allows).
    pub(crate) fn register(&self, unique: u64) -> Slot {
        let index = match self.free_rx.try_recv() {
            Ok(i) => Some(i),
            Err(_) => self.take_extra(),
        };
        match index.and_then(|i| Some((i, self.slot(i)?))) {
            Some((i, s)) => {
                // `release` left no callback or section behind.
                s.interrupted.store(false, Ordering::Relaxed);
                s.unique.store(unique, Ordering::Release);
                Slot(Some(i))
            }
            None => Slot::NONE,
        }
    }

    pub(crate) fn release(&self, slot: &Slot) {
        let Some((i, s)) = slot.0.and_then(|i| Some((i, self.slot(i)?))) else {
            return;
        };
        s.unique.store(0, Ordering::Release);
        if let Ok(mut h) = s.callback.lock() {
            *h = Held::default();
        }
        if (i as usize) < SLOTS_PER_WORKER {
            let _ = self.free_tx.try_send(i);
        } else {
            self.extra.lock().unwrap_or_else(|e| e.into_inner()).0.push(i);
        }
    }

    pub(crate) fn is_interrupted(&self, slot: &Slot) -> bool {
        slot.0
            .and_then(|i| self.slot(i))
            .is_some_and(|s| s.interrupted.load(Ordering::Acquire))
    }

    /// Sets the callback; runs it at once if already interrupted.
    pub(crate) fn on_interrupt(&self, slot: &Slot, cb: InterruptCallback) {
        let Some(s) = slot.0.and_then(|i| self.slot(i)) else {
            return;
        };
        if s.interrupted.load(Ordering::Acquire) {
            cb();
            return;
        }
        let mut guard = s.callback.lock().unwrap_or_else(|e| e.into_inner());
        if s.interrupted.load(Ordering::Acquire) {
            drop(guard);
            cb();
        } else {
            guard.callback = Some(cb);
        }
    }

    /// Opens a must-finish section for request `unique`, unless it was
    /// interrupted already (or is no longer in this slot): then `false`.
    pub(crate) fn begin_section(&self, slot: &Slot, unique: u64) -> bool {
        let Some(s) = slot.0.and_then(|i| self.slot(i)) else {
            // Not registered: it cannot be interrupted either.
            return true;
        };
        let mut h = s.callback.lock().unwrap_or_else(|e| e.into_inner());
        if s.unique.load(Ordering::Acquire) != unique || s.interrupted.load(Ordering::Acquire) {
            return false;
        }
        h.sections += 1;
        true
    }

    /// Closes a section [`InflightTable::begin_section`] opened; the last
    /// one delivers an INTERRUPT that came meanwhile.
    pub(crate) fn end_section(&self, slot: &Slot, unique: u64) {
        let Some(s) = slot.0.and_then(|i| self.slot(i)) else {
            return;
        };
        let mut h = s.callback.lock().unwrap_or_else(|e| e.into_inner());
        if s.unique.load(Ordering::Acquire) != unique || h.sections == 0 {
            return; // answered already: the slot was released
        }
        h.sections -= 1;
        if h.sections > 0 || !std::mem::take(&mut h.interrupt_waits) {
            return;
        }
        s.interrupted.store(true, Ordering::Release);
        let cb = h.callback.take();
        drop(h);
        if let Some(cb) = cb {
            cb();
        }
    }

    /// Marks `unique` interrupted if it is here; returns whether it was.
    fn interrupt(&self, unique: u64) -> bool {
        let chunks = self.chunks.iter().map_while(|c| c.get());
        for s in self.slots.iter().chain(chunks.flatten()) {
            if s.unique.load(Ordering::Acquire) == unique {
                let mut h = s.callback.lock().unwrap_or_else(|e| e.into_inner());
                if h.sections > 0 {
                    // Delivered when the last section ends.
                    h.interrupt_waits = true;
                    return true;
                }
                s.interrupted.store(true, Ordering::Release);
                let cb = h.callback.take();
                drop(h);
                if let Some(cb) = cb {
                    cb();
                }
                return true;
            }
        }
        false
    }

    fn mark(&self, slot: &Slot) {
        if let Some(s) = slot.0.and_then(|i| self.slot(i)) {
            s.interrupted.store(true, Ordering::Release);
        }
    }
}

/// Interrupts that arrived before their target, remembered for
/// [`PENDING_TTL`] (at most [`MAX_PENDING`]). Over io_uring the kernel does
/// not send an INTERRUPT again when it is answered `EAGAIN`, and a target
/// can wait in its ring entry for a queue thread, or at an async bound, for
/// a while: the INTERRUPT is not lost meanwhile.
///
/// A request that starts looks at one counter of [`BUCKETS`], chosen by
/// its `unique`: only when an INTERRUPT with the same bucket is remembered
/// does it take the list's lock.
pub(crate) struct PendingInterrupts {
    buckets: Box<[AtomicUsize]>,
    list: Mutex<PendingList>,
}

#[derive(Default)]
struct PendingList {
    /// Target → when its INTERRUPT came.
    targets: HashMap<u64, Instant>,
    /// The same, oldest first (entries already taken out are skipped).
    order: VecDeque<(u64, Instant)>,
}

const BUCKETS: usize = 4096;

fn bucket(unique: u64) -> usize {
    // Uniques go up by two (the low bit marks an INTERRUPT's own).
    ((unique >> 1) as usize) % BUCKETS
}

impl Default for PendingInterrupts {
    fn default() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| AtomicUsize::new(0)).collect(),
            list: Mutex::new(PendingList::default()),
        }
    }
}

impl PendingInterrupts {
    /// Delivers an INTERRUPT for `target`: true if a request was found.
    /// Otherwise it is remembered (bounded) and the caller answers EAGAIN.
    pub(crate) fn interrupt(&self, tables: &[InflightTable], target: u64) -> bool {
        if tables.iter().any(|t| t.interrupt(target)) {
            return true;
        }
        let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        self.expire(&mut l, now);
        if l.targets.len() >= MAX_PENDING
            && let Some((oldest, _)) = l.order.pop_front()
            && l.targets.remove(&oldest).is_some()
        {
            self.buckets[bucket(oldest)].fetch_sub(1, Ordering::Release);
        }
        if l.targets.insert(target, now).is_none() {
            self.buckets[bucket(target)].fetch_add(1, Ordering::Release);
            l.order.push_back((target, now));
        }
        false
    }

    /// Forgets INTERRUPTs remembered longer than [`PENDING_TTL`].
    fn expire(&self, l: &mut PendingList, now: Instant) {
        while let Some(&(u, at)) = l.order.front() {
            if now.duration_since(at) < PENDING_TTL {
                break;
            }
            l.order.pop_front();
            if l.targets.get(&u) == Some(&at) {
                l.targets.remove(&u);
                self.buckets[bucket(u)].fetch_sub(1, Ordering::Release);
            }
        }
    }

    /// Called when a request starts: marks it interrupted if an INTERRUPT
    /// for it came first. Costs one atomic load when none with its bucket
    /// is remembered.
    pub(crate) fn check_new(&self, table: &InflightTable, slot: &Slot, unique: u64) {
        if self.buckets[bucket(unique)].load(Ordering::Acquire) == 0 {
            return;
        }
        let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        self.expire(&mut l, now);
        if l.targets.remove(&unique).is_some() {
            self.buckets[bucket(unique)].fetch_sub(1, Ordering::Release);
            table.mark(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table registers beyond its first slots, every request found by
    /// an INTERRUPT, and slots given back are taken again.
    #[test]
    fn every_request_in_flight_is_registered_and_found() {
        let table = InflightTable::new();
        let n = SLOTS_PER_WORKER * 3 + 5;
        let slots: Vec<Slot> = (0..n as u64).map(|u| table.register(2 * u + 2)).collect();
        assert!(slots.iter().all(|s| *s != Slot::NONE));
        let pending = PendingInterrupts::default();
        let tables = [table];
        let last = 2 * n as u64;
        assert!(pending.interrupt(&tables, last));
        assert!(tables[0].is_interrupted(&slots[n - 1]));
        assert!(!tables[0].is_interrupted(&slots[n - 2]));
        for s in &slots {
            tables[0].release(s);
        }
        let again: Vec<Slot> = (0..n as u64).map(|u| tables[0].register(9000 + 2 * u)).collect();
        assert!(
            again
                .iter()
                .all(|s| *s != Slot::NONE && !tables[0].is_interrupted(s))
        );
        assert_eq!(
            tables[0].extra.lock().unwrap().1,
            3,
            "the chunks are reused, none made twice"
        );
    }

    /// An INTERRUPT that comes before its target marks the target when it
    /// starts, and is then forgotten.
    #[test]
    fn an_early_interrupt_marks_its_target_once() {
        let tables = [InflightTable::new()];
        let pending = PendingInterrupts::default();
        assert!(!pending.interrupt(&tables, 42));
        let other = tables[0].register(44);
        pending.check_new(&tables[0], &other, 44);
        assert!(!tables[0].is_interrupted(&other));
        let target = tables[0].register(42);
        pending.check_new(&tables[0], &target, 42);
        assert!(tables[0].is_interrupted(&target));
        assert!(pending.buckets.iter().all(|b| b.load(Ordering::Relaxed) == 0));
        assert!(pending.list.lock().unwrap().targets.is_empty());
    }

    /// An INTERRUPT during a must-finish section is held: the request is
    /// not marked and its callback does not run until the last section
    /// ends, then both happen once.
    #[test]
    fn an_interrupt_in_a_section_is_delivered_once_when_the_last_ends() {
        let tables = [InflightTable::new()];
        let pending = PendingInterrupts::default();
        let slot = tables[0].register(42);
        let runs = std::sync::Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        tables[0].on_interrupt(
            &slot,
            Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
            }),
        );
        assert!(tables[0].begin_section(&slot, 42));
        assert!(tables[0].begin_section(&slot, 42));
        assert!(pending.interrupt(&tables, 42), "found, not remembered for later");
        assert!(pending.interrupt(&tables, 42), "a second INTERRUPT is held too");
        tables[0].end_section(&slot, 42);
        assert!(!tables[0].is_interrupted(&slot));
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        tables[0].end_section(&slot, 42);
        assert!(tables[0].is_interrupted(&slot));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // An unbalanced end (a guard past its request) changes nothing.
        tables[0].end_section(&slot, 42);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(
            !tables[0].begin_section(&slot, 42),
            "interrupted before the section"
        );
    }

    /// A guard kept past its request's answer leaves the next request of
    /// the slot alone, and a released slot forgets its sections.
    #[test]
    fn a_section_ends_with_its_request() {
        let tables = [InflightTable::new()];
        let pending = PendingInterrupts::default();
        let first = tables[0].register(42);
        assert!(tables[0].begin_section(&first, 42));
        let _others: Vec<Slot> = (0..SLOTS_PER_WORKER as u64 - 1)
            .map(|i| tables[0].register(1000 + 2 * i))
            .collect();
        tables[0].release(&first);
        let next = tables[0].register(44);
        assert_eq!(next, first, "the slot is reused");
        assert!(tables[0].begin_section(&next, 44));
        tables[0].end_section(&next, 42);
        assert!(pending.interrupt(&tables, 44));
        assert!(
            !tables[0].is_interrupted(&next),
            "the old guard closed none of 44's"
        );
        tables[0].end_section(&next, 44);
        assert!(tables[0].is_interrupted(&next));
        assert!(
            !tables[0].begin_section(&next, 42),
            "a stale request opens nothing"
        );
    }
}

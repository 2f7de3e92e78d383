//! The registry of requests in flight, for INTERRUPT.
//!
//! Each worker owns a fixed table of slots and a lock-free free list, so
//! registering and finishing a request touches only that worker's table (no
//! lock shared by all requests, no allocation). An INTERRUPT, which is rare,
//! scans every table for its target. An INTERRUPT whose target is not (yet)
//! registered is answered `EAGAIN`, which makes the kernel send it again, and
//! is remembered so that the target is marked interrupted if it arrives later.

use crossbeam_channel::{Receiver, Sender, bounded};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A callback run (once) when the request is interrupted.
pub type InterruptCallback = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct SlotState {
    unique: AtomicU64,
    interrupted: AtomicBool,
    callback: Mutex<Option<InterruptCallback>>,
}

/// One worker's table.
pub(crate) struct InflightTable {
    slots: Box<[SlotState]>,
    free_tx: Sender<u32>,
    free_rx: Receiver<u32>,
}

/// A request's place in a table, or none when the table was full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot(Option<u32>);

impl Slot {
    pub(crate) const NONE: Slot = Slot(None);
}

pub(crate) const SLOTS_PER_WORKER: usize = 256;
const MAX_PENDING: usize = 64;
/// How long an unmatched INTERRUPT is remembered. Its target was already read
/// by some worker when the kernel sent it, so it registers within moments;
/// older entries are targets that had already finished.
const PENDING_TTL: Duration = Duration::from_secs(1);

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
        }
    }

    /// Registers `unique`; `Slot::NONE` if every slot is taken (the request
    /// then cannot be interrupted, which the protocol allows).
    pub(crate) fn register(&self, unique: u64) -> Slot {
        match self.free_rx.try_recv() {
            Ok(i) => {
                let s = &self.slots[i as usize];
                s.interrupted.store(false, Ordering::Relaxed);
                s.unique.store(unique, Ordering::Release);
                Slot(Some(i))
            }
            Err(_) => Slot::NONE,
        }
    }

    pub(crate) fn release(&self, slot: &Slot) {
        if let Some(i) = slot.0 {
            let s = &self.slots[i as usize];
            s.unique.store(0, Ordering::Release);
            if let Ok(mut cb) = s.callback.lock() {
                cb.take();
            }
            let _ = self.free_tx.try_send(i);
        }
    }

    pub(crate) fn is_interrupted(&self, slot: &Slot) -> bool {
        slot.0
            .is_some_and(|i| self.slots[i as usize].interrupted.load(Ordering::Acquire))
    }

    /// Sets the callback; runs it at once if already interrupted.
    pub(crate) fn on_interrupt(&self, slot: &Slot, cb: InterruptCallback) {
        let Some(i) = slot.0 else { return };
        let s = &self.slots[i as usize];
        if s.interrupted.load(Ordering::Acquire) {
            cb();
            return;
        }
        let mut guard = s.callback.lock().unwrap_or_else(|e| e.into_inner());
        if s.interrupted.load(Ordering::Acquire) {
            drop(guard);
            cb();
        } else {
            *guard = Some(cb);
        }
    }

    /// Marks `unique` interrupted if it is here; returns whether it was.
    fn interrupt(&self, unique: u64) -> bool {
        for s in self.slots.iter() {
            if s.unique.load(Ordering::Acquire) == unique {
                s.interrupted.store(true, Ordering::Release);
                let cb = s.callback.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(cb) = cb {
                    cb();
                }
                return true;
            }
        }
        false
    }

    fn mark(&self, slot: &Slot) {
        if let Some(i) = slot.0 {
            self.slots[i as usize].interrupted.store(true, Ordering::Release);
        }
    }
}

/// Interrupts that arrived before their target.
#[derive(Default)]
pub(crate) struct PendingInterrupts {
    count: AtomicUsize,
    list: Mutex<Vec<(u64, Instant)>>,
}

impl PendingInterrupts {
    /// Delivers an INTERRUPT for `target`: true if a request was found.
    /// Otherwise it is remembered (bounded) and the caller answers EAGAIN.
    pub(crate) fn interrupt(&self, tables: &[InflightTable], target: u64) -> bool {
        if tables.iter().any(|t| t.interrupt(target)) {
            return true;
        }
        let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
        if l.len() >= MAX_PENDING {
            l.remove(0);
        }
        if !l.iter().any(|&(u, _)| u == target) {
            l.push((target, Instant::now()));
        }
        self.count.store(l.len(), Ordering::Release);
        false
    }

    /// Called when a request starts: marks it interrupted if an INTERRUPT
    /// for it came first. Costs one atomic load when nothing is pending.
    pub(crate) fn check_new(&self, table: &InflightTable, slot: &Slot, unique: u64) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        l.retain(|&(_, at)| now.duration_since(at) < PENDING_TTL);
        if let Some(p) = l.iter().position(|&(u, _)| u == unique) {
            l.swap_remove(p);
            table.mark(slot);
        }
        self.count.store(l.len(), Ordering::Release);
    }
}

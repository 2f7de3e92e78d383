//! Per-opcode statistics: count, errors and the high-water mark of requests
//! in flight, kept per worker so that no cache line is shared on the hot path.
//! [`Stats`] sums the workers' counters while the session runs.
//!
//! The counters of `/dev/fuse` workers come first; with the io_uring
//! transport each ring queue has its own set after them, so the statistics
//! also say how many requests each transport (and each queue) delivered.

use fuse_proto::Opcode;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

#[derive(Default)]
pub(crate) struct OpCounters {
    count: AtomicU64,
    errors: AtomicU64,
    inflight: AtomicU32,
    max_inflight: AtomicU32,
}

/// One worker's counters, aligned so two workers never share a cache line.
#[repr(align(128))]
pub(crate) struct WorkerStats {
    ops: [OpCounters; Opcode::COUNT],
}

impl Default for WorkerStats {
    fn default() -> Self {
        Self {
            ops: std::array::from_fn(|_| OpCounters::default()),
        }
    }
}

/// Starts a request on worker `me`: counts it and updates the in-flight
/// high-water mark (the sum over the started workers `all`, read without
/// writing to theirs).
pub(crate) fn start(all: &[WorkerStats], me: usize, op: Opcode) {
    let i = op.index();
    let mine = &all[me].ops[i];
    mine.count.fetch_add(1, Relaxed);
    // SeqCst on the increment and the loads: two workers starting at once
    // must not both miss each other's increment (store-load reordering), or
    // the high-water mark would under-count real concurrency. On x86 this
    // costs nothing over Relaxed (the increment is a locked instruction).
    mine.inflight.fetch_add(1, SeqCst);
    let total: u32 = all.iter().map(|w| w.ops[i].inflight.load(SeqCst)).sum();
    mine.max_inflight.fetch_max(total, Relaxed);
}

/// Ends a request started on worker `me`.
pub(crate) fn finish(all: &[WorkerStats], me: usize, op: Opcode, is_error: bool) {
    let c = &all[me].ops[op.index()];
    c.inflight.fetch_sub(1, Relaxed);
    if is_error {
        c.errors.fetch_add(1, Relaxed);
    }
}

/// Counts a request that gets no reply (FORGET, BATCH_FORGET, NOTIFY_REPLY, INTERRUPT).
pub(crate) fn count_only(all: &[WorkerStats], me: usize, op: Opcode) {
    all[me].ops[op.index()].count.fetch_add(1, Relaxed);
}

/// Counts a request that could not be parsed.
pub(crate) fn count_error(all: &[WorkerStats], me: usize, op: Opcode) {
    let c = &all[me].ops[op.index()];
    c.count.fetch_add(1, Relaxed);
    c.errors.fetch_add(1, Relaxed);
}

/// Statistics of one opcode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpStats {
    /// Requests received.
    pub count: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Most requests of this opcode in flight at once.
    pub max_inflight: u32,
}

/// Requests received per transport.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Requests read from `/dev/fuse` (INIT, FORGET, INTERRUPT and
    /// NOTIFY_REPLY always come this way; everything does without rings).
    pub dev_fuse: u64,
    /// Requests delivered by the io_uring rings.
    pub uring: u64,
    /// Requests per ring queue, indexed by queue id (empty without rings).
    pub queues: Vec<u64>,
}

/// A snapshot of the session's statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Per opcode, keyed by the kernel's name without `FUSE_` (e.g. `"WRITE"`);
    /// opcodes never seen are absent.
    pub ops: BTreeMap<&'static str, OpStats>,
    /// Requests received per transport.
    pub transport: TransportStats,
}

impl Stats {
    /// Sums `all`; entries from `uring_base` on are ring queues.
    pub(crate) fn collect(all: &[WorkerStats], uring_base: usize) -> Self {
        let mut transport = TransportStats::default();
        for (i, w) in all.iter().enumerate() {
            let n: u64 = w.ops.iter().map(|c| c.count.load(Relaxed)).sum();
            if i < uring_base {
                transport.dev_fuse += n;
            } else {
                transport.uring += n;
                transport.queues.push(n);
            }
        }
        let mut ops = BTreeMap::new();
        for op in Opcode::ALL {
            let i = op.index();
            let mut s = OpStats::default();
            for w in all {
                let c = &w.ops[i];
                s.count += c.count.load(Relaxed);
                s.errors += c.errors.load(Relaxed);
                s.max_inflight = s.max_inflight.max(c.max_inflight.load(Relaxed));
            }
            if s.count > 0 {
                ops.insert(op.name(), s);
            }
        }
        Stats { ops, transport }
    }

    /// The statistics of `op` (zero if never seen).
    pub fn get(&self, op: Opcode) -> OpStats {
        self.ops.get(op.name()).copied().unwrap_or_default()
    }

    /// As JSON: `{"ops": {"WRITE": {"count": N, "errors": E, "max_inflight": M}, ...},
    /// "transport": {"dev_fuse": N, "uring": N, "queues": [N, ...]}}`.
    pub fn to_json(&self) -> String {
        let mut s = String::from("{\"ops\": {");
        for (i, (name, o)) in self.ops.iter().enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            s.push_str(&format!(
                "\"{name}\": {{\"count\": {}, \"errors\": {}, \"max_inflight\": {}}}",
                o.count, o.errors, o.max_inflight
            ));
        }
        let t = &self.transport;
        let queues: Vec<String> = t.queues.iter().map(|n| n.to_string()).collect();
        s.push_str(&format!(
            "}}, \"transport\": {{\"dev_fuse\": {}, \"uring\": {}, \"queues\": [{}]}}}}",
            t.dev_fuse,
            t.uring,
            queues.join(", ")
        ));
        s
    }
}

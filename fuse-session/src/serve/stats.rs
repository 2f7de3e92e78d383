//! Per-opcode statistics: count, errors and the high-water mark of requests
//! in flight; and the handlers that panicked ([`HandlerPanic`]).
//!
//! Counts and errors are kept per worker (each worker's counters on cache
//! lines of their own), and so is each worker's high-water mark. No worker
//! ever loads another worker's counters: [`Stats`] adds them up when it is
//! read.
//!
//! The high-water mark of requests in flight is opt-in
//! ([`SessionConfig::track_inflight`](crate::SessionConfig)): it needs one
//! counter per opcode shared by every worker, changed with one relaxed
//! read-modify-write when a request starts and one when it ends (the value
//! that increment returns is the exact number in flight at that moment,
//! which per-worker counts could not give: the peak of a sum is not the sum
//! of the peaks, nor the largest of them). That is a cache line all workers
//! write, once when a request starts and once when it ends: the one cost
//! the statistics would add to every request, so it is off unless asked
//! for, and `max_inflight` is then `None` ("not tracked"), never a 0 that
//! would read as "nothing ran at once".
//!
//! The counters of `/dev/fuse` workers come first; with the io_uring
//! transport each ring queue has its own set after them, so the statistics
//! also say how many requests each transport (and each queue) delivered.

use fuse_proto::Opcode;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

#[derive(Default)]
pub(crate) struct OpCounters {
    count: AtomicU64,
    errors: AtomicU64,
    max_inflight: AtomicU32,
}

/// One worker's counters, aligned so two workers never share a cache line.
#[repr(align(128))]
pub(crate) struct WorkerStats {
    ops: [OpCounters; Opcode::COUNT],
    /// WRITEs whose payload was left in the worker's pipe.
    spliced_writes: AtomicU64,
}

impl Default for WorkerStats {
    fn default() -> Self {
        Self {
            ops: std::array::from_fn(|_| OpCounters::default()),
            spliced_writes: AtomicU64::new(0),
        }
    }
}

/// The number of requests of one opcode in flight, alone on its cache line.
#[derive(Default)]
#[repr(align(128))]
struct Inflight(AtomicU32);

/// The statistics of a session: per-worker counters and the per-opcode
/// in-flight counts.
pub(crate) struct StatsTable {
    workers: Box<[WorkerStats]>,
    /// Per-opcode in-flight counts; empty when not tracked.
    inflight: Box<[Inflight]>,
}

impl StatsTable {
    /// Counters for `n` workers (and ring queues); in-flight counts only
    /// if `track_inflight`.
    pub(crate) fn new(n: usize, track_inflight: bool) -> Self {
        let ops = if track_inflight { Opcode::COUNT } else { 0 };
        Self {
            workers: (0..n).map(|_| WorkerStats::default()).collect(),
            inflight: (0..ops).map(|_| Inflight::default()).collect(),
        }
    }

    /// Starts a request on worker `me`: counts it and updates the worker's
    /// high-water mark of requests in flight.
    pub(crate) fn start(&self, me: usize, op: Opcode) {
        let i = op.index();
        let mine = &self.workers[me].ops[i];
        mine.count.fetch_add(1, Relaxed);
        if let Some(n) = self.inflight.get(i) {
            let now = n.0.fetch_add(1, Relaxed) + 1;
            if now > mine.max_inflight.load(Relaxed) {
                mine.max_inflight.fetch_max(now, Relaxed);
            }
        }
    }

    /// Ends a request started on worker `me` (from whichever thread answers it).
    pub(crate) fn finish(&self, me: usize, op: Opcode, is_error: bool) {
        let i = op.index();
        if let Some(n) = self.inflight.get(i) {
            n.0.fetch_sub(1, Relaxed);
        }
        if is_error {
            self.workers[me].ops[i].errors.fetch_add(1, Relaxed);
        }
    }

    /// Counts a request that gets no reply (FORGET, BATCH_FORGET, NOTIFY_REPLY, INTERRUPT).
    pub(crate) fn count_only(&self, me: usize, op: Opcode) {
        self.workers[me].ops[op.index()].count.fetch_add(1, Relaxed);
    }

    /// Counts a WRITE served with its payload in worker `me`'s pipe.
    pub(crate) fn count_spliced(&self, me: usize) {
        self.workers[me].spliced_writes.fetch_add(1, Relaxed);
    }

    /// Counts a request that was answered without being started (it could
    /// not be parsed, or was refused before reaching the filesystem).
    pub(crate) fn count_error(&self, me: usize, op: Opcode) {
        let c = &self.workers[me].ops[op.index()];
        c.count.fetch_add(1, Relaxed);
        c.errors.fetch_add(1, Relaxed);
    }
}

/// Statistics of one opcode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpStats {
    /// Requests received.
    pub count: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Most requests of this opcode in flight at once; `None` ("not
    /// tracked") unless
    /// [`SessionConfig::track_inflight`](crate::SessionConfig) is on.
    pub max_inflight: Option<u32>,
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
    /// WRITEs whose payload was left in a worker's pipe for the handler
    /// ([`SessionConfig::splice_write`](crate::SessionConfig)).
    pub spliced_writes: u64,
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
    /// Requests received over every transport.
    pub fn total_requests(&self) -> u64 {
        self.transport.dev_fuse + self.transport.uring
    }

    /// Sums the workers' counters; entries from `uring_base` on are ring queues.
    pub(crate) fn collect(table: &StatsTable, uring_base: usize) -> Self {
        let all = &table.workers;
        let mut transport = TransportStats::default();
        for (i, w) in all.iter().enumerate() {
            let n: u64 = w.ops.iter().map(|c| c.count.load(Relaxed)).sum();
            transport.spliced_writes += w.spliced_writes.load(Relaxed);
            if i < uring_base {
                transport.dev_fuse += n;
            } else {
                transport.uring += n;
                transport.queues.push(n);
            }
        }
        let tracked = !table.inflight.is_empty();
        let mut ops = BTreeMap::new();
        for op in Opcode::ALL {
            let i = op.index();
            let mut s = OpStats {
                max_inflight: tracked.then_some(0),
                ..OpStats::default()
            };
            for w in all {
                let c = &w.ops[i];
                s.count += c.count.load(Relaxed);
                s.errors += c.errors.load(Relaxed);
                s.max_inflight = s.max_inflight.map(|m| m.max(c.max_inflight.load(Relaxed)));
            }
            if s.count > 0 {
                ops.insert(op.name(), s);
            }
        }
        Stats { ops, transport }
    }

    /// The statistics of `op` (zero, and in flight not tracked, if never
    /// seen).
    pub fn get(&self, op: Opcode) -> OpStats {
        self.ops.get(op.name()).copied().unwrap_or_default()
    }

    /// As JSON: `{"ops": {"WRITE": {"count": N, "errors": E, "max_inflight": M}, ...},
    /// "transport": {"dev_fuse": N, "uring": N, "queues": [N, ...], "spliced_writes": N}}`
    /// (`M` is `null` when requests in flight are not tracked).
    pub fn to_json(&self) -> String {
        self.to_json_with(&[])
    }

    /// As [`Stats::to_json`], with the caller's own numbers first (e.g. a
    /// layer's live nodes, for a daemon's statistics file). The names are
    /// written as given (no escaping).
    ///
    /// ```
    /// let json = fuse_session::Stats::default().to_json_with(&[("live_nodes", 1), ("open_files", 0)]);
    /// assert!(json.starts_with("{\"live_nodes\": 1, \"open_files\": 0, \"ops\": {}, \"transport\": {"), "{json}");
    /// ```
    pub fn to_json_with(&self, first: &[(&str, u64)]) -> String {
        let mut s = String::from("{");
        for (name, n) in first {
            s.push_str(&format!("\"{name}\": {n}, "));
        }
        s.push_str("\"ops\": {");
        for (i, (name, o)) in self.ops.iter().enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            let max = o.max_inflight.map_or("null".to_string(), |m| m.to_string());
            s.push_str(&format!(
                "\"{name}\": {{\"count\": {}, \"errors\": {}, \"max_inflight\": {max}}}",
                o.count, o.errors
            ));
        }
        let t = &self.transport;
        let queues: Vec<String> = t.queues.iter().map(|n| n.to_string()).collect();
        s.push_str(&format!(
            "}}, \"transport\": {{\"dev_fuse\": {}, \"uring\": {}, \"queues\": [{}], \"spliced_writes\": {}}}}}",
            t.dev_fuse,
            t.uring,
            queues.join(", "),
            t.spliced_writes
        ));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inflight_peaks_only_when_tracked() {
        for track in [false, true] {
            let t = StatsTable::new(2, track);
            t.start(0, Opcode::Write);
            t.start(1, Opcode::Write);
            t.finish(0, Opcode::Write, false);
            t.finish(1, Opcode::Write, true);
            let s = Stats::collect(&t, 2);
            let w = s.ops["WRITE"];
            assert_eq!((w.count, w.errors), (2, 1));
            assert_eq!(w.max_inflight, track.then_some(2), "track {track}");
            let json = s.to_json();
            let want = if track {
                "\"max_inflight\": 2}"
            } else {
                "\"max_inflight\": null}"
            };
            assert!(json.contains(want), "{json}");
        }
    }
}

/// A handler that panicked: the session answered its request `EIO`
/// and went on ([`SessionHandle::take_panics`](crate::SessionHandle::take_panics)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandlerPanic {
    /// The request's opcode.
    pub opcode: Opcode,
    /// The request's unique.
    pub unique: u64,
    /// The panic's message (`non-string panic` when it carried none).
    pub message: String,
}

/// How many handler panics a session keeps until they are taken.
pub const PANICS_KEPT: usize = 64;

/// The newest handler panics (a lock taken only when a handler panicked,
/// or when they are taken).
#[derive(Default)]
pub(crate) struct PanicLog(std::sync::Mutex<std::collections::VecDeque<HandlerPanic>>);

impl PanicLog {
    pub(crate) fn record(&self, p: HandlerPanic) {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() == PANICS_KEPT {
            q.pop_front();
        }
        q.push_back(p);
    }

    pub(crate) fn take(&self) -> Vec<HandlerPanic> {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        q.drain(..).collect()
    }
}

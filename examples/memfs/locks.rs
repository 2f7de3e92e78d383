//! POSIX record locks and BSD `flock` locks served by memfs itself (`-o
//! posix_lock`, `-o flock`), so that they hold across every client of the
//! mount, as a network filesystem's would.
//!
//! One table for the whole filesystem, under one mutex: lock requests are
//! rare and each is short. A lock belongs to a lock owner (the kernel's id
//! for a process's POSIX locks, for the open file of an OFD lock or of a
//! `flock`); POSIX and `flock` locks never conflict with each other, as on
//! Linux. A blocking request (SETLKW) that cannot be granted at once waits
//! on a helper thread of the session ([`RequestContext::defer`]), not on a
//! worker, and every change of the table wakes the waiters to try again.
//!
//! # Semantics
//!
//! As the kernel's own: a lock replaces the owner's locks over its range,
//! cutting those that reach past it (an unlock in the middle of a lock
//! splits it in two), and merges with the owner's locks of the same type
//! that it overlaps or touches; F_GETLK reports one conflicting lock as it
//! is held (merged). A process's locks on a file go when it closes any
//! descriptor of it (FLUSH); a `flock` when its open file is released. An
//! OFD lock's owner is its open file, which the kernel names to the
//! filesystem on no request but the lock requests themselves: OFD locks
//! go when the file's last open file is released, when memfs drops every
//! lock left on the file.
//!
//! # Cost
//!
//! Per file, each owner's POSIX locks are kept in a map keyed by start (an
//! owner's locks never overlap); every write lock in one map keyed by start
//! (write locks of different owners never overlap: one would have
//! conflicted with the other); every read lock in a [`ReadSet`], an
//! interval tree. Testing, setting or clearing a lock costs O(log n) in the
//! file's locks, plus O(k) for the k locks of the caller it replaces, cuts
//! or merges, whatever the number of owners; `flock` costs O(1).
//!
//! # Charges
//!
//! Each lock record costs `LOCK_COST`, and each owner holding records on a
//! file `LOCK_OWNER_COST`, of the filesystem's capacity (`-o size=`, see
//! `capacity.rs`). They are reserved before the table grows: a request
//! that needs more than is left fails with ENOLCK and changes nothing, as
//! the kernel fails a lock it cannot allocate (this includes an unlock
//! that splits a lock in two). Dropping locks always succeeds.

use super::capacity::{Capacity, LOCK_COST, LOCK_OWNER_COST};
use super::data::{release_if_empty, shrink};
use super::keep::{Dec, Enc, bad};
use super::readset::ReadSet;
use fuse_wire::proto::Errno;
use fuse_wire::session::reply::{ReplyEmpty, ReplyLock};
use fuse_wire::session::{Lock, LockOwner, RequestContext};
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// One POSIX lock of an owner, keyed by its start in the owner's map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rec {
    /// Inclusive.
    end: u64,
    typ: i32,
    pid: u32,
}

/// A write lock in the file's map of write locks, keyed by its start.
#[derive(Clone, Copy, Debug)]
struct Span {
    end: u64,
    owner: u64,
    pid: u32,
}

/// The locks on one file.
#[derive(Default)]
struct FileLocks {
    /// Each owner's POSIX locks: disjoint, and two of one type never touch.
    owned: HashMap<u64, BTreeMap<u64, Rec>>,
    /// Every POSIX write lock, of any owner: disjoint.
    writes: BTreeMap<u64, Span>,
    /// Every POSIX read lock, of any owner.
    reads: ReadSet,
    /// `flock` holders: type and pid.
    flocks: HashMap<u64, (i32, u32)>,
    /// How many of them hold it exclusively.
    flock_writers: usize,
    /// Records and owners held (POSIX and `flock`), as charged.
    records: u64,
    owners: u64,
}

impl FileLocks {
    fn is_empty(&self) -> bool {
        self.owned.is_empty() && self.flocks.is_empty()
    }

    fn charge(&self) -> u64 {
        self.records * LOCK_COST + self.owners * LOCK_OWNER_COST
    }

    /// The POSIX lock of another owner that keeps `owner` from taking
    /// `typ` over `[s, e]`, as F_GETLK reports it: the first in the range.
    fn posix_conflict(&self, owner: u64, typ: i32, s: u64, e: u64) -> Option<Lock> {
        if typ == libc::F_UNLCK {
            return None;
        }
        // Write locks are disjoint and sorted: the one holding `s`, if any,
        // then those starting up to `e`. The caller's own ones among them
        // are what it is about to replace.
        let from = match self.writes.range(..=s).next_back() {
            Some((&start, w)) if w.end >= s => start,
            _ => s,
        };
        let write = self.writes.range(from..=e).find(|(_, w)| {
            step();
            w.owner != owner
        });
        let write = write.map(|(&start, w)| Lock {
            start,
            end: w.end,
            typ: libc::F_WRLCK,
            pid: w.pid,
        });
        let read = (typ == libc::F_WRLCK)
            .then(|| self.reads.find(s, e, owner))
            .flatten()
            .map(|r| Lock {
                start: r.start,
                end: r.end,
                typ: libc::F_RDLCK,
                pid: r.pid,
            });
        // The one that starts first, as the kernel's list would give it.
        match (write, read) {
            (Some(w), Some(r)) => Some(if r.start < w.start { r } else { w }),
            (w, r) => w.or(r),
        }
    }

    /// Whether another owner's `flock` keeps `owner` from taking `typ`.
    fn flock_conflict(&self, owner: u64, typ: i32) -> bool {
        let mine = self.flocks.get(&owner);
        let others = self.flocks.len() - usize::from(mine.is_some());
        let other_writers = self.flock_writers - usize::from(mine.is_some_and(|m| m.0 == libc::F_WRLCK));
        match typ {
            libc::F_WRLCK => others > 0,
            libc::F_RDLCK => other_writers > 0,
            _ => false,
        }
    }

    /// What setting (or, with `F_UNLCK`, clearing) `owner`'s POSIX lock
    /// over `[s, e]` changes: the owner's records it removes and those it
    /// adds. Collects the owner's records that overlap the range or touch
    /// it: the last ones starting at or before `e + 1` (disjoint, so
    /// sorted by end too) down to the first ending before `s - 1`.
    fn plan(&self, owner: u64, lock: &Lock) -> Plan {
        let (s, e, typ) = (lock.start, lock.end, lock.typ);
        let mut plan = Plan::default();
        let Some(own) = self.owned.get(&owner) else {
            if typ != libc::F_UNLCK {
                plan.add.push((
                    s,
                    Rec {
                        end: e,
                        typ,
                        pid: lock.pid,
                    },
                ));
            }
            return plan;
        };
        let (lo, hi) = (s.saturating_sub(1), e.saturating_add(1));
        let (mut ns, mut ne) = (s, e);
        for (&start, &r) in own.range(..=hi).rev() {
            step();
            if r.end < lo {
                break;
            }
            let overlaps = start <= e && r.end >= s;
            if typ != libc::F_UNLCK && r.typ == typ {
                // Same type, overlapping or touching: one lock.
                ns = ns.min(start);
                ne = ne.max(r.end);
                plan.remove.push((start, r));
            } else if overlaps {
                plan.remove.push((start, r));
                if start < s {
                    plan.add.push((start, Rec { end: s - 1, ..r }));
                }
                if r.end > e {
                    plan.add.push((e + 1, r));
                }
            }
        }
        if typ != libc::F_UNLCK {
            plan.add.push((
                ns,
                Rec {
                    end: ne,
                    typ,
                    pid: lock.pid,
                },
            ));
        }
        plan
    }

    /// How many records and owners `plan` adds (negative: removes).
    fn growth(&self, owner: u64, plan: &Plan) -> (i64, i64) {
        let records = plan.add.len() as i64 - plan.remove.len() as i64;
        let had = self.owned.get(&owner).map_or(0, BTreeMap::len) as i64;
        let owners = match (had > 0, had + records > 0) {
            (false, true) => 1,
            (true, false) => -1,
            _ => 0,
        };
        (records, owners)
    }

    fn commit(&mut self, owner: u64, plan: Plan) {
        let (records, owners) = self.growth(owner, &plan);
        let own = self.owned.entry(owner).or_default();
        for (start, r) in plan.remove {
            own.remove(&start);
            if r.typ == libc::F_WRLCK {
                self.writes.remove(&start);
            } else {
                self.reads.remove(start, owner);
            }
        }
        release_if_empty(&mut self.writes);
        for (start, r) in plan.add {
            own.insert(start, r);
            if r.typ == libc::F_WRLCK {
                self.writes.insert(
                    start,
                    Span {
                        end: r.end,
                        owner,
                        pid: r.pid,
                    },
                );
            } else {
                self.reads.insert(start, r.end, owner, r.pid);
            }
        }
        if own.is_empty() {
            self.owned.remove(&owner);
            shrink(&mut self.owned);
        }
        self.records = self.records.saturating_add_signed(records);
        self.owners = self.owners.saturating_add_signed(owners);
    }

    /// Drops every POSIX lock of `owner`; whether there was one.
    fn drop_posix(&mut self, owner: u64) -> bool {
        let Some(own) = self.owned.remove(&owner) else {
            return false;
        };
        shrink(&mut self.owned);
        self.records -= own.len() as u64;
        self.owners -= 1;
        for (start, r) in own {
            step();
            if r.typ == libc::F_WRLCK {
                self.writes.remove(&start);
            } else {
                self.reads.remove(start, owner);
            }
        }
        release_if_empty(&mut self.writes);
        true
    }

    /// Sets or clears `owner`'s `flock`.
    fn set_flock(&mut self, owner: u64, typ: i32, pid: u32) {
        let old = if typ == libc::F_UNLCK {
            self.flocks.remove(&owner)
        } else {
            self.flocks.insert(owner, (typ, pid))
        };
        if old.is_some_and(|o| o.0 == libc::F_WRLCK) {
            self.flock_writers -= 1;
        }
        if typ == libc::F_WRLCK {
            self.flock_writers += 1;
        }
        match (old.is_some(), typ != libc::F_UNLCK) {
            (false, true) => {
                self.records += 1;
                self.owners += 1;
            }
            (true, false) => {
                self.records -= 1;
                self.owners -= 1;
                shrink(&mut self.flocks);
            }
            _ => {}
        }
    }
}

/// The records a POSIX lock request removes and adds.
#[derive(Default)]
struct Plan {
    remove: Vec<(u64, Rec)>,
    add: Vec<(u64, Rec)>,
}

struct Table {
    /// Boxed: an empty slot of the map costs a pointer, not a `FileLocks`.
    files: HashMap<u64, Box<FileLocks>>,
    /// Bytes reserved from the capacity for all records and owners.
    charged: u64,
}

/// The lock table.
pub struct Locks {
    table: Mutex<Table>,
    changed: Condvar,
    cap: Arc<Capacity>,
    /// Files with locks (written under the mutex): FLUSH and RELEASE skip
    /// the mutex when nothing is locked.
    busy: AtomicUsize,
}

type Guard<'a> = MutexGuard<'a, Table>;

/// Why a lock could not be taken now.
enum Refusal {
    /// Another owner's lock is in the way: try again when the table changes.
    Conflict,
    /// Fails now: ENOLCK (no room for the records) or EBADF (the file is
    /// not open).
    Error(Errno),
}

impl Locks {
    pub fn new(cap: Arc<Capacity>) -> Locks {
        Locks {
            table: Mutex::new(Table {
                files: HashMap::new(),
                charged: 0,
            }),
            changed: Condvar::new(),
            cap,
            busy: AtomicUsize::new(0),
        }
    }

    fn table(&self) -> Guard<'_> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes the table is charged for.
    #[cfg(test)]
    pub fn charged(&self) -> u64 {
        self.table().charged
    }

    /// Sets a lock as SETLK would; whether it was granted.
    #[cfg(test)]
    pub fn set(&self, ino: u64, owner: u64, flock: bool, lock: Lock) -> bool {
        self.try_set(&mut self.table(), ino, owner, flock, &lock).is_ok()
    }

    /// Every lock held, one line each, sorted.
    #[cfg(test)]
    pub fn held(&self) -> Vec<String> {
        let t = self.table();
        let mut out = vec![format!("charged {}", t.charged)];
        for (ino, f) in &t.files {
            for (owner, recs) in &f.owned {
                for (start, r) in recs {
                    out.push(format!(
                        "{ino} posix {owner} {start}..={} {} {}",
                        r.end, r.typ, r.pid
                    ));
                }
            }
            for (owner, (typ, pid)) in &f.flocks {
                out.push(format!("{ino} flock {owner} {typ} {pid}"));
            }
            out.push(format!("{ino} records {} owners {}", f.records, f.owners));
        }
        out.sort();
        out
    }

    /// Forgets `ino`'s entry if it holds nothing, and publishes the count
    /// of files with locks.
    fn tidy(&self, t: &mut Table, ino: u64) {
        if t.files.get(&ino).is_some_and(|f| f.is_empty()) {
            t.files.remove(&ino);
            shrink(&mut t.files);
        }
        self.busy.store(t.files.len(), Ordering::Release);
    }

    /// Sets `lock` for `owner` on `ino` if nothing is in the way and the
    /// records fit in the capacity; changes nothing otherwise.
    fn try_set(&self, t: &mut Table, ino: u64, owner: u64, flock: bool, lock: &Lock) -> Result<(), Refusal> {
        let f = t.files.entry(ino).or_default();
        let before = f.charge();
        let enolck = Refusal::Error(Errno::ENOLCK);
        let result = if flock {
            let new = lock.typ != libc::F_UNLCK && !f.flocks.contains_key(&owner);
            if f.flock_conflict(owner, lock.typ) {
                Err(Refusal::Conflict)
            } else if new && self.cap.reserve_bytes(LOCK_COST + LOCK_OWNER_COST).is_err() {
                Err(enolck)
            } else {
                f.set_flock(owner, lock.typ, lock.pid);
                Ok(())
            }
        } else if f.posix_conflict(owner, lock.typ, lock.start, lock.end).is_some() {
            Err(Refusal::Conflict)
        } else {
            let plan = f.plan(owner, lock);
            let (records, owners) = f.growth(owner, &plan);
            let need = records * LOCK_COST as i64 + owners * LOCK_OWNER_COST as i64;
            if need > 0 && self.cap.reserve_bytes(need as u64).is_err() {
                Err(enolck)
            } else {
                f.commit(owner, plan);
                Ok(())
            }
        };
        // Growth was reserved above; what was freed goes back.
        let after = f.charge();
        if after < before {
            self.cap.release_bytes(before - after);
        }
        t.charged = t.charged + after - before;
        self.tidy(t, ino);
        result
    }

    /// GETLK: the first lock that conflicts with `lock`, or `F_UNLCK`.
    pub fn getlk(&self, ino: u64, owner: LockOwner, lock: Lock, reply: ReplyLock) {
        let t = self.table();
        let found = t
            .files
            .get(&ino)
            .and_then(|f| f.posix_conflict(owner.0, lock.typ, lock.start, lock.end));
        drop(t);
        match found {
            Some(held) => reply.lock(held),
            None => reply.lock(Lock {
                typ: libc::F_UNLCK,
                ..lock
            }),
        }
    }

    /// SETLK and SETLKW (`sleep`), for POSIX locks or `flock`. `is_open`
    /// says whether the file still has an open file: a lock is only taken
    /// while it has (see `drop_file`).
    #[allow(clippy::too_many_arguments)]
    pub fn setlk(
        self: &Arc<Self>,
        ctx: &RequestContext<'_>,
        ino: u64,
        owner: LockOwner,
        mut lock: Lock,
        sleep: bool,
        flock: bool,
        is_open: impl Fn() -> bool + Send + 'static,
        reply: ReplyEmpty,
    ) {
        if !matches!(lock.typ, libc::F_RDLCK | libc::F_WRLCK | libc::F_UNLCK) || lock.start > lock.end {
            return reply.error(Errno::EINVAL);
        }
        if flock {
            (lock.start, lock.end) = (0, u64::MAX);
        }
        if lock.pid == 0 {
            lock.pid = ctx.pid();
        }
        let owner = owner.0;
        {
            let mut t = self.table();
            let r = if is_open() {
                self.try_set(&mut t, ino, owner, flock, &lock)
            } else {
                Err(Refusal::Error(Errno::EBADF))
            };
            match r {
                Ok(()) => {
                    drop(t);
                    self.changed.notify_all();
                    return reply.ok();
                }
                Err(Refusal::Error(e)) => return reply.error(e),
                Err(Refusal::Conflict) => {}
            }
        }
        if !sleep {
            return reply.error(Errno::EAGAIN);
        }
        if ctx.is_interrupted() {
            return reply.error(Errno::EINTR);
        }
        let locks = self.clone();
        let deferred = ctx.defer(reply, move |reply, wait| {
            let waker = locks.clone();
            wait.on_interrupt(move || {
                let _t = waker.table();
                waker.changed.notify_all();
            });
            let mut t = locks.table();
            loop {
                if wait.is_interrupted() {
                    return reply.error(Errno::EINTR);
                }
                if !is_open() {
                    return reply.error(Errno::EBADF);
                }
                match locks.try_set(&mut t, ino, owner, flock, &lock) {
                    Ok(()) => {
                        drop(t);
                        locks.changed.notify_all();
                        return reply.ok();
                    }
                    Err(Refusal::Error(e)) => return reply.error(e),
                    Err(Refusal::Conflict) => {}
                }
                t = locks.changed.wait(t).unwrap_or_else(|e| e.into_inner());
            }
        });
        if let Err(refused) = deferred {
            log::debug!("lock wait of uid {} refused: {:?}", ctx.uid(), refused.reason);
            refused.into_reply().error(Errno::ENOLCK);
        }
    }

    /// Drops every lock of `owner` on `ino` of one kind (a process closed
    /// a descriptor of the file: its POSIX locks go; the last close of an
    /// open file: its `flock`).
    pub fn drop_owner(&self, ino: u64, owner: LockOwner, flock: bool) {
        if self.busy.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut guard = self.table();
        let t = &mut *guard;
        let Some(f) = t.files.get_mut(&ino) else {
            return;
        };
        let before = f.charge();
        let changed = if flock {
            let had = f.flocks.contains_key(&owner.0);
            f.set_flock(owner.0, libc::F_UNLCK, 0);
            had
        } else {
            f.drop_posix(owner.0)
        };
        let freed = before - f.charge();
        self.cap.release_bytes(freed);
        t.charged -= freed;
        self.tidy(t, ino);
        drop(guard);
        if changed {
            self.changed.notify_all();
        }
    }

    /// Drops every lock left on `ino` if `is_closed` still says, under the
    /// table's lock, that the file has no open file. Locks are only taken
    /// while it has one, so none can appear after this.
    pub fn drop_file(&self, ino: u64, is_closed: impl Fn() -> bool) {
        if self.busy.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut t = self.table();
        if !t.files.contains_key(&ino) || !is_closed() {
            return;
        }
        if let Some(f) = t.files.remove(&ino) {
            self.cap.release_bytes(f.charge());
            t.charged -= f.charge();
        }
        shrink(&mut t.files);
        self.tidy(&mut t, ino);
        drop(t);
        self.changed.notify_all();
    }
}

/// Handing the table over to a successor (see `keep.rs`).
impl Locks {
    /// Writes every lock: per file, each owner's POSIX records, then the
    /// `flock` holders.
    pub fn encode<W: Write>(&self, e: &mut Enc<W>) -> io::Result<()> {
        let t = self.table();
        e.u64(t.files.len() as u64)?;
        for (&ino, f) in &t.files {
            e.u64(ino)?;
            e.u64(f.owned.len() as u64)?;
            for (&owner, recs) in &f.owned {
                e.u64(owner)?;
                e.u64(recs.len() as u64)?;
                for (&start, r) in recs {
                    e.u64(start)?;
                    e.u64(r.end)?;
                    e.u32(r.typ as u32)?;
                    e.u32(r.pid)?;
                }
            }
            e.u64(f.flocks.len() as u64)?;
            for (&owner, &(typ, pid)) in &f.flocks {
                e.u64(owner)?;
                e.u32(typ as u32)?;
                e.u32(pid)?;
            }
        }
        Ok(())
    }

    /// Takes back what [`encode`](Self::encode) wrote, each lock set as a
    /// request would set it (charged to the capacity). Refuses a lock on a
    /// file that `is_open` says is not open (none can be held there), one
    /// that conflicts with another, or a lock type that does not exist.
    pub fn decode<R: Read>(&self, d: &mut Dec<R>, is_open: impl Fn(u64) -> bool) -> io::Result<()> {
        let mut t = self.table();
        let files = d.count(24, "locked files")?;
        for _ in 0..files {
            let ino = d.u64()?;
            if !is_open(ino) {
                return Err(bad(format!("locks on inode {ino}, which is not open")));
            }
            let set = |t: &mut Table, owner: u64, flock: bool, lock: Lock| {
                if !matches!(lock.typ, libc::F_RDLCK | libc::F_WRLCK) || lock.start > lock.end {
                    return Err(bad(format!(
                        "a lock of type {} over {}..={}",
                        lock.typ, lock.start, lock.end
                    )));
                }
                match self.try_set(t, ino, owner, flock, &lock) {
                    Ok(()) => Ok(()),
                    Err(Refusal::Conflict) => Err(bad(format!("conflicting locks on inode {ino}"))),
                    Err(Refusal::Error(e)) => Err(bad(format!("a lock on inode {ino}: {e}"))),
                }
            };
            let owners = d.count(16, "lock owners")?;
            for _ in 0..owners {
                let owner = d.u64()?;
                let recs = d.count(24, "locks")?;
                for _ in 0..recs {
                    let (start, end) = (d.u64()?, d.u64()?);
                    let (typ, pid) = (d.u32()? as i32, d.u32()?);
                    set(&mut t, owner, false, Lock { start, end, typ, pid })?;
                }
            }
            let flocks = d.count(16, "flock holders")?;
            for _ in 0..flocks {
                let owner = d.u64()?;
                let (typ, pid) = (d.u32()? as i32, d.u32()?);
                let lock = Lock {
                    start: 0,
                    end: u64::MAX,
                    typ,
                    pid,
                };
                set(&mut t, owner, true, lock)?;
            }
        }
        Ok(())
    }
}

/// Counts a record visited (see `readset.rs`); nothing outside tests.
#[inline]
fn step() {
    #[cfg(test)]
    super::readset::tests::STEPS.with(|s| s.set(s.get() + 1));
}

#[cfg(test)]
mod tests {
    use super::super::readset::tests::steps_of;
    use super::*;

    const W: i32 = libc::F_WRLCK;
    const R: i32 = libc::F_RDLCK;
    const U: i32 = libc::F_UNLCK;

    fn lk(typ: i32, start: u64, end: u64, pid: u32) -> Lock {
        Lock { start, end, typ, pid }
    }

    /// A table driven without a session: `set` is SETLK's decision.
    struct T {
        locks: Locks,
    }

    impl T {
        fn new(size: u64) -> T {
            T {
                locks: Locks::new(Arc::new(Capacity::new(size, 0))),
            }
        }

        fn set(&self, owner: u64, l: Lock) -> Result<(), i32> {
            let mut t = self.locks.table();
            match self.locks.try_set(&mut t, 1, owner, false, &l) {
                Ok(()) => Ok(()),
                Err(Refusal::Conflict) => Err(libc::EAGAIN),
                Err(Refusal::Error(e)) => Err(e.get()),
            }
        }

        fn flock(&self, owner: u64, typ: i32) -> Result<(), i32> {
            let mut t = self.locks.table();
            let l = lk(typ, 0, u64::MAX, owner as u32);
            match self.locks.try_set(&mut t, 1, owner, true, &l) {
                Ok(()) => Ok(()),
                Err(Refusal::Conflict) => Err(libc::EAGAIN),
                Err(Refusal::Error(e)) => Err(e.get()),
            }
        }

        fn get(&self, owner: u64, typ: i32, start: u64, end: u64) -> Option<Lock> {
            let t = self.locks.table();
            t.files
                .get(&1)
                .and_then(|f| f.posix_conflict(owner, typ, start, end))
        }

        /// An owner's records as (start, end, type).
        fn held(&self, owner: u64) -> Vec<(u64, u64, i32)> {
            let t = self.locks.table();
            t.files
                .get(&1)
                .and_then(|f| f.owned.get(&owner))
                .map(|m| m.iter().map(|(&s, r)| (s, r.end, r.typ)).collect())
                .unwrap_or_default()
        }

        fn used(&self) -> u64 {
            self.locks.cap.bytes_used()
        }
    }

    #[test]
    fn split_merge_and_replace_like_the_kernel() {
        let t = T::new(0);
        t.set(1, lk(W, 0, 99, 10)).unwrap();
        // An unlock in the middle splits.
        t.set(1, lk(U, 40, 59, 10)).unwrap();
        assert_eq!(t.held(1), vec![(0, 39, W), (60, 99, W)]);
        // A lock of the same type bridging the gap merges all three.
        t.set(1, lk(W, 40, 59, 10)).unwrap();
        assert_eq!(t.held(1), vec![(0, 99, W)]);
        // Touching ranges of one type merge; of another, they stay apart.
        t.set(1, lk(W, 100, 109, 10)).unwrap();
        assert_eq!(t.held(1), vec![(0, 109, W)]);
        t.set(1, lk(R, 110, 119, 10)).unwrap();
        assert_eq!(t.held(1), vec![(0, 109, W), (110, 119, R)]);
        // A read lock inside a write lock cuts it in three.
        t.set(1, lk(R, 50, 59, 10)).unwrap();
        assert_eq!(
            t.held(1),
            vec![(0, 49, W), (50, 59, R), (60, 109, W), (110, 119, R)]
        );
        // Whole-range unlock clears everything.
        t.set(1, lk(U, 0, u64::MAX, 10)).unwrap();
        assert_eq!(t.held(1), vec![]);
        assert_eq!(t.used(), 0, "everything given back");
        assert!(t.locks.table().files.is_empty());
    }

    #[test]
    fn conflicts_and_getlk_reports() {
        let t = T::new(0);
        t.set(1, lk(R, 0, 9, 10)).unwrap();
        t.set(2, lk(R, 5, 14, 20)).unwrap();
        // Readers share; a writer is refused, and GETLK names a holder.
        assert_eq!(t.set(3, lk(W, 12, 12, 30)), Err(libc::EAGAIN));
        assert_eq!(t.get(3, W, 12, 12), Some(lk(R, 5, 14, 20)));
        assert_eq!(t.get(2, W, 12, 12), None, "its own lock is no conflict");
        assert_eq!(t.get(2, W, 0, 3), Some(lk(R, 0, 9, 10)));
        assert_eq!(t.get(3, R, 0, 100), None, "reads do not conflict");
        // Upgrading needs the others gone.
        assert_eq!(t.set(1, lk(W, 0, 9, 10)), Err(libc::EAGAIN));
        t.set(2, lk(U, 0, u64::MAX, 20)).unwrap();
        t.set(1, lk(W, 0, 9, 10)).unwrap();
        assert_eq!(t.get(2, R, 9, 9), Some(lk(W, 0, 9, 10)));
        assert_eq!(t.get(2, R, 10, 10), None);
        // POSIX locks and flock ignore each other; flocks conflict.
        t.flock(5, W).unwrap();
        assert_eq!(t.flock(6, R), Err(libc::EAGAIN));
        t.flock(5, R).unwrap();
        t.flock(6, R).unwrap();
        assert_eq!(t.flock(6, W), Err(libc::EAGAIN));
        t.flock(5, U).unwrap();
        t.flock(6, W).unwrap();
    }

    #[test]
    fn records_are_charged_and_enolck_past_the_capacity() {
        let per_owner = LOCK_OWNER_COST + LOCK_COST;
        // Room for one owner and three records.
        let t = T::new(LOCK_OWNER_COST + 3 * LOCK_COST);
        t.set(1, lk(W, 0, 0, 1)).unwrap();
        assert_eq!(t.used(), per_owner);
        t.set(1, lk(W, 2, 2, 1)).unwrap();
        t.set(1, lk(W, 4, 4, 1)).unwrap();
        assert_eq!(t.used(), LOCK_OWNER_COST + 3 * LOCK_COST);
        // A fourth record does not fit, and nothing changed.
        assert_eq!(t.set(1, lk(W, 6, 6, 1)), Err(libc::ENOLCK));
        assert_eq!(t.held(1), vec![(0, 0, W), (2, 2, W), (4, 4, W)]);
        // Merging frees records: [0, 4] is one.
        t.set(1, lk(W, 1, 3, 1)).unwrap();
        assert_eq!(t.held(1), vec![(0, 4, W)]);
        assert_eq!(t.used(), per_owner);
        // An unlock that splits needs a record too; a second owner needs
        // its own charge.
        t.set(1, lk(U, 2, 2, 1)).unwrap();
        assert_eq!(t.used(), LOCK_OWNER_COST + 2 * LOCK_COST);
        assert_eq!(t.set(2, lk(W, 10, 10, 2)), Err(libc::ENOLCK));
        assert_eq!(t.flock(3, W), Err(libc::ENOLCK));
        // Dropping the owner (FLUSH) gives it all back.
        t.locks.drop_owner(1, LockOwner(1), false);
        assert_eq!(t.used(), 0);
        assert_eq!(t.locks.charged(), 0);
    }

    #[test]
    fn drop_file_only_when_closed() {
        let t = T::new(0);
        t.set(1, lk(W, 0, 0, 1)).unwrap();
        t.flock(2, W).unwrap();
        t.locks.drop_file(1, || false);
        assert_eq!(t.held(1).len(), 1);
        t.locks.drop_file(1, || true);
        assert_eq!(t.held(1).len(), 0);
        assert_eq!(t.used(), 0);
        assert_eq!(t.locks.busy.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn many_locks_of_one_owner_do_not_make_insertion_scan() {
        let t = T::new(0);
        let n = 20_000u64;
        // Alternating one-byte locks: none merges with another.
        for i in 0..n {
            t.set(1, lk(W, 2 * i, 2 * i, 1)).unwrap();
        }
        assert_eq!(t.held(1).len(), n as usize);
        assert_eq!(t.used(), LOCK_OWNER_COST + n * LOCK_COST);
        let (r, steps) = steps_of(|| t.set(1, lk(W, 2 * n, 2 * n, 1)));
        r.unwrap();
        assert!(steps < 20, "inserting the next lock visited {steps} records");
        // Another owner's lock in the middle: a conflict found without a scan.
        let (r, steps) = steps_of(|| t.set(2, lk(W, n, n, 2)));
        assert_eq!(r, Err(libc::EAGAIN));
        assert!(steps < 20, "a conflict check visited {steps} records");
        // Read locks of many owners, each one byte, then a writer's test.
        for i in 0..n {
            t.set(100 + i, lk(R, 4 * n + i, 4 * n + i, 1)).unwrap();
        }
        let (found, steps) = steps_of(|| t.get(1, W, 5 * n - 1, 5 * n - 1));
        assert!(found.is_some());
        assert!(steps < 300, "a read-lock conflict visited {steps} nodes");
        let (found, steps) = steps_of(|| t.get(1, W, 6 * n, 7 * n));
        assert!(found.is_none());
        assert!(steps < 300, "a test that finds nothing visited {steps} nodes");
    }

    /// The charges against the memory the records really hold (counted by
    /// `alloc_count.rs`), as locks are taken and dropped. An empty table
    /// keeps a few slots of its maps: at most `SLACK` bytes.
    #[test]
    fn charges_cover_the_records() {
        use super::super::alloc_count::held;
        const SLACK: i64 = 1024;
        let t = T::new(0);
        let start = held();
        let within = |what: &str| {
            let used = held() - start;
            let charged = t.locks.charged() as i64;
            assert!(
                used <= charged + SLACK,
                "{what}: {used} bytes allocated, {charged} charged"
            );
        };
        // One owner's alternating one-byte write locks.
        for i in 0..5000u64 {
            t.set(1, lk(W, 2 * i, 2 * i, 1)).unwrap();
            within("write locks");
        }
        // Many owners' read locks, one each, and some holding many.
        for i in 0..3000u64 {
            t.set(10 + i % 1000, lk(R, 20_000 + 2 * i, 20_000 + 2 * i, 1))
                .unwrap();
            within("read locks");
        }
        for i in 0..500u64 {
            t.flock(100_000 + i, R).unwrap();
            within("flocks");
        }
        // Splits, then everything dropped owner by owner.
        for i in 0..1000u64 {
            t.set(1, lk(U, 4 * i, 4 * i, 1)).unwrap();
            within("unlocks");
        }
        t.locks.drop_owner(1, LockOwner(1), false);
        within("owner dropped");
        for i in 0..1000u64 {
            t.locks.drop_owner(1, LockOwner(10 + i), false);
            within("owners dropped");
        }
        for i in 0..500u64 {
            t.locks.drop_owner(1, LockOwner(100_000 + i), true);
            within("flocks dropped");
        }
        assert_eq!(t.locks.charged(), 0);
        assert_eq!(t.used(), 0);
        within("empty");
    }
}

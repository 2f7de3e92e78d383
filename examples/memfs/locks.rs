//! POSIX record locks and BSD `flock` locks served by memfs itself (`-o
//! posix_lock`, `-o flock`), so that they hold across every client of the
//! mount, as a network filesystem's would.
//!
//! One table for the whole filesystem, under one mutex: locks are rare and
//! short. A lock belongs to a lock owner (the kernel's id for a process's
//! POSIX locks, or for the open file of a `flock`); POSIX and `flock` locks
//! never conflict with each other, as on Linux. A blocking request (SETLKW)
//! that cannot be granted at once waits on a helper thread of the session
//! ([`RequestContext::defer`]), not on a worker, until the lock is free or
//! the request is interrupted.

use fuse_wire::proto::Errno;
use fuse_wire::session::reply::{ReplyEmpty, ReplyLock};
use fuse_wire::session::{Lock, LockOwner, RequestContext};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[derive(Clone, Copy, Debug)]
struct Held {
    owner: u64,
    flock: bool,
    start: u64,
    /// Inclusive.
    end: u64,
    typ: i32,
    pid: u32,
}

impl Held {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }
}

/// The lock table.
#[derive(Default)]
pub struct Locks {
    held: Mutex<HashMap<u64, Vec<Held>>>,
    changed: Condvar,
}

type Table<'a> = MutexGuard<'a, HashMap<u64, Vec<Held>>>;

/// The held lock that keeps `owner` from taking `lock` on `ino`, if any.
fn conflict(t: &Table<'_>, ino: u64, owner: u64, flock: bool, lock: &Lock) -> Option<Held> {
    if lock.typ == libc::F_UNLCK {
        return None;
    }
    let (start, end) = range(flock, lock);
    t.get(&ino)?
        .iter()
        .find(|h| {
            h.flock == flock
                && h.owner != owner
                && h.overlaps(start, end)
                && (h.typ == libc::F_WRLCK || lock.typ == libc::F_WRLCK)
        })
        .copied()
}

fn range(flock: bool, lock: &Lock) -> (u64, u64) {
    if flock {
        (0, u64::MAX)
    } else {
        (lock.start, lock.end)
    }
}

/// Sets (or, with `F_UNLCK`, clears) `owner`'s lock over the range: the
/// owner's locks there are replaced, those reaching past it are cut.
fn apply(t: &mut Table<'_>, ino: u64, owner: u64, flock: bool, lock: &Lock) {
    let (start, end) = range(flock, lock);
    let list = t.entry(ino).or_default();
    let mut kept = Vec::with_capacity(list.len() + 2);
    for h in list.drain(..) {
        if h.owner != owner || h.flock != flock || !h.overlaps(start, end) {
            kept.push(h);
            continue;
        }
        if h.start < start {
            kept.push(Held { end: start - 1, ..h });
        }
        if h.end > end {
            kept.push(Held { start: end + 1, ..h });
        }
    }
    if lock.typ != libc::F_UNLCK {
        kept.push(Held {
            owner,
            flock,
            start,
            end,
            typ: lock.typ,
            pid: lock.pid,
        });
    }
    if kept.is_empty() {
        t.remove(&ino);
    } else {
        *list = kept;
    }
}

impl Locks {
    fn table(&self) -> Table<'_> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// GETLK: the first lock that conflicts with `lock`, or `F_UNLCK`.
    pub fn getlk(&self, ino: u64, owner: LockOwner, lock: Lock, reply: ReplyLock) {
        let t = self.table();
        match conflict(&t, ino, owner.0, false, &lock) {
            Some(h) => reply.lock(Lock {
                start: h.start,
                end: h.end,
                typ: h.typ,
                pid: h.pid,
            }),
            None => reply.lock(Lock {
                typ: libc::F_UNLCK,
                ..lock
            }),
        }
    }

    /// SETLK and SETLKW (`sleep`), for POSIX locks or `flock`.
    #[allow(clippy::too_many_arguments)]
    pub fn setlk(
        self: &Arc<Self>,
        ctx: &RequestContext<'_>,
        ino: u64,
        owner: LockOwner,
        mut lock: Lock,
        sleep: bool,
        flock: bool,
        reply: ReplyEmpty,
    ) {
        if !matches!(lock.typ, libc::F_RDLCK | libc::F_WRLCK | libc::F_UNLCK) || lock.start > lock.end {
            return reply.error(Errno::EINVAL);
        }
        if lock.pid == 0 {
            lock.pid = ctx.pid();
        }
        let owner = owner.0;
        {
            let mut t = self.table();
            if conflict(&t, ino, owner, flock, &lock).is_none() {
                apply(&mut t, ino, owner, flock, &lock);
                drop(t);
                self.changed.notify_all();
                return reply.ok();
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
                if conflict(&t, ino, owner, flock, &lock).is_none() {
                    apply(&mut t, ino, owner, flock, &lock);
                    drop(t);
                    locks.changed.notify_all();
                    return reply.ok();
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
        let mut t = self.table();
        let before = t.get(&ino).map_or(0, Vec::len);
        if before == 0 {
            return;
        }
        apply(
            &mut t,
            ino,
            owner.0,
            flock,
            &Lock {
                start: 0,
                end: u64::MAX,
                typ: libc::F_UNLCK,
                pid: 0,
            },
        );
        if t.get(&ino).map_or(0, Vec::len) != before {
            drop(t);
            self.changed.notify_all();
        }
    }
}

//! Notifications from the filesystem to the kernel.
//!
//! [`Notifier`] is cheap to clone and may be called from anywhere, including
//! inside a handler: messages are checked at once (is the notification known
//! to the negotiated protocol?), then queued to a dedicated thread that writes
//! them, so a handler never blocks on a kernel lock its own request holds.
//! Each call returns a [`Ticket`] whose [`Ticket::wait`] gives the kernel's
//! answer (never wait inside a handler for an invalidation of the same inode
//! or directory). RETRIEVE's answer, a NOTIFY_REPLY request, is routed back to
//! the caller through a channel.

use crate::init::Negotiated;
use crate::transport::ReplySink;
use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use fuse_proto::flags::{InitFlags, InvalEntryFlags, NotifyCode};
use fuse_proto::reply::notify;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Why a notification was not sent.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// INIT has not completed yet.
    #[error("the session has not completed INIT yet")]
    NotReady,
    /// The kernel's protocol is too old for this notification.
    #[error("{what} needs protocol 7.{needs}, the kernel speaks 7.{minor}")]
    TooOld {
        /// The notification.
        what: &'static str,
        /// Minor needed.
        needs: u32,
        /// Minor negotiated.
        minor: u32,
    },
    /// A needed capability was not negotiated.
    #[error("{0} was not negotiated")]
    NotNegotiated(&'static str),
    /// The message is invalid (name, size).
    #[error("invalid notification: {0}")]
    Invalid(#[from] fuse_proto::reply::EncodeError),
    /// The session has ended.
    #[error("the session has ended")]
    Closed,
    /// The kernel refused the notification.
    #[error("the kernel refused the notification: {0}")]
    Kernel(io::Error),
}

/// The kernel's answer to a RETRIEVE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retrieved {
    /// Offset of the data.
    pub offset: u64,
    /// The cached bytes (possibly fewer than asked for).
    pub data: Vec<u8>,
}

enum Msg {
    Poll(u64),
    InvalInode(u64, i64, i64),
    InvalEntry(u64, Vec<u8>, InvalEntryFlags),
    Delete(u64, u64, Vec<u8>),
    Store(u64, u64, Vec<u8>),
    Retrieve(u64, u64, u64, u32),
    Resend,
    IncEpoch,
    Prune(Vec<u64>),
}

struct Job {
    msg: Msg,
    done: Sender<Result<(), NotifyError>>,
}

pub(crate) struct NotifyShared {
    jobs: Mutex<Option<Sender<Job>>>,
    negotiated: OnceLock<Negotiated>,
    retrieves: Mutex<HashMap<u64, Sender<Retrieved>>>,
    next_unique: AtomicU64,
}

/// A handle to send notifications; clone freely.
#[derive(Clone)]
pub struct Notifier {
    shared: Arc<NotifyShared>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier").finish_non_exhaustive()
    }
}

/// The pending result of one notification.
#[must_use = "call wait() to learn whether the kernel accepted it, or drop to ignore"]
pub struct Ticket(Receiver<Result<(), NotifyError>>);

impl Ticket {
    /// Blocks until the notification was written; the kernel's verdict.
    pub fn wait(self) -> Result<(), NotifyError> {
        self.0.recv().unwrap_or(Err(NotifyError::Closed))
    }
}

impl Notifier {
    /// Starts the writer thread on `chan`.
    pub(crate) fn start(chan: Arc<dyn ReplySink>) -> io::Result<(Self, std::thread::JoinHandle<()>)> {
        let (tx, rx) = unbounded::<Job>();
        let shared = Arc::new(NotifyShared {
            jobs: Mutex::new(Some(tx)),
            negotiated: OnceLock::new(),
            retrieves: Mutex::new(HashMap::new()),
            next_unique: AtomicU64::new(1),
        });
        let t = std::thread::Builder::new()
            .name("fuse-notify".into())
            .spawn(move || {
                for job in rx {
                    let r = write(&*chan, &job.msg);
                    if let Err(e) = &r {
                        log::warn!("notification not accepted: {e}");
                    }
                    let _ = job.done.send(r);
                }
            })?;
        Ok((Self { shared }, t))
    }

    pub(crate) fn set_negotiated(&self, n: Negotiated) {
        let _ = self.shared.negotiated.set(n);
    }

    /// Stops the writer thread once the queue is drained.
    pub(crate) fn close(&self) {
        self.shared.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.shared
            .retrieves
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Routes a NOTIFY_REPLY to its RETRIEVE caller; false if nobody waits.
    pub(crate) fn deliver_retrieve(&self, unique: u64, offset: u64, data: &[u8]) -> bool {
        let tx = self
            .shared
            .retrieves
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&unique);
        match tx {
            Some(tx) => tx
                .send(Retrieved {
                    offset,
                    data: data.to_vec(),
                })
                .is_ok(),
            None => false,
        }
    }

    fn check(&self, what: &'static str, code: NotifyCode) -> Result<&Negotiated, NotifyError> {
        let n = self.shared.negotiated.get().ok_or(NotifyError::NotReady)?;
        if n.minor < code.since_minor() {
            return Err(NotifyError::TooOld {
                what,
                needs: code.since_minor(),
                minor: n.minor,
            });
        }
        Ok(n)
    }

    fn queue(&self, msg: Msg) -> Result<Ticket, NotifyError> {
        let (done, rx) = bounded(1);
        let jobs = self.shared.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let tx = jobs.as_ref().ok_or(NotifyError::Closed)?;
        tx.send(Job { msg, done }).map_err(|_| NotifyError::Closed)?;
        Ok(Ticket(rx))
    }

    /// Wakes the pollers of `kh` (from a POLL request).
    pub fn poll_wakeup(&self, kh: crate::types::PollHandle) -> Result<Ticket, NotifyError> {
        self.check("POLL", NotifyCode::Poll)?;
        self.queue(Msg::Poll(kh.0))
    }

    /// Invalidates the attributes of `ino` and, if `offset >= 0`, its cached
    /// data from `offset` for `len` bytes (`len <= 0`: to the end).
    pub fn inval_inode(&self, ino: crate::Inode, offset: i64, len: i64) -> Result<Ticket, NotifyError> {
        self.check("INVAL_INODE", NotifyCode::InvalInode)?;
        self.queue(Msg::InvalInode(ino.0, offset, len))
    }

    /// Invalidates `name` in `parent`; with `expire_only` it is only marked
    /// stale (needs the kernel's HAS_EXPIRE_ONLY).
    pub fn inval_entry(
        &self,
        parent: crate::Inode,
        name: &[u8],
        expire_only: bool,
    ) -> Result<Ticket, NotifyError> {
        let n = self.check("INVAL_ENTRY", NotifyCode::InvalEntry)?;
        let mut flags = InvalEntryFlags::empty();
        if expire_only {
            if !n.offered.contains(InitFlags::HAS_EXPIRE_ONLY) {
                return Err(NotifyError::NotNegotiated("HAS_EXPIRE_ONLY"));
            }
            flags |= InvalEntryFlags::EXPIRE_ONLY;
        }
        notify::inval_entry(parent.0, name, flags)?;
        self.queue(Msg::InvalEntry(parent.0, name.to_vec(), flags))
    }

    /// Tells the kernel that `name` in `parent` (which was `child`) is gone.
    pub fn delete(
        &self,
        parent: crate::Inode,
        child: crate::Inode,
        name: &[u8],
    ) -> Result<Ticket, NotifyError> {
        self.check("DELETE", NotifyCode::Delete)?;
        notify::delete(parent.0, child.0, name)?;
        self.queue(Msg::Delete(parent.0, child.0, name.to_vec()))
    }

    /// Puts `data` into the page cache of `ino` at `offset`.
    pub fn store(&self, ino: crate::Inode, offset: u64, data: &[u8]) -> Result<Ticket, NotifyError> {
        self.check("STORE", NotifyCode::Store)?;
        notify::store(ino.0, offset, data)?;
        self.queue(Msg::Store(ino.0, offset, data.to_vec()))
    }

    /// Asks the kernel for `size` cached bytes of `ino` at `offset`; the
    /// answer arrives on the returned receiver.
    pub fn retrieve(
        &self,
        ino: crate::Inode,
        offset: u64,
        size: u32,
    ) -> Result<(Ticket, Receiver<Retrieved>), NotifyError> {
        self.check("RETRIEVE", NotifyCode::Retrieve)?;
        let unique = self.shared.next_unique.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = bounded(1);
        self.shared
            .retrieves
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(unique, tx);
        match self.queue(Msg::Retrieve(unique, ino.0, offset, size)) {
            Ok(t) => Ok((t, rx)),
            Err(e) => {
                self.shared
                    .retrieves
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&unique);
                Err(e)
            }
        }
    }

    /// Asks the kernel to re-send every request it already handed over.
    pub fn resend(&self) -> Result<Ticket, NotifyError> {
        let n = self.check("RESEND", NotifyCode::Resend)?;
        if !n.offered.contains(InitFlags::HAS_RESEND) {
            return Err(NotifyError::NotNegotiated("HAS_RESEND"));
        }
        self.queue(Msg::Resend)
    }

    /// Invalidates every cached entry of older epochs.
    pub fn inc_epoch(&self) -> Result<Ticket, NotifyError> {
        self.check("INC_EPOCH", NotifyCode::IncEpoch)?;
        self.queue(Msg::IncEpoch)
    }

    /// Asks the kernel to evict the unused inodes `inos`.
    pub fn prune(&self, inos: &[crate::Inode]) -> Result<Ticket, NotifyError> {
        self.check("PRUNE", NotifyCode::Prune)?;
        self.queue(Msg::Prune(inos.iter().map(|i| i.0).collect()))
    }
}

fn write(chan: &dyn ReplySink, msg: &Msg) -> Result<(), NotifyError> {
    let r = match msg {
        Msg::Poll(kh) => chan.send(&notify::poll_wakeup(*kh)),
        Msg::InvalInode(ino, off, len) => chan.send(&notify::inval_inode(*ino, *off, *len)),
        Msg::InvalEntry(p, name, flags) => chan.send(&notify::inval_entry(*p, name, *flags)?),
        Msg::Delete(p, c, name) => chan.send(&notify::delete(*p, *c, name)?),
        Msg::Store(ino, off, data) => chan.send(&notify::store(*ino, *off, data)?),
        Msg::Retrieve(u, ino, off, size) => chan.send(&notify::retrieve(*u, *ino, *off, *size)),
        Msg::Resend => chan.send(&notify::resend()),
        Msg::IncEpoch => chan.send(&notify::inc_epoch()),
        Msg::Prune(ids) => chan.send(&notify::prune(ids)?),
    };
    r.map_err(NotifyError::Kernel)
}

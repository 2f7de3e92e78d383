//! An in-memory fake kernel, so that the whole session (parsing, dispatch,
//! replies, interrupts, notifications) can be tested byte for byte without
//! `/dev/fuse`. Tests push raw request bytes with [`FakeKernel::send`] and
//! read the exact bytes the session wrote with [`FakeKernel::recv`].

use super::{Channel, ReplySink, RequestSource};
use crossbeam_channel::{Receiver, Sender, unbounded};
use fuse_proto::Reply;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One message the session wrote: which channel it used, and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// 0 for the first channel, then 1, 2, … in the order clones were made.
    pub channel: usize,
    /// The exact bytes.
    pub bytes: Vec<u8>,
}

struct Shared {
    requests: Receiver<Vec<u8>>,
    written: Sender<Written>,
    clones: AtomicUsize,
    /// Per channel: (receives, those of them with a timeout).
    receives: Mutex<Vec<(usize, usize)>>,
}

impl Shared {
    fn count_receive(&self, channel: usize, timed: bool) {
        let mut r = self.receives.lock().unwrap_or_else(|e| e.into_inner());
        if r.len() <= channel {
            r.resize(channel + 1, (0, 0));
        }
        r[channel].0 += 1;
        r[channel].1 += usize::from(timed);
    }
}

/// The test's side of the fake connection.
pub struct FakeKernel {
    requests: Mutex<Option<Sender<Vec<u8>>>>,
    written: Receiver<Written>,
    shared: Arc<Shared>,
}

/// The session's side: a [`Channel`] reading what the fake kernel sends.
pub struct FakeChannel {
    shared: Arc<Shared>,
    id: usize,
}

impl FakeKernel {
    /// A new fake connection and its first channel.
    pub fn new() -> (Self, Arc<dyn Channel>) {
        let (req_tx, req_rx) = unbounded();
        let (w_tx, w_rx) = unbounded();
        let shared = Arc::new(Shared {
            requests: req_rx,
            written: w_tx,
            clones: AtomicUsize::new(1),
            receives: Mutex::new(Vec::new()),
        });
        let chan: Arc<dyn Channel> = Arc::new(FakeChannel {
            shared: shared.clone(),
            id: 0,
        });
        (
            Self {
                requests: Mutex::new(Some(req_tx)),
                written: w_rx,
                shared,
            },
            chan,
        )
    }

    /// Queues one request (raw bytes, header included).
    pub fn send(&self, bytes: Vec<u8>) {
        if let Some(tx) = self.requests.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let _ = tx.send(bytes);
        }
    }

    /// The next message the session wrote, waiting up to `timeout`.
    pub fn recv(&self, timeout: Duration) -> Option<Written> {
        self.written.recv_timeout(timeout).ok()
    }

    /// Simulates unmount: once queued requests are consumed, every receive
    /// returns `ENODEV`.
    pub fn unmount(&self) {
        self.requests.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// How many receives the session has started on `channel`, and how many
    /// of them with a timeout ([`RequestSource::receive_timeout`]).
    pub fn receives(&self, channel: usize) -> (usize, usize) {
        let r = self.shared.receives.lock().unwrap_or_else(|e| e.into_inner());
        r.get(channel).copied().unwrap_or((0, 0))
    }

    /// How many channels exist (1 + clones made).
    pub fn channels(&self) -> usize {
        self.shared.clones.load(Ordering::Relaxed)
    }
}

impl RequestSource for FakeChannel {
    fn receive(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.shared.count_receive(self.id, false);
        let req = self
            .shared
            .requests
            .recv()
            .map_err(|_| io::Error::from_raw_os_error(libc::ENODEV))?;
        if req.len() > buf.len() {
            // The kernel refuses reads into buffers that are too small.
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        buf[..req.len()].copy_from_slice(&req);
        Ok(req.len())
    }

    fn receive_timeout(&self, buf: &mut [u8], timeout: Duration) -> io::Result<usize> {
        self.shared.count_receive(self.id, true);
        let req = match self.shared.requests.recv_timeout(timeout) {
            Ok(r) => r,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
            }
            Err(_) => return Err(io::Error::from_raw_os_error(libc::ENODEV)),
        };
        if req.len() > buf.len() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        buf[..req.len()].copy_from_slice(&req);
        Ok(req.len())
    }

    fn try_clone(&self) -> io::Result<Arc<dyn Channel>> {
        let id = self.shared.clones.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(FakeChannel {
            shared: self.shared.clone(),
            id,
        }))
    }
}

impl ReplySink for FakeChannel {
    fn send(&self, msg: &Reply<'_>) -> io::Result<()> {
        let _ = self.shared.written.send(Written {
            channel: self.id,
            bytes: msg.to_vec(),
        });
        Ok(())
    }

    fn raw_fd(&self) -> Option<RawFd> {
        None
    }

    fn describe(&self) -> String {
        format!("fake channel {}", self.id)
    }
}

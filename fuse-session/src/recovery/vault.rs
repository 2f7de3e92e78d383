//! The vault: descriptors a daemon under a keeper deposits with it, so that
//! they outlive the daemon.
//!
//! A daemon's open files die with it, and an open file of a name removed
//! since cannot be opened again. So a daemon under a keeper deposits every
//! descriptor a client's open file (or its own shared memory, see
//! [`crate::region`]) rests on, under a key of its choosing, before it
//! answers the request that made it; it withdraws the descriptor when the
//! kernel releases the file. The keeper holds a duplicate of each, and
//! hands them all to the next daemon ([`Vault::take_deposits`]).
//!
//! The link is a sequenced-packet socket (one message a deposit, never
//! split or merged, so any thread may deposit without a lock). A deposit is
//! safe once [`Vault::deposit`] returns: the descriptor is in flight in the
//! socket, and the keeper reads what a dead daemon sent before it sees the
//! socket close. Messages, daemon to keeper: `D` + key (8 bytes, little
//! endian) with one descriptor; `W` + key. Keeper to daemon, at start:
//! `P` + keys with as many descriptors, repeated, then `E`.
//!
//! Keys with the top bit set belong to the library (the journal of
//! requests in flight, [`crate::journal`]).
//!
//! A daemon run as a systemd service can use systemd's file-descriptor
//! store instead of a keeper ([`Vault::in_fdstore`], [`crate::fdstore`]):
//! the same calls, each a notification to the service manager.

use crate::fdstore::FdStore;
use crate::handover::{HandoverError, recv_fds, send_with_fds};
use crate::region::SharedRegion;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Keys from here on are the library's own.
pub const RESERVED_KEYS: u64 = 1 << 63;

/// Descriptors in one message from the keeper.
const BATCH: usize = 250;

/// A daemon's side of the vault. Cheap to clone; any thread may use it.
#[derive(Clone, Debug)]
pub struct Vault {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: Backend,
    left: Mutex<Vec<(u64, OwnedFd)>>,
}

/// Who holds the deposits.
#[derive(Debug)]
enum Backend {
    /// A keeper process ([`crate::keeper`]), over a sequenced-packet socket.
    Keeper(OwnedFd),
    /// systemd's file-descriptor store ([`crate::fdstore`]).
    Systemd(Arc<FdStore>),
}

/// The name a deposit has in systemd's store.
pub(crate) fn fdstore_name(key: u64) -> String {
    format!("fw-k{key:x}")
}

/// Why a vault message was refused.
fn bad(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Vault {
    /// Opens the vault on the socket the keeper sent, receiving what the
    /// predecessors deposited and did not withdraw.
    pub(crate) fn open(sock: OwnedFd) -> Result<Vault, HandoverError> {
        set_timeout(sock.as_fd(), libc::SO_RCVTIMEO, Duration::from_secs(30))?;
        let mut left = Vec::new();
        let mut buf = vec![0u8; 1 + 8 * BATCH];
        loop {
            let (fds, n) = recv_fds(&sock, &mut buf, BATCH)?;
            match buf[0] {
                b'E' if n == 1 => break,
                b'P' if (n - 1) % 8 == 0 && (n - 1) / 8 == fds.len() => {
                    for (k, fd) in buf[1..n].chunks_exact(8).zip(fds) {
                        left.push((u64::from_le_bytes(k.try_into().unwrap_or_default()), fd));
                    }
                }
                _ => return Err(HandoverError::Invalid("vault message from the keeper")),
            }
        }
        set_timeout(sock.as_fd(), libc::SO_RCVTIMEO, Duration::ZERO)?;
        Ok(Vault {
            inner: Arc::new(Inner {
                backend: Backend::Keeper(sock),
                left: Mutex::new(left),
            }),
        })
    }

    /// A vault in systemd's file-descriptor store: what the store passed
    /// this process under deposit names (`fw-k` and the key in hex) is what the
    /// predecessors left.
    pub fn in_fdstore(store: Arc<FdStore>) -> Vault {
        let left = store
            .take_prefixed("fw-k")
            .into_iter()
            .filter_map(|(name, fd)| match u64::from_str_radix(&name[4..], 16) {
                Ok(k) => Some((k, fd)),
                Err(_) => {
                    log::warn!("fd store: ignoring {name:?}, not a deposit of this library");
                    None
                }
            })
            .collect();
        Vault {
            inner: Arc::new(Inner {
                backend: Backend::Systemd(store),
                left: Mutex::new(left),
            }),
        }
    }

    /// Has the keeper hold a duplicate of `fd` under `key` (replacing what
    /// it held under that key), until [`Vault::withdraw`].
    pub fn deposit(&self, key: u64, fd: BorrowedFd<'_>) -> io::Result<()> {
        match &self.inner.backend {
            Backend::Keeper(sock) => {
                let mut m = [0u8; 9];
                m[0] = b'D';
                m[1..].copy_from_slice(&key.to_le_bytes());
                send_with_fds(sock, &m, &[fd.as_raw_fd()])
            }
            Backend::Systemd(store) => {
                // The store keeps every descriptor sent under a name; drop
                // the one held before, as the keeper does.
                let name = fdstore_name(key);
                store.remove(&name)?;
                store.store(&name, fd)
            }
        }
    }

    /// Has the keeper close what it holds under `key`.
    pub fn withdraw(&self, key: u64) -> io::Result<()> {
        match &self.inner.backend {
            Backend::Keeper(sock) => {
                let mut m = [0u8; 9];
                m[0] = b'W';
                m[1..].copy_from_slice(&key.to_le_bytes());
                send_with_fds(sock, &m, &[])
            }
            Backend::Systemd(store) => store.remove(&fdstore_name(key)),
        }
    }

    /// What the predecessors deposited and did not withdraw, with their
    /// keys; the library's own keys excluded. Empty after the first call.
    pub fn take_deposits(&self) -> Vec<(u64, OwnedFd)> {
        let mut left = self.inner.left.lock().unwrap_or_else(|e| e.into_inner());
        let (mine, theirs): (Vec<_>, Vec<_>) = std::mem::take(&mut *left)
            .into_iter()
            .partition(|(k, _)| *k >= RESERVED_KEYS);
        *left = mine;
        theirs
    }

    /// What the keeper handed this daemon under library keys in `keys`
    /// (sorted by key), once.
    pub(crate) fn take_keys(&self, keys: std::ops::Range<u64>) -> Vec<(u64, OwnedFd)> {
        let mut left = self.inner.left.lock().unwrap_or_else(|e| e.into_inner());
        let (mut mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut *left)
            .into_iter()
            .partition(|(k, _)| keys.contains(k));
        *left = rest;
        mine.sort_by_key(|(k, _)| *k);
        mine
    }

    /// The shared region deposited under `key`, or a new zeroed one of
    /// `len` bytes, deposited under `key`. A region found smaller than
    /// `len` is an error (the layout changed between versions).
    pub fn region(&self, key: u64, len: usize) -> io::Result<SharedRegion> {
        let found = {
            let mut left = self.inner.left.lock().unwrap_or_else(|e| e.into_inner());
            left.iter()
                .position(|(k, _)| *k == key)
                .map(|i| left.swap_remove(i).1)
        };
        if let Some(fd) = found {
            let r = SharedRegion::from_fd(fd)?;
            if r.len() < len {
                return Err(bad("the kept shared region is smaller than this version needs"));
            }
            return Ok(r);
        }
        let r = SharedRegion::create(&format!("fuse-wire-{key:x}"), len)?;
        self.deposit(key, r.fd())?;
        Ok(r)
    }
}

fn set_timeout(fd: BorrowedFd<'_>, which: libc::c_int, d: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: setsockopt with a live timeval of the size given.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            which,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A connected pair of sequenced-packet sockets: (keeper's, daemon's).
pub(crate) fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(io::Error::from)
}

/// The keeper's side: every descriptor deposited and not withdrawn.
#[derive(Debug, Default)]
pub(crate) struct VaultStore {
    held: HashMap<u64, OwnedFd>,
    /// Messages read so far.
    messages: u64,
}

impl VaultStore {
    /// How many descriptors it holds.
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }

    /// Holds `fd` under `key` (the keeper's own deposits).
    pub(crate) fn hold(&mut self, key: u64, fd: OwnedFd) {
        self.held.insert(key, fd);
    }

    /// How many messages it has read.
    pub(crate) fn messages(&self) -> u64 {
        self.messages
    }

    /// Sends everything held to a new daemon, then `E`. The socket is the
    /// keeper's end, blocking; a daemon that does not read for 30 s fails it.
    pub(crate) fn hand_to(&self, sock: &OwnedFd) -> io::Result<()> {
        set_timeout(sock.as_fd(), libc::SO_SNDTIMEO, Duration::from_secs(30))?;
        let all: Vec<(&u64, &OwnedFd)> = self.held.iter().collect();
        for batch in all.chunks(BATCH) {
            let mut m = Vec::with_capacity(1 + 8 * batch.len());
            m.push(b'P');
            let mut fds = Vec::with_capacity(batch.len());
            for (k, fd) in batch {
                m.extend_from_slice(&k.to_le_bytes());
                fds.push(fd.as_raw_fd());
            }
            send_with_fds(sock, &m, &fds)?;
        }
        send_with_fds(sock, b"E", &[])
    }

    /// Reads the daemon's deposits and withdrawals that are waiting, without
    /// blocking. Returns true once the daemon's end is closed (everything it
    /// sent has been read).
    pub(crate) fn drain(&mut self, sock: &OwnedFd) -> bool {
        let mut m = [0u8; 9];
        loop {
            match recv_dontwait(sock, &mut m) {
                Ok(None) => return true,
                Ok(Some((9, fd))) => {
                    self.messages += 1;
                    let key = u64::from_le_bytes(m[1..9].try_into().unwrap_or_default());
                    match (m[0], fd) {
                        (b'D', Some(fd)) => {
                            self.held.insert(key, fd);
                        }
                        (b'W', None) => {
                            self.held.remove(&key);
                        }
                        _ => log::warn!("keeper: a malformed vault message from the daemon; ignored"),
                    }
                }
                Ok(Some(_)) => {
                    log::warn!("keeper: a vault message of the wrong size from the daemon; ignored")
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                // The daemon closed its end with messages of ours unread
                // (it died while receiving its deposits): said once, before
                // what it sent that is still queued, which is read on.
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => continue,
                Err(e) => {
                    // EMFILE: the deposit's descriptor could not be taken
                    // (the keeper is at its open-files limit); the message
                    // came without it.
                    log::error!("keeper: reading the daemon's deposits: {e}");
                    return false;
                }
            }
        }
    }
}

/// One non-blocking `recvmsg`: `None` at end of stream.
fn recv_dontwait(sock: &OwnedFd, buf: &mut [u8]) -> io::Result<Option<(usize, Option<OwnedFd>)>> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    use std::os::fd::FromRawFd;
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let n = msg.bytes;
    let mut fd = None;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for r in raw {
                // SAFETY: the kernel just installed `r` in this process for
                // us; nothing else owns it.
                let owned = unsafe { OwnedFd::from_raw_fd(r) };
                fd.get_or_insert(owned);
            }
        }
    }
    if n == 0 && fd.is_none() {
        return Ok(None);
    }
    Ok(Some((n, fd)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    fn memfile(text: &[u8]) -> std::fs::File {
        let r = SharedRegion::create("vault-test", 8).unwrap();
        let mut f = std::fs::File::from(r.fd().try_clone_to_owned().unwrap());
        f.write_all(text).unwrap();
        f
    }

    #[test]
    fn deposits_outlive_the_daemon_and_reach_the_next_one() {
        let mut store = VaultStore::default();
        // First daemon: no deposits yet.
        let (k1, d1) = socket_pair().unwrap();
        let t = std::thread::spawn(move || Vault::open(d1).unwrap());
        store.hand_to(&k1).unwrap();
        let v1 = t.join().unwrap();
        assert!(v1.take_deposits().is_empty());
        let a = memfile(b"kept");
        let b = memfile(b"withdrawn");
        v1.deposit(7, a.as_fd()).unwrap();
        v1.deposit(8, b.as_fd()).unwrap();
        v1.withdraw(8).unwrap();
        let region = v1.region(RESERVED_KEYS | 1, 64).unwrap();
        region.words()[0].store(42, std::sync::atomic::Ordering::Relaxed);
        // The daemon dies: its descriptors and its end of the socket close.
        drop((v1, a, b, region));
        assert!(store.drain(&k1), "the daemon's end is closed");
        assert_eq!(store.len(), 2);
        // The successor gets what was left.
        let (k2, d2) = socket_pair().unwrap();
        let t = std::thread::spawn(move || Vault::open(d2).unwrap());
        store.hand_to(&k2).unwrap();
        let v2 = t.join().unwrap();
        let region = v2.region(RESERVED_KEYS | 1, 64).unwrap();
        assert_eq!(region.words()[0].load(std::sync::atomic::Ordering::Relaxed), 42);
        let mut left = v2.take_deposits();
        assert_eq!(left.len(), 1, "the library's own key is not handed out");
        let (key, fd) = left.pop().unwrap();
        assert_eq!(key, 7);
        let mut f = std::fs::File::from(fd);
        f.rewind().unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s.trim_end_matches('\0'), "kept");
        assert!(v2.take_deposits().is_empty());
        assert!(!store.drain(&k2), "the successor is alive");
    }

    #[test]
    fn a_daemon_dying_with_deposits_unread_still_leaves_its_own() {
        let mut store = VaultStore::default();
        let f = memfile(b"x");
        let (k1, d1) = socket_pair().unwrap();
        let t = std::thread::spawn(move || Vault::open(d1).unwrap());
        store.hand_to(&k1).unwrap();
        let v1 = t.join().unwrap();
        v1.deposit(1, f.as_fd()).unwrap();
        drop(v1);
        assert!(store.drain(&k1));
        // The next daemon deposits, then dies before reading what the keeper
        // handed it: its end closes with our messages unread.
        let (k2, d2) = socket_pair().unwrap();
        store.hand_to(&k2).unwrap();
        send_with_fds(&d2, &[b'D', 2, 0, 0, 0, 0, 0, 0, 0], &[f.as_raw_fd()]).unwrap();
        drop(d2);
        assert!(store.drain(&k2), "read to the end");
        assert_eq!(store.len(), 2, "the dead daemon's deposit is kept");
    }

    #[test]
    fn many_deposits_cross_in_batches() {
        let store = VaultStore::default();
        let (k1, d1) = socket_pair().unwrap();
        let t = std::thread::spawn(move || Vault::open(d1).unwrap());
        store.hand_to(&k1).unwrap();
        let v1 = t.join().unwrap();
        let f = memfile(b"x");
        let drainer = std::thread::spawn(move || {
            let mut store = store;
            while !store.drain(&k1) {
                std::thread::sleep(Duration::from_millis(1));
            }
            store
        });
        for k in 0..(BATCH as u64 * 2 + 3) {
            v1.deposit(k, f.as_fd()).unwrap();
        }
        drop(v1);
        let store = drainer.join().unwrap();
        assert_eq!(store.len(), BATCH * 2 + 3);
        let (k2, d2) = socket_pair().unwrap();
        let t = std::thread::spawn(move || Vault::open(d2).unwrap());
        store.hand_to(&k2).unwrap();
        let mut keys: Vec<u64> = t
            .join()
            .unwrap()
            .take_deposits()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        keys.sort();
        assert_eq!(keys, (0..(BATCH as u64 * 2 + 3)).collect::<Vec<_>>());
    }
}

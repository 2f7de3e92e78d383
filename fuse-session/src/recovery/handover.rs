//! Handing a live FUSE connection from one process to another, so that a
//! daemon can be upgraded or restarted without unmounting.
//!
//! A connection lives for as long as any process holds one of its
//! `/dev/fuse` files open, and INIT happens once per connection. A
//! [`Handover`] carries what a successor needs to go on serving it: the
//! `/dev/fuse` descriptor (passed with `SCM_RIGHTS`), what INIT negotiated
//! (the kernel will not negotiate again), and an opaque blob of the
//! filesystem's own state. [`crate::Session::resume`] serves from one
//! without waiting for INIT.
//!
//! Requests that a predecessor read but never answered stay in the kernel
//! (as long as their `/dev/fuse` file is still open somewhere, as the
//! keeper's copy keeps it); a resumed session asks the kernel to queue
//! them again (`FUSE_NOTIFY_RESEND`, 7.40) before serving, and they arrive
//! with [`fuse_proto::consts::UNIQUE_RESEND`] set in their unique
//! ([`crate::RequestContext::is_resent`]).
//!
//! The wire form is versioned; a handover from another library version, a
//! truncated one, or one whose descriptor is not a FUSE device, is refused
//! with a [`HandoverError`], and the sender keeps serving.

use crate::init::{Negotiated, Refusal};
use fuse_proto::flags::InitFlags;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The first bytes of every handover message.
const MAGIC: &[u8; 8] = b"FWHANDv1";

/// The longest filesystem state accepted (a sanity bound, not a design
/// limit: one million passthrough inodes take about 100 MiB).
pub const MAX_STATE: usize = 1 << 30;

/// Why a handover could not be sent or taken.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// The socket failed.
    #[error("handover socket: {0}")]
    Io(#[from] io::Error),
    /// The peer closed the socket before a whole handover arrived.
    #[error("the handover ended early (the sender died or refused)")]
    Truncated,
    /// Not a handover of this library version.
    #[error("not a fuse-wire handover of this version (got {0:?})")]
    BadMagic([u8; 8]),
    /// No descriptor came with the message.
    #[error("the handover carried no /dev/fuse descriptor")]
    NoDescriptor,
    /// The descriptor is not a FUSE device.
    #[error("the handed-over descriptor is not /dev/fuse ({0})")]
    NotFuse(String),
    /// A field is out of range.
    #[error("invalid handover: {0}")]
    Invalid(&'static str),
    /// The descriptor serves another mount.
    #[error("the descriptor serves FUSE connection {conn}, the mount is connection {minor}")]
    WrongMount {
        /// The descriptor's connection.
        conn: u32,
        /// The mount's.
        minor: u32,
    },
}

/// A live connection on its way to a successor.
#[derive(Debug)]
pub struct Handover {
    /// The connection's `/dev/fuse` descriptor.
    pub dev: OwnedFd,
    /// What INIT negotiated on it.
    pub negotiated: Negotiated,
    /// The filesystem's own state, opaque to the library.
    pub state: Vec<u8>,
}

impl Handover {
    /// Sends the handover on `sock`: the descriptor with the first bytes,
    /// then the rest.
    pub fn send(&self, sock: &UnixStream) -> Result<(), HandoverError> {
        let mut head = Vec::with_capacity(128);
        head.extend_from_slice(MAGIC);
        encode_negotiated(&self.negotiated, &mut head);
        put_u64(&mut head, self.state.len() as u64);
        let mut len = Vec::with_capacity(8);
        put_u64(&mut len, head.len() as u64);
        send_with_fd(sock, &len, self.dev.as_fd())?;
        let mut w = sock;
        w.write_all(&head)?;
        w.write_all(&self.state)?;
        w.flush()?;
        Ok(())
    }

    /// Receives a handover from `sock` and checks its descriptor is a FUSE
    /// device.
    pub fn receive(sock: &UnixStream) -> Result<Handover, HandoverError> {
        let mut len = [0u8; 8];
        let dev = recv_with_fd(sock, &mut len)?;
        let head_len = u64::from_le_bytes(len) as usize;
        if !(MAGIC.len()..=1 << 20).contains(&head_len) {
            return Err(HandoverError::Invalid("header length"));
        }
        let mut head = vec![0u8; head_len];
        read_exact(sock, &mut head)?;
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&head[..8]);
        if &magic != MAGIC {
            return Err(HandoverError::BadMagic(magic));
        }
        let mut r = Cursor(&head[8..]);
        let negotiated = decode_negotiated(&mut r)?;
        let state_len = r.u64()? as usize;
        if state_len > MAX_STATE {
            return Err(HandoverError::Invalid("state length"));
        }
        let mut state = vec![0u8; state_len];
        read_exact(sock, &mut state)?;
        let dev = dev.ok_or(HandoverError::NoDescriptor)?;
        check_fuse_device(dev.as_fd())?;
        if connection_of(dev.as_fd()) == Some(None) {
            return Err(HandoverError::NotFuse(
                "a /dev/fuse file bound to no connection (never mounted)".into(),
            ));
        }
        Ok(Handover {
            dev,
            negotiated,
            state,
        })
    }
}

pub(crate) fn read_exact(sock: &UnixStream, buf: &mut [u8]) -> Result<(), HandoverError> {
    let mut r = sock;
    r.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => HandoverError::Truncated,
        _ => HandoverError::Io(e),
    })
}

/// Whether `fd` is the FUSE device (character device 10:229).
pub fn check_fuse_device(fd: BorrowedFd<'_>) -> Result<(), HandoverError> {
    let st = nix::sys::stat::fstat(fd).map_err(|e| HandoverError::NotFuse(e.to_string()))?;
    let is_chr = st.st_mode & libc::S_IFMT == libc::S_IFCHR;
    if !is_chr || libc::major(st.st_rdev) != 10 || libc::minor(st.st_rdev) != 229 {
        return Err(HandoverError::NotFuse(format!(
            "mode {:o}, device {}:{}",
            st.st_mode,
            libc::major(st.st_rdev),
            libc::minor(st.st_rdev)
        )));
    }
    Ok(())
}

/// The FUSE connection a `/dev/fuse` descriptor is bound to: the number
/// after `fuse_connection:` in its `/proc/self/fdinfo` entry, which is the
/// minor of the mount's device number and the name of its directory in
/// `/sys/fs/fuse/connections`. `Some(None)`: the kernel shows the line for
/// bound files and this one has none (never mounted); `None`: fdinfo could
/// not be read.
pub fn connection_of(fd: BorrowedFd<'_>) -> Option<Option<u32>> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    Some(
        info.lines()
            .find_map(|l| l.strip_prefix("fuse_connection:"))
            .and_then(|v| v.trim().parse().ok()),
    )
}

/// Checks that `fd` serves the FUSE mount at `mountpoint` (its connection
/// is the mount's device minor, read from `/proc/self/mountinfo` without
/// touching the mount, which may hang), so that a takeover of the wrong
/// mount is refused before it serves anything.
pub fn check_mountpoint(fd: BorrowedFd<'_>, mountpoint: &std::path::Path) -> Result<(), HandoverError> {
    let conn = connection_of(fd)
        .flatten()
        .ok_or_else(|| HandoverError::NotFuse("no fuse_connection in its fdinfo".into()))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = mountpoint.to_string_lossy();
    // Fields: id parent major:minor root mountpoint ...; the last mount on
    // a path is the visible one.
    let minor = info
        .lines()
        .rev()
        .find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            if f.get(4) != Some(&want.as_ref()) {
                return None;
            }
            f.get(2)?.split(':').nth(1)?.parse::<u32>().ok()
        })
        .ok_or(HandoverError::Invalid("nothing is mounted at that mountpoint"))?;
    if minor != conn {
        return Err(HandoverError::WrongMount { conn, minor });
    }
    Ok(())
}

/// Sends `data` with one descriptor attached.
pub fn send_with_fd(sock: &impl AsFd, data: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    send_with_fds(sock, data, &[fd.as_raw_fd()])
}

/// Sends `data` with `fds` attached (at most 250), on a stream or a
/// sequenced-packet socket.
pub fn send_with_fds(sock: &impl AsFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let iov = [io::IoSlice::new(data)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
    let raw = sock.as_fd().as_raw_fd();
    let mut n = sendmsg::<()>(raw, &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None).map_err(io::Error::from)?;
    // A stream may take part of it: the descriptors went with the first
    // byte, the rest is plain data.
    while n < data.len() {
        let iov = [io::IoSlice::new(&data[n..])];
        n += sendmsg::<()>(raw, &iov, &[], MsgFlags::MSG_NOSIGNAL, None).map_err(io::Error::from)?;
    }
    Ok(())
}

/// Receives exactly `buf.len()` bytes, and the descriptor that came with the
/// first of them, if any.
pub fn recv_with_fd(sock: &UnixStream, buf: &mut [u8]) -> Result<Option<OwnedFd>, HandoverError> {
    let (fds, n) = recv_fds(sock, buf, 1)?;
    read_exact(sock, &mut buf[n..])?;
    Ok(fds.into_iter().next())
}

/// One `recvmsg`: up to `buf.len()` bytes and up to `max_fds` descriptors
/// (more are closed). Returns them and the byte count; 0 bytes is
/// [`HandoverError::Truncated`].
pub fn recv_fds(
    sock: &impl AsFd,
    buf: &mut [u8],
    max_fds: usize,
) -> Result<(Vec<OwnedFd>, usize), HandoverError> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut space = nix::cmsg_space!([RawFd; 253]);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        sock.as_fd().as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let n = msg.bytes;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for fd in raw {
                // SAFETY: the kernel just installed `fd` in this process for
                // us; nothing else owns it.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                if fds.len() < max_fds {
                    fds.push(owned);
                }
            }
        }
    }
    if n == 0 {
        return Err(HandoverError::Truncated);
    }
    Ok((fds, n))
}

// ---------------------------------------------------------------------------
// Negotiated, in a fixed little-endian layout

fn put_u64(v: &mut Vec<u8>, x: u64) {
    v.extend_from_slice(&x.to_le_bytes());
}
fn put_u32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_le_bytes());
}
fn put_u16(v: &mut Vec<u8>, x: u16) {
    v.extend_from_slice(&x.to_le_bytes());
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], HandoverError> {
        if self.0.len() < n {
            return Err(HandoverError::Invalid("short header"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u64(&mut self) -> Result<u64, HandoverError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap_or_default()))
    }
    fn u32(&mut self) -> Result<u32, HandoverError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap_or_default()))
    }
    fn u16(&mut self) -> Result<u16, HandoverError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap_or_default()))
    }
    fn u8(&mut self) -> Result<u8, HandoverError> {
        Ok(self.take(1)?[0])
    }
}

const REFUSALS: [Refusal; 7] = [
    Refusal::NotOffered,
    Refusal::Unsupported,
    Refusal::NeedsStackDepth,
    Refusal::WritebackConflict,
    Refusal::NeedsDefaultPermissions,
    Refusal::NeedsInitExt,
    Refusal::AtomicOpenConflict,
];

/// [`Negotiated`] in the handover's layout (the keeper keeps it so).
pub(crate) fn negotiated_bytes(n: &Negotiated) -> Vec<u8> {
    let mut v = Vec::new();
    encode_negotiated(n, &mut v);
    v
}

/// The inverse of [`negotiated_bytes`], checked.
pub(crate) fn decode_negotiated_bytes(b: &[u8]) -> Result<Negotiated, HandoverError> {
    decode_negotiated(&mut Cursor(b))
}

fn encode_negotiated(n: &Negotiated, v: &mut Vec<u8>) {
    put_u32(v, n.minor);
    put_u32(v, n.kernel_minor);
    put_u64(v, n.offered.bits());
    put_u64(v, n.flags.bits());
    put_u32(v, n.max_write);
    put_u16(v, n.max_pages);
    put_u32(v, n.max_readahead);
    put_u16(v, n.max_background);
    put_u16(v, n.congestion_threshold);
    put_u32(v, n.time_gran);
    put_u32(v, n.max_stack_depth);
    put_u16(v, n.request_timeout);
    v.push(u8::from(n.default_permissions));
    put_u32(v, n.refused.len() as u32);
    for (f, why) in &n.refused {
        put_u64(v, f.bits());
        v.push(REFUSALS.iter().position(|r| r == why).unwrap_or(0) as u8);
    }
}

fn decode_negotiated(r: &mut Cursor<'_>) -> Result<Negotiated, HandoverError> {
    let mut n = Negotiated {
        minor: r.u32()?,
        kernel_minor: r.u32()?,
        offered: InitFlags::from_bits_retain(r.u64()?),
        flags: InitFlags::from_bits_retain(r.u64()?),
        refused: Vec::new(),
        max_write: r.u32()?,
        max_pages: r.u16()?,
        max_readahead: r.u32()?,
        max_background: r.u16()?,
        congestion_threshold: r.u16()?,
        time_gran: r.u32()?,
        max_stack_depth: r.u32()?,
        request_timeout: r.u16()?,
        default_permissions: r.u8()? != 0,
    };
    if n.minor < fuse_proto::consts::MIN_MINOR_VERSION || n.minor > fuse_proto::consts::KERNEL_MINOR_VERSION {
        return Err(HandoverError::Invalid("protocol minor"));
    }
    if n.max_write < 4096 {
        return Err(HandoverError::Invalid("max_write"));
    }
    let count = r.u32()? as usize;
    if count > 64 {
        return Err(HandoverError::Invalid("refusal count"));
    }
    for _ in 0..count {
        let f = InitFlags::from_bits_retain(r.u64()?);
        let why = *REFUSALS
            .get(r.u8()? as usize)
            .ok_or(HandoverError::Invalid("refusal reason"))?;
        n.refused.push((f, why));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Negotiated {
        Negotiated {
            minor: 45,
            kernel_minor: 45,
            offered: InitFlags::ASYNC_READ | InitFlags::HAS_RESEND,
            flags: InitFlags::ASYNC_READ,
            refused: vec![(InitFlags::PASSTHROUGH, Refusal::WritebackConflict)],
            max_write: 1 << 20,
            max_pages: 256,
            max_readahead: 1 << 17,
            max_background: 12,
            congestion_threshold: 9,
            time_gran: 1,
            max_stack_depth: 0,
            request_timeout: 0,
            default_permissions: true,
        }
    }

    #[test]
    fn negotiated_round_trips() {
        let mut v = Vec::new();
        encode_negotiated(&sample(), &mut v);
        assert_eq!(decode_negotiated(&mut Cursor(&v)).unwrap(), sample());
        // Every prefix is refused, not misread.
        for cut in 0..v.len() {
            assert!(
                decode_negotiated(&mut Cursor(&v[..cut])).is_err(),
                "prefix of {cut} bytes"
            );
        }
    }

    #[test]
    fn a_handover_needs_a_fuse_descriptor() {
        let (a, b) = UnixStream::pair().unwrap();
        let not_fuse = std::fs::File::open("/dev/null").unwrap();
        let h = Handover {
            dev: OwnedFd::from(not_fuse),
            negotiated: sample(),
            state: b"state".to_vec(),
        };
        h.send(&a).unwrap();
        match Handover::receive(&b) {
            Err(HandoverError::NotFuse(why)) => assert!(why.contains("1:3"), "{why}"),
            other => panic!("expected NotFuse, got {other:?}"),
        }
    }

    #[test]
    fn an_unbound_dev_fuse_is_refused() {
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
        else {
            // No FUSE device here: the real-mount tests fail loudly then.
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "/dev/fuse is needed under CI=true"
            );
            return;
        };
        assert_eq!(
            connection_of(f.as_fd()),
            Some(None),
            "a fresh /dev/fuse is bound to nothing"
        );
        assert!(matches!(
            check_mountpoint(f.as_fd(), std::path::Path::new("/")),
            Err(HandoverError::NotFuse(_))
        ));
        let (a, b) = UnixStream::pair().unwrap();
        let h = Handover {
            dev: OwnedFd::from(f),
            negotiated: sample(),
            state: Vec::new(),
        };
        h.send(&a).unwrap();
        match Handover::receive(&b) {
            Err(HandoverError::NotFuse(why)) => assert!(why.contains("never mounted"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_truncated_or_foreign_handover_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert!(matches!(Handover::receive(&b), Err(HandoverError::Truncated)));
        let (a, b) = UnixStream::pair().unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let mut head = 16u64.to_le_bytes().to_vec();
        send_with_fd(&a, &head, null.as_fd()).unwrap();
        head = b"NOTAHANDOVER....".to_vec();
        (&a).write_all(&head).unwrap();
        assert!(matches!(Handover::receive(&b), Err(HandoverError::BadMagic(m)) if &m == b"NOTAHAND"));
    }
}

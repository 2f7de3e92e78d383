//! The messages a daemon sends its keeper on their socket: `N` with what
//! INIT negotiated, `S` with its state, `X` with why it refuses to serve,
//! each a tag, a length and the bytes; and the keeper's pump that reads
//! them.

use crate::init::Negotiated;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Tells the keeper what INIT negotiated (`N`): the child serves.
pub(super) fn report_serving(sock: &UnixStream, n: &Negotiated) -> io::Result<()> {
    write_blob(sock, b'N', &crate::handover::negotiated_bytes(n))
}

/// Reads what the child has sent so far: `N` + negotiated, `S` + state.
/// Returns whether an INIT report came.
pub(super) fn pump_messages(
    sock: &mut UnixStream,
    negotiated: &mut Option<Negotiated>,
    state: &mut Vec<u8>,
    refused: &mut Option<String>,
) -> bool {
    let mut reported = false;
    loop {
        let mut tag = [0u8; 1];
        match sock.read(&mut tag) {
            Ok(1) => {}
            _ => return reported,
        }
        let _ = sock.set_nonblocking(false);
        let _ = sock.set_read_timeout(Some(Duration::from_secs(5)));
        match tag[0] {
            b'N' => match read_blob(sock).map(|b| crate::handover::decode_negotiated_bytes(&b)) {
                Ok(Ok(n)) => {
                    *negotiated = Some(n);
                    reported = true;
                }
                Ok(Err(e)) => log::warn!("keeper: the daemon's INIT report: {e}"),
                Err(e) => log::warn!("keeper: reading the daemon's INIT report: {e}"),
            },
            b'S' => match read_blob(sock) {
                Ok(b) => *state = b,
                Err(e) => log::warn!("keeper: reading the daemon's state: {e}"),
            },
            b'X' => match read_blob(sock) {
                Ok(b) => *refused = Some(String::from_utf8_lossy(&b).into_owned()),
                Err(e) => log::warn!("keeper: reading why the daemon refused to serve: {e}"),
            },
            t => log::warn!("keeper: unknown message {t:#x} from the daemon"),
        }
        let _ = sock.set_nonblocking(true);
    }
}

fn read_blob(sock: &mut UnixStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    sock.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len) as usize;
    if len > crate::handover::MAX_STATE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "state too large"));
    }
    let mut b = vec![0u8; len];
    sock.read_exact(&mut b)?;
    Ok(b)
}

pub(super) fn write_blob(sock: &UnixStream, tag: u8, b: &[u8]) -> io::Result<()> {
    let mut w = sock;
    w.write_all(&[tag])?;
    w.write_all(&(b.len() as u64).to_le_bytes())?;
    w.write_all(b)?;
    w.flush()
}

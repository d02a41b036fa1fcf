//! Frames on bootstrap sockets (`[len: u32 LE][kind: u8][0; 3][payload]`, bounded) and
//! connecting with retries: every read and write checks its [`Waiter`](super::Waiter).

use super::*;

/// Writes one frame (blocking).
pub(crate) fn write_frame(s: &mut TcpStream, k: u8, payload: &[u8]) -> io::Result<()> {
    s.write_all(&frame(k, payload))
}

/// One frame's bytes: length (u32 LE), kind, three zero bytes, payload.
pub(crate) fn frame(k: u8, payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(8 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&[k, 0, 0, 0]);
    buf.extend_from_slice(payload);
    buf
}

/// Writes one frame, honouring the waiter: the write gives up (with the waiter's error, which
/// names the peer) at its deadline or on abort, instead of blocking on a peer that stopped
/// reading.
pub(crate) fn write_frame_within(
    s: &mut TcpStream,
    k: u8,
    payload: &[u8],
    w: &Waiter,
    what: &str,
    peer: Rank,
) -> Result<()> {
    let buf = frame(k, payload);
    let mut sent = 0;
    while sent < buf.len() {
        w.check(what, &[peer])?;
        s.set_write_timeout(Some(w.slice().max(Duration::from_millis(1))))
            .map_err(|e| Error::io(w.rank, "set socket timeout", Some(peer), e))?;
        match s.write(&buf[sent..]) {
            Ok(0) => {
                return Err(Error::io(
                    w.rank,
                    "bootstrap send",
                    Some(peer),
                    io::Error::new(io::ErrorKind::WriteZero, format!("connection closed during {what}")),
                ))
            }
            Ok(n) => sent += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(Error::io(w.rank, "bootstrap send", Some(peer), e)),
        }
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes from a blocking stream, honouring the waiter.
fn read_full(s: &mut TcpStream, buf: &mut [u8], w: &Waiter, what: &str, peer: &[Rank]) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        w.check(what, peer)?;
        s.set_read_timeout(Some(w.slice().max(Duration::from_millis(1))))
            .map_err(|e| Error::io(w.rank, "set socket timeout", None, e))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(Error::io(
                    w.rank,
                    "bootstrap read",
                    peer.first().copied(),
                    io::Error::new(io::ErrorKind::UnexpectedEof, format!("connection closed during {what}")),
                ))
            }
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(Error::io(w.rank, "bootstrap read", peer.first().copied(), e)),
        }
    }
    Ok(())
}

/// Reads one frame from a blocking stream.
pub(crate) fn read_frame(s: &mut TcpStream, w: &Waiter, what: &str, peer: &[Rank]) -> Result<(u8, Vec<u8>)> {
    let mut hdr = [0u8; 8];
    read_full(s, &mut hdr, w, what, peer)?;
    let len = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
    if len > MAX_BOOTSTRAP_FRAME_BYTES {
        return Err(CoreError::Malformed {
            what: "bootstrap frame",
            reason: format!("{len} bytes exceeds the {MAX_BOOTSTRAP_FRAME_BYTES}-byte limit"),
        }
        .into());
    }
    let mut payload = vec![0u8; len];
    read_full(s, &mut payload, w, what, peer)?;
    Ok((hdr[4], payload))
}

/// Connects to `addr`, retrying while nothing listens there yet.
pub(crate) fn connect_retry(addr: SocketAddr, w: &Waiter, what: &str, peer: &[Rank]) -> Result<TcpStream> {
    loop {
        w.check(what, peer)?;
        match TcpStream::connect_timeout(&addr, w.slice().max(Duration::from_millis(10))) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::HostUnreachable
                        | io::ErrorKind::NetworkUnreachable
                ) =>
            {
                std::thread::sleep(Duration::from_millis(CONNECT_RETRY_MS));
            }
            Err(e) => return Err(Error::io(w.rank, "connect", peer.first().copied(), e)),
        }
    }
}

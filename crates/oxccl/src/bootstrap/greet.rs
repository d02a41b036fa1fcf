//! The root's greeting: the first frame a rendezvous root sends on every connection it
//! accepts, before it reads anything, and the joiner's check of it.
//!
//! Rules:
//! 1. A joiner that does not read exactly the greeting within
//!    [`GREET_WAIT_MS`](oxccl_core::tuning::GREET_WAIT_MS) is not talking to an oxccl root
//!    (another program listens there: torchrun's TCPStore on `MASTER_PORT`, an SSH
//!    server...): it fails at once with [`Error::NotARoot`], naming the address and showing
//!    what it saw, instead of waiting in silence.
//! 2. A connection closed or reset before its first byte is ambiguous: the root's process may
//!    have ended with the connection still in its accept queue. The joiner connects again, up
//!    to three times 100 ms apart: refused means the root is gone (`PeerClosed`, naming rank
//!    0, whose process runs it); greeted, it joins; hung up on every time, another program.
//! 3. A greeting of another protocol version is a rejection.

use super::{connect_retry, frame, kind, write_frame, PROTOCOL_VERSION};
use crate::error::{Error, RejectReason, Result};
use oxccl_core::wire::Writer;
use oxccl_core::Rank;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::Waiter;

const GREET_MAGIC: u32 = u32::from_le_bytes(*b"OXRT");

/// The frame a rendezvous root sends each connection as it accepts it.
pub(crate) fn greeting() -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(GREET_MAGIC).u32(PROTOCOL_VERSION);
    frame(kind::GREET, &w.finish())
}

/// Up to 48 bytes, as hex and as text: what a stranger said.
pub(crate) fn show_bytes(b: &[u8]) -> String {
    let b = &b[..b.len().min(48)];
    let hex: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    let text: String = b.iter().map(|&c| if (0x20..0x7f).contains(&c) { c as char } else { '.' }).collect();
    format!("{} byte(s): {} ({text:?})", b.len(), hex.join(" "))
}

/// Connects to the root at `root` (waiting while nothing listens there: `what` says so), sends
/// `join` (a join request's payload) and reads the root's greeting (rules 1–3).
pub(crate) fn join_root(root: SocketAddr, join: &[u8], w: &Waiter, what: &str) -> Result<TcpStream> {
    let send = |s: &mut TcpStream| {
        write_frame(s, kind::JOIN, join)
            .map_err(|e| Error::io(w.rank, "bootstrap: send join request", None, e))
    };
    // A join request written into a connection already reset is a hang-up too.
    let try_join = |s: &mut TcpStream| -> Result<Heard> {
        match send(s) {
            Err(Error::Io { source, .. })
                if matches!(source.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe) =>
            {
                Ok(Heard::HungUp(format!(
                    "it reset the connection before the join request was out ({source})"
                )))
            }
            Err(e) => Err(e),
            Ok(()) => expect_greeting(s, root, w),
        }
    };
    let mut s = connect_retry(root, w, what, &[Rank(0)])?;
    let Heard::HungUp(saw) = try_join(&mut s)? else { return Ok(s) };
    let not_root = |saw: String| Error::NotARoot { rank: w.rank, addr: root.to_string(), saw };
    // A root's process that ends resets what waits in its accept queue, and its port refuses
    // a moment later; a program that hangs up on every connection never refuses.
    let mut again = String::new();
    for _ in 0..HANG_UP_RETRIES {
        std::thread::sleep(Duration::from_millis(HANG_UP_PAUSE_MS));
        match TcpStream::connect_timeout(&root, Duration::from_secs(1)) {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(Error::PeerClosed {
                    rank: w.rank,
                    op: "bootstrap: joining the rendezvous root (the root runs in rank 0's process, which ended before answering: see rank 0's error)".into(),
                    peer: Rank(0),
                    host: root.to_string(),
                })
            }
            Ok(mut s) => {
                let _ = s.set_nodelay(true);
                match try_join(&mut s)? {
                    Heard::Greeted => return Ok(s),
                    Heard::HungUp(h) => again = h,
                }
            }
            Err(e) => again = format!("connecting again failed: {e}"),
        }
    }
    Err(not_root(format!("{saw}, and so did {HANG_UP_RETRIES} more connections ({again})")))
}

/// How often, and how far apart, a joiner whose connection was hung up on tries again (rule 2).
const HANG_UP_RETRIES: usize = 3;
const HANG_UP_PAUSE_MS: u64 = 100;

/// What a connection said before its first byte: the greeting, or a hang-up (rule 2).
enum Heard {
    Greeted,
    HungUp(String),
}

/// Reads the root's greeting, which an oxccl root sends as it accepts: anything else, or
/// nothing for [`GREET_WAIT_MS`](oxccl_core::tuning::GREET_WAIT_MS), means something other
/// than an oxccl root listens at `root`, and the error says what it saw.
fn expect_greeting(s: &mut TcpStream, root: SocketAddr, w: &Waiter) -> Result<Heard> {
    let want = greeting();
    let mut got: Vec<u8> = Vec::with_capacity(64);
    let waited = Duration::from_millis(oxccl_core::tuning::GREET_WAIT_MS);
    let until = Instant::now() + waited;
    let not_root = |saw: String| Error::NotARoot { rank: w.rank, addr: root.to_string(), saw };
    // The version is the greeting's last 4 bytes; everything before it is fixed.
    let fixed = want.len() - 4;
    loop {
        let n = got.len().min(fixed);
        if got[..n] != want[..n] {
            // A stranger: take whatever else it sends at once, to show it.
            let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
            let mut more = [0u8; 48];
            if let Ok(k) = s.read(&mut more) {
                got.extend_from_slice(&more[..k]);
            }
            return Err(not_root(format!("it answered {}", show_bytes(&got))));
        }
        if got.len() >= want.len() {
            let theirs = u32::from_le_bytes([got[fixed], got[fixed + 1], got[fixed + 2], got[fixed + 3]]);
            if theirs != PROTOCOL_VERSION {
                return Err(Error::Rejected {
                    rank: w.rank,
                    reason: RejectReason::Version { ours: PROTOCOL_VERSION, theirs },
                });
            }
            return Ok(Heard::Greeted);
        }
        w.check(&format!("bootstrap: waiting for the rendezvous root at {root} to greet"), &[])?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(not_root(if got.is_empty() {
                format!(
                    "it accepted the connection but said nothing in {} s (an oxccl root greets at once)",
                    waited.as_secs()
                )
            } else {
                format!("it sent only {} and then nothing", show_bytes(&got))
            }));
        }
        s.set_read_timeout(Some(left.min(w.slice()).max(Duration::from_millis(1))))
            .map_err(|e| Error::io(w.rank, "set socket timeout", None, e))?;
        let mut buf = [0u8; 64];
        match s.read(&mut buf[..want.len() - got.len()]) {
            Ok(0) if got.is_empty() => {
                return Ok(Heard::HungUp("it closed the connection without a word".into()))
            }
            Ok(0) => return Err(not_root(format!("it sent {} and closed the connection", show_bytes(&got)))),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset && got.is_empty() => {
                return Ok(Heard::HungUp("it reset the connection without a word".into()))
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(not_root(format!("it sent {} and reset the connection", show_bytes(&got))))
            }
            Err(e) => return Err(Error::io(w.rank, "bootstrap: reading the root's greeting", None, e)),
        }
    }
}

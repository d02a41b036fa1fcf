//! The root's greeting: the first frame a rendezvous root sends on every connection it
//! accepts, before it reads anything, and the joiner's check of it.
//!
//! Rules: a joiner that does not read exactly the greeting within
//! [`GREET_WAIT_MS`](oxccl_core::tuning::GREET_WAIT_MS) is not talking to an oxccl root
//! (another program listens there: torchrun's TCPStore on `MASTER_PORT`, an SSH server...):
//! it fails at once with [`Error::NotARoot`], naming the address and showing what it saw,
//! instead of waiting in silence. A greeting of another protocol version is a rejection.

use super::{frame, kind, PROTOCOL_VERSION};
use crate::error::{Error, RejectReason, Result};
use oxccl_core::wire::Writer;
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

/// Reads the root's greeting, which an oxccl root sends as it accepts: anything else, or
/// nothing for [`GREET_WAIT_MS`](oxccl_core::tuning::GREET_WAIT_MS), means something other
/// than an oxccl root listens at `root`, and the error says what it saw.
pub(crate) fn expect_greeting(s: &mut TcpStream, root: SocketAddr, w: &Waiter) -> Result<()> {
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
            return Ok(());
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
            Ok(0) => {
                return Err(not_root(if got.is_empty() {
                    "it closed the connection without a word (or rank 0's process ended just then)".into()
                } else {
                    format!("it sent {} and closed the connection", show_bytes(&got))
                }))
            }
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(not_root(format!("it reset the connection after {} byte(s)", got.len())))
            }
            Err(e) => return Err(Error::io(w.rank, "bootstrap: reading the root's greeting", None, e)),
        }
    }
}

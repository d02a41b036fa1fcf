//! A client of PyTorch's c10d `TCPStore`, the key-value store torchrun's agent serves on
//! `MASTER_ADDR:MASTER_PORT` (`TORCHELASTIC_USE_AGENT_STORE=True`): rank 0 publishes the
//! unique id there and the others wait for it, so nobody binds the agent's port.
//!
//! The wire protocol (torch's `TCPStore.cpp` and its libuv server): a request is a one-byte
//! query type then its arguments; integers are native-endian; a string is a u64 length then
//! its bytes. On connect: `VALIDATE` with the magic number (no reply), then `PING` with a nonce
//! that the server echoes. `SET key value` has no reply; `GET key` answers the value (empty when
//! missing, so `WAIT` first); `WAIT n keys...` answers one byte (`STOP_WAITING`) once every key
//! exists; `ADD key i64` answers the new value; `CHECK n keys...` answers `READY` or
//! `NOT_READY`. Torch's client writes every key with a leading `/`, and its `PrefixStore`
//! joins `prefix/key`: [`Store::key`] writes keys the way a torch worker's store would.
//!
//! Rules: every read is bounded ([`Waiter`]: abort, deadline, notices); an answer that is not
//! the protocol's (a wrong ping echo, a length beyond the store's limits) is an error naming
//! the address and the bytes, never a hang.

use crate::bootstrap::show_bytes as show;
use crate::error::{Error, Result};
use crate::wait::Waiter;
use oxccl_core::tuning::GREET_WAIT_MS;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The validation magic torch's client sends first.
const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;
/// The longest value the store holds (torch's limit is 8 MiB).
const MAX_VALUE_BYTES: u64 = 8 << 20;

/// Query types (torch's `QueryType`).
mod query {
    pub const VALIDATE: u8 = 0;
    pub const SET: u8 = 1;
    pub const GET: u8 = 3;
    pub const ADD: u8 = 4;
    pub const CHECK: u8 = 5;
    pub const WAIT: u8 = 6;
    pub const PING: u8 = 13;
}
const STOP_WAITING: u8 = 0;
const READY: u8 = 0;
const NOT_READY: u8 = 1;

/// A connection to a TCPStore; keys are written under `prefix`.
pub struct Store {
    s: TcpStream,
    rank: oxccl_core::Rank,
    addr: String,
    prefix: String,
}

fn put_str(buf: &mut Vec<u8>, s: &[u8]) {
    buf.extend_from_slice(&(s.len() as u64).to_ne_bytes());
    buf.extend_from_slice(s);
}

impl Store {
    /// Connects to the store at `host:port` (retrying while nothing listens yet) and checks it
    /// answers as a TCPStore; keys go under `prefix` (a torch `PrefixStore`'s, e.g.
    /// `/worker/attempt_0`, or empty).
    pub fn connect(host: &str, port: u16, prefix: &str, w: &Waiter) -> Result<Store> {
        let addr = format!("{host}:{port}");
        let what = format!("rendezvous: reaching torchrun's store at {addr}");
        let target: SocketAddr = loop {
            if let Some(a) = (host, port).to_socket_addrs().ok().and_then(|mut a| a.next()) {
                break a;
            }
            w.check(&format!("rendezvous: resolving {host}"), &[])?;
            std::thread::sleep(Duration::from_millis(oxccl_core::tuning::CONNECT_RETRY_MS));
        };
        let s = crate::bootstrap::connect_retry(target, w, &what, &[])?;
        let mut st = Store { s, rank: w.rank, addr, prefix: prefix.trim_end_matches('/').to_string() };
        let mut hello = vec![query::VALIDATE];
        hello.extend_from_slice(&VALIDATION_MAGIC.to_ne_bytes());
        let nonce: u32 = std::process::id() ^ 0x6f78_6363;
        hello.push(query::PING);
        hello.extend_from_slice(&nonce.to_ne_bytes());
        st.send(&hello, w)?;
        let mut echo = [0u8; 4];
        st.recv(&mut echo, w, Some(Duration::from_millis(GREET_WAIT_MS)), "the answer to its ping")?;
        if u32::from_ne_bytes(echo) != nonce {
            let mut seen = echo.to_vec();
            let _ = st.s.set_read_timeout(Some(Duration::from_millis(50)));
            let mut more = [0u8; 44];
            if let Ok(n) = st.s.read(&mut more) {
                seen.extend_from_slice(&more[..n]);
            }
            return Err(st.protocol(format!(
                "it answered the ping (nonce {nonce:#010x}) with {}: not a c10d TCPStore",
                show(&seen)
            )));
        }
        Ok(st)
    }

    /// The key as a torch worker's store writes it: `/` + prefix + `/` + key.
    pub fn key(&self, k: &str) -> Vec<u8> {
        if self.prefix.is_empty() {
            format!("/{k}").into_bytes()
        } else {
            format!("/{}/{k}", self.prefix).into_bytes()
        }
    }

    fn protocol(&self, why: String) -> Error {
        Error::Store { rank: self.rank, addr: self.addr.clone(), why }
    }

    fn send(&mut self, buf: &[u8], w: &Waiter) -> Result<()> {
        let mut sent = 0;
        while sent < buf.len() {
            w.check(&format!("rendezvous: writing to torchrun's store at {}", self.addr), &[])?;
            let _ = self.s.set_write_timeout(Some(w.slice().max(Duration::from_millis(1))));
            match self.s.write(&buf[sent..]) {
                Ok(0) => return Err(self.protocol("it closed the connection".into())),
                Ok(n) => sent += n,
                Err(e) if retry(&e) => {}
                Err(e) => return Err(self.protocol(format!("writing: {e}"))),
            }
        }
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes; `limit`: fail if they take longer (an answer that
    /// should come at once).
    fn recv(&mut self, buf: &mut [u8], w: &Waiter, limit: Option<Duration>, what: &str) -> Result<()> {
        let started = Instant::now();
        let mut got = 0;
        while got < buf.len() {
            w.check(&format!("rendezvous: waiting for {what} from torchrun's store at {}", self.addr), &[])?;
            let mut slice = w.slice().max(Duration::from_millis(1));
            if let Some(l) = limit {
                let left = l.saturating_sub(started.elapsed());
                if left.is_zero() {
                    return Err(self.protocol(format!(
                        "nothing came in {} s while this rank waited for {what} ({got} of {} bytes): not a c10d TCPStore?",
                        l.as_secs_f64(),
                        buf.len()
                    )));
                }
                slice = slice.min(left);
            }
            let _ = self.s.set_read_timeout(Some(slice));
            match self.s.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(
                        self.protocol(format!("it closed the connection while this rank waited for {what}"))
                    )
                }
                Ok(n) => got += n,
                Err(e) if retry(&e) => {}
                Err(e) => return Err(self.protocol(format!("reading {what}: {e}"))),
            }
        }
        Ok(())
    }

    /// `SET key value`.
    pub fn set(&mut self, key: &str, value: &[u8], w: &Waiter) -> Result<()> {
        let mut buf = vec![query::SET];
        put_str(&mut buf, &self.key(key));
        put_str(&mut buf, value);
        self.send(&buf, w)
    }

    /// `GET key` (the key must exist: [`wait`](Self::wait) first).
    pub fn get(&mut self, key: &str, w: &Waiter) -> Result<Vec<u8>> {
        let mut buf = vec![query::GET];
        put_str(&mut buf, &self.key(key));
        self.send(&buf, w)?;
        let limit = Some(Duration::from_millis(GREET_WAIT_MS));
        let mut len = [0u8; 8];
        self.recv(&mut len, w, limit, "a value's length")?;
        let n = u64::from_ne_bytes(len);
        if n > MAX_VALUE_BYTES {
            return Err(self.protocol(format!("it announced a {n}-byte value, beyond the store's 8 MiB")));
        }
        let mut v = vec![0u8; n as usize];
        self.recv(&mut v, w, limit, "a value")?;
        Ok(v)
    }

    /// `WAIT key`: returns once the key exists (the waiter bounds it and says what it waits for).
    pub fn wait(&mut self, key: &str, w: &Waiter, what: &str) -> Result<()> {
        let mut buf = vec![query::WAIT];
        buf.extend_from_slice(&1u64.to_ne_bytes());
        put_str(&mut buf, &self.key(key));
        self.send(&buf, w)?;
        let mut r = [0u8; 1];
        self.recv(&mut r, w, None, what)?;
        if r[0] != STOP_WAITING {
            return Err(self.protocol(format!("it ended a wait with {:#04x}, not STOP_WAITING", r[0])));
        }
        Ok(())
    }

    /// `ADD key delta`: the key's new value.
    pub fn add(&mut self, key: &str, delta: i64, w: &Waiter) -> Result<i64> {
        let mut buf = vec![query::ADD];
        put_str(&mut buf, &self.key(key));
        buf.extend_from_slice(&delta.to_ne_bytes());
        self.send(&buf, w)?;
        let mut v = [0u8; 8];
        self.recv(&mut v, w, Some(Duration::from_millis(GREET_WAIT_MS)), "the sum")?;
        Ok(i64::from_ne_bytes(v))
    }

    /// `CHECK key`: whether it exists.
    pub fn check(&mut self, key: &str, w: &Waiter) -> Result<bool> {
        let mut buf = vec![query::CHECK];
        buf.extend_from_slice(&1u64.to_ne_bytes());
        put_str(&mut buf, &self.key(key));
        self.send(&buf, w)?;
        let mut r = [0u8; 1];
        self.recv(&mut r, w, Some(Duration::from_millis(GREET_WAIT_MS)), "the check's answer")?;
        match r[0] {
            READY => Ok(true),
            NOT_READY => Ok(false),
            b => Err(self.protocol(format!("it answered a check with {b:#04x}"))),
        }
    }
}

fn retry(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted)
}

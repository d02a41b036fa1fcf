//! Same-host requests over a rank's Unix socket, which the bootstrap service carries as
//! opaque bytes and descriptors and hands to this module's [`Desk`]: shared-memory connection
//! offers (the region and the sender's doorbell beside them), control-block exchanges for the
//! direct path (`HostRequest::Arena`), and requests for a shared allocation's descriptor
//! (`HostRequest::Map`); and [`host_call`], the asking side.
//!
//! Rules:
//! 1. Every request names the communicator's secret, its sender and this rank; a request with
//!    another secret, another destination or a sender outside the communicator is refused
//!    (answered with the reason) and its descriptors closed.
//! 2. An offer brings exactly two descriptors (region, doorbell) and is answered with this
//!    rank's doorbell before it is filed in the mailbox as [`Incoming::Host`] holding a
//!    [`ShmOffer`]; an arena brings two (control block, doorbell) and is answered with this
//!    rank's control block and doorbell; a map request brings none and is answered with the
//!    allocation's descriptor.
//! 3. Answers are written with a bounded wait (the peer waits for them); the desk never reads
//!    more than one message per connection.

use crate::bootstrap::service::{HostDesk, Visit};
use crate::bootstrap::Incoming;
use crate::sys::unix::SeqSocket;
use oxccl_core::plan::ConnClass;
use oxccl_core::wire::{Reader, Writer};
use oxccl_core::{CoreError, Rank};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

const SHM_OFFER_MAGIC: u32 = u32::from_le_bytes(*b"OXSH");
const SHM_ACCEPT_MAGIC: u32 = u32::from_le_bytes(*b"OXSA");
const SHM_REJECT_MAGIC: u32 = u32::from_le_bytes(*b"OXSR");
const ARENA_MAGIC: u32 = u32::from_le_bytes(*b"OXAR");
const MAP_MAGIC: u32 = u32::from_le_bytes(*b"OXMR");

/// A shared-memory connection offered by a peer.
#[derive(Debug)]
pub struct ShmOffer {
    pub region: OwnedFd,
    pub doorbell: OwnedFd,
    pub slots: u32,
    pub slot_bytes: u32,
}

/// The shared-memory offer message (bytes; the descriptors travel beside it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmOfferMsg {
    pub secret: [u8; 32],
    pub from: Rank,
    pub to: Rank,
    pub class: ConnClass,
    pub slots: u32,
    pub slot_bytes: u32,
}

impl ShmOfferMsg {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(SHM_OFFER_MAGIC)
            .u32(crate::bootstrap::PROTOCOL_VERSION)
            .raw(&self.secret)
            .u32(self.from.0)
            .u32(self.to.0);
        crate::bootstrap::encode_class(&mut w, self.class);
        w.u32(self.slots).u32(self.slot_bytes);
        w.finish()
    }

    pub fn decode(b: &[u8]) -> Result<ShmOfferMsg, CoreError> {
        let mut r = Reader::new(b, "shared-memory offer");
        if r.u32()? != SHM_OFFER_MAGIC || r.u32()? != crate::bootstrap::PROTOCOL_VERSION {
            return Err(CoreError::Malformed {
                what: "shared-memory offer",
                reason: "bad magic or version".into(),
            });
        }
        let m = ShmOfferMsg {
            secret: r.fixed()?,
            from: Rank(r.u32()?),
            to: Rank(r.u32()?),
            class: crate::bootstrap::decode_class(&mut r)?,
            slots: r.u32()?,
            slot_bytes: r.u32()?,
        };
        r.finish()?;
        Ok(m)
    }
}

/// A request over a rank's Unix socket other than a connection offer: an exchange of
/// host-memory control blocks (with doorbells), or a request for a shared allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostRequest {
    Arena { secret: [u8; 32], from: Rank, to: Rank },
    Map { secret: [u8; 32], from: Rank, to: Rank, alloc: u64 },
}

impl HostRequest {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            HostRequest::Arena { secret, from, to } => {
                w.u32(ARENA_MAGIC).u32(crate::bootstrap::PROTOCOL_VERSION).raw(secret).u32(from.0).u32(to.0);
            }
            HostRequest::Map { secret, from, to, alloc } => {
                w.u32(MAP_MAGIC)
                    .u32(crate::bootstrap::PROTOCOL_VERSION)
                    .raw(secret)
                    .u32(from.0)
                    .u32(to.0)
                    .u64(*alloc);
            }
        }
        w.finish()
    }

    pub fn decode(b: &[u8]) -> Result<HostRequest, CoreError> {
        let mut r = Reader::new(b, "host-memory request");
        let magic = r.u32()?;
        if r.u32()? != crate::bootstrap::PROTOCOL_VERSION {
            return Err(CoreError::Malformed { what: "host-memory request", reason: "version".into() });
        }
        let (secret, from, to) = (r.fixed()?, Rank(r.u32()?), Rank(r.u32()?));
        let req = match magic {
            ARENA_MAGIC => HostRequest::Arena { secret, from, to },
            MAP_MAGIC => HostRequest::Map { secret, from, to, alloc: r.u64()? },
            _ => return Err(CoreError::Malformed { what: "host-memory request", reason: "magic".into() }),
        };
        r.finish()?;
        Ok(req)
    }
}

/// The answer to an offer: accepted (the receiver's doorbell travels beside it) or refused.
pub fn encode_offer_reply(accepted: bool, reason: &str) -> Vec<u8> {
    let mut w = Writer::new();
    if accepted {
        w.u32(SHM_ACCEPT_MAGIC);
    } else {
        w.u32(SHM_REJECT_MAGIC).str(reason);
    }
    w.finish()
}

/// Decodes an answer: `Ok(())` if accepted, the reason otherwise.
pub fn decode_offer_reply(b: &[u8]) -> Result<Result<(), String>, CoreError> {
    let mut r = Reader::new(b, "shared-memory offer reply");
    match r.u32()? {
        SHM_ACCEPT_MAGIC => Ok(Ok(())),
        SHM_REJECT_MAGIC => Ok(Err(r.str()?.to_string())),
        _ => Err(CoreError::Malformed { what: "shared-memory offer reply", reason: "bad magic".into() }),
    }
}

/// Sends `req` to the rank whose Unix socket is `name` and returns the descriptors of its
/// answer (an error carries the peer's reason).
pub(crate) fn host_call(name: &[u8; 16], req: &HostRequest, fds: &[i32]) -> std::io::Result<Vec<OwnedFd>> {
    let sock = SeqSocket::connect_abstract(name, Duration::from_secs(10))?;
    sock.send(&req.encode(), fds)?;
    let mut buf = [0u8; 512];
    let (n, got) = sock.recv(&mut buf)?.ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer from the peer's service")
    })?;
    match decode_offer_reply(&buf[..n]) {
        Ok(Ok(())) => Ok(got),
        Ok(Err(why)) => Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, why)),
        Err(e) => Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())),
    }
}

/// What a rank hands same-host peers that ask: its direct-path control block, and its shared
/// allocations' descriptors by id (`allocation`).
pub struct Desk {
    pub block: OwnedFd,
    pub allocation: fn(u64) -> Option<OwnedFd>,
}

impl HostDesk for Desk {
    fn answer(&self, v: &Visit<'_>, msg: &[u8], fds: Vec<OwnedFd>) -> bool {
        if let Ok(req) = HostRequest::decode(msg) {
            return self.request(v, req, fds);
        }
        offer(v, msg, fds)
    }
}

/// Whether a request's secret and ranks are this communicator's and this rank's (rule 1).
fn addressed(v: &Visit<'_>, secret: &[u8; 32], from: Rank, to: Rank) -> bool {
    crate::bootstrap::service::same_secret(secret, v.secret) && to == v.me && from.idx() < v.size
}

/// A shared-memory offer: answered with this rank's doorbell, then filed (rule 2).
fn offer(v: &Visit<'_>, msg: &[u8], mut fds: Vec<OwnedFd>) -> bool {
    let s = v.sock;
    let refuse = |why: &str| {
        v.log.warn(format_args!("service: refusing shared-memory offer: {why}"));
        let _ = s.set_nonblocking(false);
        let _ = s.set_timeouts(Duration::from_secs(1));
        let _ = s.send(&encode_offer_reply(false, why), &[]);
        false
    };
    let m = match ShmOfferMsg::decode(msg) {
        Ok(m) => m,
        Err(e) => return refuse(&e.to_string()),
    };
    if !addressed(v, &m.secret, m.from, m.to) {
        return refuse("wrong secret or ranks");
    }
    if fds.len() != 2 {
        return refuse("expected two descriptors");
    }
    let doorbell = fds.pop();
    let region = fds.pop();
    let (Some(region), Some(doorbell)) = (region, doorbell) else {
        return refuse("expected two descriptors");
    };
    let _ = s.set_nonblocking(false);
    let _ = s.set_timeouts(Duration::from_secs(5));
    if let Err(e) = s.send(&encode_offer_reply(true, ""), &[v.doorbell]) {
        v.log.warn(format_args!("service: cannot answer rank {}'s offer: {e}", m.from));
        return false;
    }
    let offer = ShmOffer { region, doorbell, slots: m.slots, slot_bytes: m.slot_bytes };
    v.mailbox.deliver_conn(m.from, m.class, Incoming::Host(Box::new(offer)));
    true
}

impl Desk {
    /// A control-block exchange or a request for a shared allocation (rule 2).
    fn request(&self, v: &Visit<'_>, req: HostRequest, mut fds: Vec<OwnedFd>) -> bool {
        let s = v.sock;
        let _ = s.set_nonblocking(false);
        let _ = s.set_timeouts(Duration::from_secs(5));
        let reply = |ok: bool, why: &str, with: &[i32]| {
            if !ok {
                v.log.warn(format_args!("service: refusing a host-memory request: {why}"));
            }
            let _ = s.send(&encode_offer_reply(ok, why), with);
            false
        };
        let (secret, from, to) = match &req {
            HostRequest::Arena { secret, from, to } | HostRequest::Map { secret, from, to, .. } => {
                (secret, *from, *to)
            }
        };
        if !addressed(v, secret, from, to) {
            return reply(false, "wrong secret or ranks", &[]);
        }
        match req {
            HostRequest::Arena { .. } => {
                if fds.len() != 2 {
                    return reply(false, "expected two descriptors", &[]);
                }
                let (Some(bell), Some(ctl)) = (fds.pop(), fds.pop()) else {
                    return reply(false, "expected two descriptors", &[]);
                };
                if s.send(&encode_offer_reply(true, ""), &[self.block.as_raw_fd(), v.doorbell]).is_err() {
                    return false;
                }
                v.mailbox.deliver_arena(from, ctl, bell);
                true
            }
            HostRequest::Map { alloc, .. } => match (self.allocation)(alloc) {
                Some(fd) => reply(true, "", &[fd.as_raw_fd()]),
                None => reply(false, &format!("no shared allocation {alloc} in this process"), &[]),
            },
        }
    }
}

//! What the service files besides control messages, and its wire forms: shared-memory offers
//! (with their descriptors), incoming data connections, host requests (arenas, mappings) over
//! the Unix socket, and the answer to an offer.

use super::*;

pub(super) const SHM_OFFER_MAGIC: u32 = u32::from_le_bytes(*b"OXSH");
pub(super) const SHM_ACCEPT_MAGIC: u32 = u32::from_le_bytes(*b"OXSA");
pub(super) const SHM_REJECT_MAGIC: u32 = u32::from_le_bytes(*b"OXSR");
pub(super) const ARENA_MAGIC: u32 = u32::from_le_bytes(*b"OXAR");
pub(super) const MAP_MAGIC: u32 = u32::from_le_bytes(*b"OXMR");
pub(super) const MAX_HELLO_BYTES: usize = 1024;

/// A shared-memory connection offered by a peer.
#[derive(Debug)]
pub struct ShmOffer {
    pub region: OwnedFd,
    pub doorbell: OwnedFd,
    pub slots: u32,
    pub slot_bytes: u32,
}

/// A data connection that arrived for this rank.
#[derive(Debug)]
pub enum Incoming {
    Tcp(TcpStream),
    Shm(ShmOffer),
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

    pub(super) fn decode(b: &[u8]) -> Result<HostRequest, CoreError> {
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

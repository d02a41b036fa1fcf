//! The unique id: how ranks find the rendezvous root, and the secret that admits them.
//!
//! Binary form (128 bytes, like `ncclUniqueId`):
//!
//! | bytes   | field                                               |
//! |---------|-----------------------------------------------------|
//! | 0..4    | magic `OXID`                                        |
//! | 4       | format version (1)                                  |
//! | 5       | address family: 4 or 6                              |
//! | 6..8    | root port, big-endian                               |
//! | 8..24   | root IP address (IPv4 in the first 4 bytes)         |
//! | 24..56  | 32-byte random secret                               |
//! | 56..128 | zero                                                |
//!
//! Text form, for environment variables and files: `oxccl1@<ip>:<port>/<secret as 64 hex>`,
//! with IPv6 addresses in brackets.

use crate::error::CoreError;
use crate::types::CommHash;
use sha2::{Digest, Sha256};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Bytes of a serialized unique id.
pub const UNIQUE_ID_BYTES: usize = 128;
const MAGIC: &[u8; 4] = b"OXID";
const VERSION: u8 = 1;
const TEXT_PREFIX: &str = "oxccl1@";

/// A communicator's rendezvous address and secret.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    pub root: SocketAddr,
    pub secret: [u8; 32],
}

impl core::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // The secret is not printed in debug output.
        write!(f, "UniqueId {{ root: {}, comm: {} }}", self.root, self.comm_hash())
    }
}

impl UniqueId {
    /// The 128-byte binary form.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[0..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[6..8].copy_from_slice(&self.root.port().to_be_bytes());
        match self.root.ip() {
            IpAddr::V4(a) => {
                b[5] = 4;
                b[8..12].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                b[5] = 6;
                b[8..24].copy_from_slice(&a.octets());
            }
        }
        b[24..56].copy_from_slice(&self.secret);
        b
    }

    /// Parses the binary form.
    pub fn from_bytes(b: &[u8]) -> Result<Self, CoreError> {
        let bad = |r: &str| CoreError::malformed("unique id", r.to_string());
        if b.len() != UNIQUE_ID_BYTES {
            return Err(bad(&format!("{} bytes, expected {UNIQUE_ID_BYTES}", b.len())));
        }
        if &b[0..4] != MAGIC {
            return Err(bad("bad magic (not an oxccl unique id)"));
        }
        if b[4] != VERSION {
            return Err(bad(&format!("unsupported version {}", b[4])));
        }
        if b[56..].iter().any(|x| *x != 0) {
            return Err(bad("reserved bytes are not zero"));
        }
        let port = u16::from_be_bytes([b[6], b[7]]);
        let ip = match b[5] {
            4 => IpAddr::V4(Ipv4Addr::new(b[8], b[9], b[10], b[11])),
            6 => {
                let mut o = [0u8; 16];
                o.copy_from_slice(&b[8..24]);
                IpAddr::V6(Ipv6Addr::from(o))
            }
            f => return Err(bad(&format!("unknown address family {f}"))),
        };
        let mut secret = [0u8; 32];
        secret.copy_from_slice(&b[24..56]);
        Ok(UniqueId { root: SocketAddr::new(ip, port), secret })
    }

    /// The communicator identity derived from the secret.
    pub fn comm_hash(&self) -> CommHash {
        comm_hash(&self.secret)
    }
}

/// The 64-bit identity of the communicator with `secret`.
pub fn comm_hash(secret: &[u8; 32]) -> CommHash {
    let d = Sha256::digest(secret);
    let mut h = [0u8; 8];
    h.copy_from_slice(&d[..8]);
    CommHash(u64::from_le_bytes(h))
}

/// A secret derived from `parent` for a purpose and parameters (split children, env-based
/// rendezvous): every rank that derives with the same inputs gets the same secret, and nobody
/// without `parent` can compute it.
pub fn derive_secret(parent: &[u8], label: &str, parts: &[u64]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((parent.len() as u64).to_le_bytes());
    h.update(parent);
    h.update((label.len() as u64).to_le_bytes());
    h.update(label.as_bytes());
    for p in parts {
        h.update(p.to_le_bytes());
    }
    h.finalize().into()
}

impl core::fmt::Display for UniqueId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{TEXT_PREFIX}{}/", self.root)?;
        for b in self.secret {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl core::str::FromStr for UniqueId {
    type Err = CoreError;

    fn from_str(s: &str) -> Result<Self, CoreError> {
        let bad = |r: &str| CoreError::malformed("unique id text", r.to_string());
        let s = s.trim();
        let rest = s
            .strip_prefix(TEXT_PREFIX)
            .ok_or_else(|| bad(&format!("does not start with {TEXT_PREFIX:?}")))?;
        let (addr, hex) = rest.rsplit_once('/').ok_or_else(|| bad("missing '/<secret>'"))?;
        let root: SocketAddr = addr.parse().map_err(|_| bad(&format!("bad address {addr:?}")))?;
        if hex.len() != 64 {
            return Err(bad(&format!("secret has {} hex digits, expected 64", hex.len())));
        }
        let mut secret = [0u8; 32];
        for (i, b) in secret.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .map_err(|_| bad("secret is not hexadecimal"))?;
        }
        Ok(UniqueId { root, secret })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(addr: &str) -> UniqueId {
        let mut secret = [0u8; 32];
        for (i, b) in secret.iter_mut().enumerate() {
            *b = (i * 37 + 11) as u8;
        }
        UniqueId { root: addr.parse().unwrap(), secret }
    }

    #[test]
    fn binary_and_text_round_trip() {
        for a in ["10.1.2.3:29500", "[fd00::2]:1234", "127.0.0.1:1"] {
            let u = id(a);
            let b = u.to_bytes();
            assert_eq!(b.len(), 128);
            assert_eq!(UniqueId::from_bytes(&b).unwrap(), u);
            let t = u.to_string();
            assert!(t.starts_with("oxccl1@"), "{t}");
            assert_eq!(t.parse::<UniqueId>().unwrap(), u);
            assert!(!format!("{u:?}").contains(&t[t.len() - 10..]), "debug hides the secret");
        }
    }

    #[test]
    fn garbage_is_rejected() {
        assert!(UniqueId::from_bytes(&[0u8; 128]).is_err());
        assert!(UniqueId::from_bytes(&[0u8; 12]).is_err());
        let mut b = id("1.2.3.4:5").to_bytes();
        b[100] = 1;
        assert!(UniqueId::from_bytes(&b).is_err());
        assert!("oxccl1@1.2.3.4:5/zz".parse::<UniqueId>().is_err());
        assert!("nccl@1.2.3.4:5/00".parse::<UniqueId>().is_err());
        let t = id("1.2.3.4:5").to_string();
        assert!(t.replace('a', "g").parse::<UniqueId>().is_err() || !t.contains('a'));
    }

    #[test]
    fn derived_secrets_differ_by_input() {
        let p = [1u8; 32];
        assert_eq!(derive_secret(&p, "split", &[1, 2]), derive_secret(&p, "split", &[1, 2]));
        assert_ne!(derive_secret(&p, "split", &[1, 2]), derive_secret(&p, "split", &[1, 3]));
        assert_ne!(derive_secret(&p, "split", &[1]), derive_secret(&[2u8; 32], "split", &[1]));
    }
}

//! Newtypes that carry meaning: ranks, channel ids, byte counts.

/// A rank inside one communicator, `0..size`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rank(pub u32);

impl Rank {
    /// The rank as an index.
    pub const fn idx(self) -> usize {
        self.0 as usize
    }

    /// Rank `i`.
    pub const fn new(i: usize) -> Rank {
        Rank(i as u32)
    }
}

impl From<usize> for Rank {
    fn from(i: usize) -> Rank {
        Rank(i as u32)
    }
}

impl From<u32> for Rank {
    fn from(i: u32) -> Rank {
        Rank(i)
    }
}

impl core::fmt::Display for Rank {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One parallel pipeline of a collective (a ring, with its own connections).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId(pub u16);

/// A communicator's 64-bit identity, derived from its secret (for logs and message routing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CommHash(pub u64);

impl core::fmt::Display for CommHash {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

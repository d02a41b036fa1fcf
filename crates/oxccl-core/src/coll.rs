//! Collective kinds and the argument checks every entry point shares.

use crate::dtype::DataType;
use crate::error::CoreError;
use crate::types::Rank;

/// The kind of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    AllToAllV,
    Gather,
    Scatter,
    Send,
    Recv,
}

impl Collective {
    /// Every kind.
    pub const ALL: [Collective; 11] = [
        Collective::AllReduce,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::AllToAllV,
        Collective::Gather,
        Collective::Scatter,
        Collective::Send,
        Collective::Recv,
    ];

    /// The operation's name, as the Rust API spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllToAll => "all_to_all",
            Collective::AllToAllV => "all_to_all_v",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::Send => "send",
            Collective::Recv => "recv",
        }
    }
}

impl core::fmt::Display for Collective {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

impl Collective {
    /// Whether the collective combines values (takes a reduction operator).
    pub const fn reduces(self) -> bool {
        matches!(self, Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter)
    }

    /// Whether the collective has a root.
    pub const fn rooted(self) -> bool {
        matches!(self, Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter)
    }

    /// Whether it is a point-to-point operation.
    pub const fn is_p2p(self) -> bool {
        matches!(self, Collective::Send | Collective::Recv)
    }

    /// Parses a name as users spell it: `all_reduce`, `allreduce`, `AllReduce`,
    /// `all_reduce_perf` (nccl-tests' binaries), …
    pub fn parse(s: &str) -> Option<Collective> {
        let flat = |n: &str| n.chars().filter(|c| *c != '_').collect::<String>().to_lowercase();
        let k = flat(s.trim().trim_end_matches("_perf"));
        Collective::ALL.into_iter().find(|c| flat(c.name()) == k)
    }
}

/// The collectives with a ring schedule, which the tuner prices: a subset of [`Collective`],
/// whose names and properties are theirs. The order is the tuner's table order (`as usize`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RingColl {
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllReduce,
}

impl RingColl {
    pub const ALL: [RingColl; 5] = [
        RingColl::Broadcast,
        RingColl::Reduce,
        RingColl::AllGather,
        RingColl::ReduceScatter,
        RingColl::AllReduce,
    ];

    /// The collective it is.
    pub const fn collective(self) -> Collective {
        match self {
            RingColl::Broadcast => Collective::Broadcast,
            RingColl::Reduce => Collective::Reduce,
            RingColl::AllGather => Collective::AllGather,
            RingColl::ReduceScatter => Collective::ReduceScatter,
            RingColl::AllReduce => Collective::AllReduce,
        }
    }

    /// The collective's name ([`Collective::name`]).
    pub const fn name(self) -> &'static str {
        self.collective().name()
    }

    /// Parses a name as [`Collective::parse`] does; `None` for a collective without a ring.
    pub fn parse(s: &str) -> Option<RingColl> {
        Collective::parse(s).and_then(|c| RingColl::try_from(c).ok())
    }
}

impl From<RingColl> for Collective {
    fn from(c: RingColl) -> Collective {
        c.collective()
    }
}

impl TryFrom<Collective> for RingColl {
    type Error = Collective;
    fn try_from(c: Collective) -> Result<RingColl, Collective> {
        RingColl::ALL.into_iter().find(|r| r.collective() == c).ok_or(c)
    }
}

impl core::fmt::Display for RingColl {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// Checks that `rank` names a member of a communicator of `size` ranks.
pub fn check_rank(arg: &'static str, rank: i64, size: usize) -> Result<Rank, CoreError> {
    if rank < 0 || rank as u64 >= size as u64 {
        return Err(CoreError::RankOutOfRange { arg, rank, size });
    }
    Ok(Rank::new(rank as usize))
}

/// Checks that a buffer of `got` elements holds the `needed` the call uses.
pub fn check_len(arg: &'static str, needed: usize, got: usize) -> Result<(), CoreError> {
    if got < needed {
        return Err(CoreError::BufferTooShort { arg, needed, got });
    }
    Ok(())
}

/// `count × factor` elements, checked against overflow of the byte size.
pub fn elems(arg: &'static str, count: usize, factor: usize, dtype: DataType) -> Result<usize, CoreError> {
    count
        .checked_mul(factor)
        .filter(|n| n.checked_mul(dtype.size_bytes()).is_some_and(|b| b <= isize::MAX as usize))
        .ok_or(CoreError::CountOverflow { arg, count, dtype })
}

/// One side of an all-to-all-v: per-peer counts and displacements (elements) into a buffer
/// of `len` elements.
#[derive(Clone, Copy, Debug)]
pub struct Segments<'a> {
    pub counts: &'a [usize],
    pub displs: &'a [usize],
    pub len: usize,
}

/// Validates all-to-all-v arguments for a communicator of `size`: four arrays of `size`
/// entries whose segments fit the buffers, and a self segment whose send and receive counts
/// agree. Returns nothing; the plan addresses segments itself.
pub fn check_alltoallv(
    size: usize,
    me: Rank,
    send: Segments<'_>,
    recv: Segments<'_>,
) -> Result<(), CoreError> {
    let (send_counts, send_displs, send_len) = (send.counts, send.displs, send.len);
    let (recv_counts, recv_displs, recv_len) = (recv.counts, recv.displs, recv.len);
    let arrays: [(&'static str, &[usize]); 4] = [
        ("send_counts", send_counts),
        ("send_displs", send_displs),
        ("recv_counts", recv_counts),
        ("recv_displs", recv_displs),
    ];
    for (arg, a) in arrays {
        if a.len() != size {
            return Err(CoreError::invalid(
                arg,
                format!("has {} entries, the communicator has {size} ranks", a.len()),
            ));
        }
    }
    let fit = |cargs: &'static str, c: &[usize], d: &[usize], len: usize| -> Result<(), CoreError> {
        for (peer, (c, d)) in c.iter().zip(d).enumerate() {
            let end = c
                .checked_add(*d)
                .ok_or_else(|| CoreError::invalid(cargs, format!("segment for rank {peer} overflows")))?;
            if *c > 0 && end > len {
                return Err(CoreError::BufferTooShort { arg: cargs, needed: end, got: len });
            }
        }
        Ok(())
    };
    fit("send", send_counts, send_displs, send_len)?;
    fit("recv", recv_counts, recv_displs, recv_len)?;
    let m = me.idx();
    if send_counts[m] != recv_counts[m] {
        return Err(CoreError::invalid(
            "send_counts",
            format!("rank {m} sends {} elements to itself but receives {}", send_counts[m], recv_counts[m]),
        ));
    }
    // Receive segments must not overlap, or results would depend on arrival order.
    let mut segs: Vec<(usize, usize)> =
        recv_counts.iter().zip(recv_displs).filter(|(c, _)| **c > 0).map(|(c, d)| (*d, d + c)).collect();
    segs.sort();
    if segs.windows(2).any(|w| w[1].0 < w[0].1) {
        return Err(CoreError::invalid("recv_displs", "receive segments overlap"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks() {
        assert!(check_rank("root", 4, 4).is_err());
        assert!(check_rank("root", -1, 4).is_err());
        assert_eq!(check_rank("root", 3, 4).unwrap(), Rank(3));
        let e = check_len("recv", 10, 9).unwrap_err();
        assert_eq!(e.to_string(), "argument `recv`: buffer holds 9 elements but the call needs 10");
        assert!(elems("count", usize::MAX / 2, 4, DataType::F32).is_err());
        assert_eq!(elems("count", 3, 4, DataType::F64).unwrap(), 12);
    }

    fn seg<'a>(counts: &'a [usize], displs: &'a [usize], len: usize) -> Segments<'a> {
        Segments { counts, displs, len }
    }

    #[test]
    fn alltoallv_checks() {
        let r0 = Rank(0);
        let ok = check_alltoallv(2, r0, seg(&[1, 2], &[0, 1], 3), seg(&[1, 1], &[0, 1], 2));
        assert!(ok.is_ok());
        let short = check_alltoallv(2, r0, seg(&[1, 2], &[0, 2], 3), seg(&[1, 1], &[0, 1], 2));
        assert!(matches!(short, Err(CoreError::BufferTooShort { arg: "send", .. })));
        let overlap = check_alltoallv(2, r0, seg(&[1, 1], &[0, 1], 2), seg(&[1, 2], &[0, 0], 2));
        assert!(overlap.is_err());
        let selfm = check_alltoallv(2, Rank(1), seg(&[1, 1], &[0, 1], 2), seg(&[1, 2], &[0, 1], 3));
        assert!(selfm.is_err());
        let wrong = check_alltoallv(3, r0, seg(&[1, 1], &[0, 1], 2), seg(&[1, 1], &[0, 1], 2));
        assert!(wrong.is_err());
    }

    #[test]
    fn every_kind_of_collective_derives_from_the_one_list() {
        use crate::contract::CallKind;
        use crate::plan::device::DeviceColl;
        for c in Collective::ALL {
            // Names parse back in every spelling users write.
            assert_eq!(Collective::parse(c.name()), Some(c));
            assert_eq!(Collective::parse(&c.name().replace('_', "")), Some(c));
            assert_eq!(Collective::parse(&format!("{}_perf", c.name())), Some(c));
            // The contract check's code, the ring subset and the device form map back to it.
            let k = CallKind::from(c);
            assert_eq!(k.collective(), if c.is_p2p() { None } else { Some(c) });
            assert_eq!(CallKind::from_u8(k as u8), Some(k));
            assert_eq!(k.name(), if c.is_p2p() { "send/recv" } else { c.name() });
            match RingColl::try_from(c) {
                Ok(r) => {
                    assert_eq!((r.collective(), r.name(), RingColl::parse(c.name())), (c, c.name(), Some(r)))
                }
                Err(back) => assert_eq!(back, c),
            }
            if let Some(d) = DeviceColl::of(c, 3) {
                assert_eq!((d.collective(), d.reduces(), d.root().is_some()), (c, c.reduces(), c.rooted()));
            }
        }
        let rings: Vec<Collective> = RingColl::ALL.iter().map(|r| r.collective()).collect();
        assert_eq!(rings.len(), Collective::ALL.iter().filter(|c| RingColl::try_from(**c).is_ok()).count());
        assert_eq!(Collective::parse("AllReduce"), Some(Collective::AllReduce));
        assert_eq!((Collective::parse("allreduc"), CallKind::from_u8(11)), (None, None));
    }
}

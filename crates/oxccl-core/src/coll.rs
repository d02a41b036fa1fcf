//! Collective kinds and the argument checks every entry point shares.

use crate::dtype::DataType;
use crate::error::CoreError;
use crate::types::Rank;

/// The kind of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollKind {
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

impl CollKind {
    /// Every kind.
    pub const ALL: [CollKind; 11] = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AllToAll,
        CollKind::AllToAllV,
        CollKind::Gather,
        CollKind::Scatter,
        CollKind::Send,
        CollKind::Recv,
    ];

    /// The operation's name, as the Rust API spells it.
    pub const fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "all_reduce",
            CollKind::Broadcast => "broadcast",
            CollKind::Reduce => "reduce",
            CollKind::AllGather => "all_gather",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllToAll => "all_to_all",
            CollKind::AllToAllV => "all_to_all_v",
            CollKind::Gather => "gather",
            CollKind::Scatter => "scatter",
            CollKind::Send => "send",
            CollKind::Recv => "recv",
        }
    }
}

impl core::fmt::Display for CollKind {
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
}

//! Intra-host direct algorithms: when every rank of a communicator shares one host, ranks
//! read (and write) each other's memory directly instead of streaming chunks through
//! connections. This module says who computes what; the runtime's direct engine maps the
//! memory and runs it.
//!
//! Two modes, chosen identically on every rank:
//! - inline: each rank copies its (small) contribution into its own shared post; every rank
//!   then computes its whole result from the posts, locally, in rank order. One flag exchange,
//!   no writes to peers' memory.
//! - zero-copy: every rank's buffers are shared allocations, mapped by its peers; the work is
//!   split so that each byte of input is read once and each byte of output written once
//!   (all-reduce: rank `i` reduces slice `i` of every input into slice `i` of every output).
//!
//! Slices are whole cache lines (64 bytes) where the count allows, so two ranks never write
//! the same line.

use std::ops::Range;

/// The element range of slice `i` of `n` elements split `parts` ways, aligned to 64 bytes of
/// `es`-byte elements (the last slice takes the remainder).
pub fn slice(n: usize, parts: usize, i: usize, es: usize) -> Range<usize> {
    let unit = (64 / es).max(1);
    let units = n.div_ceil(unit);
    let lo = (units * i / parts * unit).min(n);
    let hi = if i + 1 == parts { n } else { (units * (i + 1) / parts * unit).min(n) };
    lo..hi.max(lo)
}

/// Bytes a rank contributes to an operation (what its inline post must hold).
pub fn contribution_bytes(kind: DirectKind, count: usize, es: usize, nranks: usize, is_root: bool) -> usize {
    match kind {
        DirectKind::AllReduce | DirectKind::Reduce | DirectKind::AllGather | DirectKind::Gather => count * es,
        DirectKind::Broadcast => {
            if is_root {
                count * es
            } else {
                0
            }
        }
        DirectKind::ReduceScatter | DirectKind::AllToAll => count * es * nranks,
        DirectKind::Scatter => {
            if is_root {
                count * es * nranks
            } else {
                0
            }
        }
        DirectKind::AllToAllV => usize::MAX,
    }
}

/// The collectives the direct path serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectKind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    AllToAllV,
    Gather,
    Scatter,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_exactly_and_align() {
        for es in [1usize, 2, 4, 8] {
            for parts in 1..=9 {
                for n in [0usize, 1, 7, 16, 63, 64, 65, 1000, 4099] {
                    let mut at = 0;
                    for i in 0..parts {
                        let r = slice(n, parts, i, es);
                        assert_eq!(r.start, at, "n={n} parts={parts} i={i}");
                        if i + 1 < parts {
                            assert_eq!((r.end * es) % 64, 0, "n={n} parts={parts} i={i} es={es}");
                        }
                        at = r.end;
                    }
                    assert_eq!(at, n);
                }
            }
        }
    }
}

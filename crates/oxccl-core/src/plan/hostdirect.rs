//! Intra-host direct algorithms: when every rank of a communicator shares one host, ranks
//! read (and write) each other's memory directly instead of streaming chunks through
//! connections. This module says who computes what; the runtime's direct engine maps the
//! memory and runs it.
//!
//! Modes, chosen identically on every rank (the runtime adds a third for heap buffers,
//! cross-memory reads, where [`cma_auto`] or `OXCCL_CMA=1` says):
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

/// Whether a heap call of `kind` takes the cross-memory mode under `OXCCL_CMA=auto` (the
/// default): where one `process_vm_readv` copy per byte beat the two shared-memory copies
/// (sender into a slot, receiver out of it) when measured. `bytes` is the call's size as
/// nccl-tests counts it (all-gather: the whole output; broadcast: the buffer);
/// `oversubscribed`: more ranks than cores.
///
/// Measured on a 2-vCPU KVM guest, oxccl-perf with heap buffers, `OXCCL_CMA=1` against `=0`,
/// 4 alternating rounds, median per-round time ratio, 128 KiB–32 MiB:
/// - all-to-all 0.50–0.90 (2 and 4 ranks), scatter 0.48–0.82: every size;
/// - broadcast 0.55–0.76 at 2 ranks; at 4 (oversubscribed) 1.12–1.26 to 512 KiB, 0.65–0.83
///   from 2 MiB;
/// - all-gather 0.96–1.09 to 512 KiB, 0.75–0.93 from 2 MiB;
/// - all-reduce 1.08–1.91, reduce-scatter 1.01–1.70, gather 0.88–1.64: never (a rank that
///   reduces or gathers pulls serially what the ring's ranks push in parallel).
pub fn cma_auto(kind: DirectKind, bytes: usize, oversubscribed: bool) -> bool {
    let large = bytes >= crate::tuning::DIRECT_CMA_AUTO_MIN_BYTES;
    match kind {
        DirectKind::AllToAll | DirectKind::AllToAllV | DirectKind::Scatter => true,
        DirectKind::Broadcast => !oversubscribed || large,
        DirectKind::AllGather => large,
        DirectKind::AllReduce | DirectKind::ReduceScatter | DirectKind::Reduce | DirectKind::Gather => false,
    }
}

/// What [`cma_auto`] takes, in words (for the log).
pub fn cma_auto_described() -> String {
    let mib = crate::tuning::DIRECT_CMA_AUTO_MIN_BYTES >> 20;
    format!(
        "all-to-all(v), scatter, broadcast (from {mib} MiB where ranks outnumber cores) and \
         all-gather from {mib} MiB"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cma_auto_takes_the_measured_winners() {
        let big = crate::tuning::DIRECT_CMA_AUTO_MIN_BYTES;
        for over in [false, true] {
            for b in [128 << 10, big, 64 << 20] {
                assert!(cma_auto(DirectKind::AllToAll, b, over) && cma_auto(DirectKind::AllToAllV, b, over));
                assert!(cma_auto(DirectKind::Scatter, b, over));
                for k in
                    [DirectKind::AllReduce, DirectKind::ReduceScatter, DirectKind::Reduce, DirectKind::Gather]
                {
                    assert!(!cma_auto(k, b, over), "{k:?} {b} {over}");
                }
                assert_eq!(cma_auto(DirectKind::AllGather, b, over), b >= big);
                assert_eq!(cma_auto(DirectKind::Broadcast, b, over), !over || b >= big);
            }
        }
    }

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

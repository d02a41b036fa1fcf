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

use crate::coll::Collective;
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
pub fn contribution_bytes(kind: Collective, count: usize, es: usize, nranks: usize, is_root: bool) -> usize {
    match kind {
        Collective::AllReduce | Collective::Reduce | Collective::AllGather | Collective::Gather => count * es,
        Collective::Broadcast => {
            if is_root {
                count * es
            } else {
                0
            }
        }
        Collective::ReduceScatter | Collective::AllToAll => count * es * nranks,
        Collective::Scatter => {
            if is_root {
                count * es * nranks
            } else {
                0
            }
        }
        // Never inline: all-to-all-v's sizes differ per peer; point-to-point calls take no
        // direct path.
        Collective::AllToAllV | Collective::Send | Collective::Recv => usize::MAX,
    }
}

/// What the cross-memory choices depend on besides the call; fixed per communicator and the
/// same on every rank of the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Host {
    pub nranks: usize,
    /// More ranks than cores.
    pub oversubscribed: bool,
    /// Bytes of one core's L2 cache (of CPU 0, so that every rank sees the same).
    pub l2_bytes: usize,
}

impl Host {
    /// The L2 size assumed where the machine does not say.
    pub const L2_UNKNOWN: usize = 512 << 10;
}

/// Whether a two-rank cross-memory all-reduce of `bytes` has each rank reduce both whole
/// inputs (`true`) instead of its half of them followed by a pull of the other half of the
/// peer's result. The same bytes cross between the cores either way; the whole reduction saves
/// the middle wait and reads only inputs, which stay where their owner left them (in a
/// benchmark, which never rewrites its inputs, in both caches), but reads and writes twice
/// what the split does in each rank's own cache, so it stops paying once both inputs and the
/// output outgrow the L2: below half of it. Measured on an Intel Xeon 2-vCPU guest (2 MiB L2,
/// 2026-12-05), oxccl-perf, heap, `OXCCL_CMA=1`, 4 alternating rounds, whole ÷ split: 16-64 KiB
/// 0.51, 128 KiB 0.51, 256 KiB 0.68, 512 KiB 0.86, 1 MiB 1.20, 2-4 MiB 1.26-1.31.
pub fn all_reduce_whole(bytes: usize, h: &Host) -> bool {
    h.nranks == 2 && bytes < h.l2_bytes / 2
}

/// Whether a heap call of `kind` too large to go inline takes the cross-memory mode under
/// `OXCCL_CMA=auto` (the default): where one `process_vm_readv` copy per byte beat the two
/// shared-memory copies (sender into a slot, receiver out of it) when measured. `bytes` is
/// the call's size as nccl-tests counts it (all-gather: the whole output; broadcast: the
/// buffer); `oversubscribed`: more ranks than cores.
///
/// Measured on 2-vCPU KVM guests, oxccl-perf with heap buffers, `OXCCL_CMA=1` against `=0`,
/// 128 KiB–32 MiB, ratios of times (below 1: cross-memory is faster). An AMD EPYC guest, 4
/// alternating rounds, median per-round ratio:
/// - all-to-all 0.50–0.90 (2 and 4 ranks), scatter 0.48–0.82: every size;
/// - broadcast 0.55–0.76 at 2 ranks; at 4 (oversubscribed) 1.12–1.26 to 512 KiB, 0.65–0.83
///   from 2 MiB;
/// - all-gather 0.96–1.09 to 512 KiB, 0.75–0.93 from 2 MiB;
/// - all-reduce 1.08–1.91, reduce-scatter 1.01–1.70, gather 0.88–1.64: never (a rank that
///   reduces or gathers pulls serially what the ring's ranks push in parallel).
///
/// An Intel Xeon guest (AMX, 2026-12-05): all-gather 0.40–0.66 at 256 KiB–1 MiB with 2 and 4
/// ranks, so all-gather takes it at every size; a two-rank all-reduce where [`all_reduce_whole`]
/// holds, against the ring: 128 KiB 0.54, 256 KiB 0.58, 512 KiB 0.80.
pub fn cma_auto(kind: Collective, bytes: usize, h: &Host) -> bool {
    let large = bytes >= crate::tuning::DIRECT_CMA_AUTO_MIN_BYTES;
    match kind {
        Collective::AllToAll | Collective::AllToAllV | Collective::Scatter | Collective::AllGather => true,
        Collective::Broadcast => !h.oversubscribed || large,
        Collective::AllReduce => all_reduce_whole(bytes, h),
        Collective::ReduceScatter | Collective::Reduce | Collective::Gather => false,
        Collective::Send | Collective::Recv => false,
    }
}

/// Whether a heap call whose contributions fit the inline area (the largest is
/// `contribution` bytes, over `nranks` ranks) is pulled across memory instead, under
/// `OXCCL_CMA=auto` or `=1`: where every rank has a core of its own and some rank would copy
/// at least [`DIRECT_CMA_OVER_INLINE_MIN_BYTES`](crate::tuning::DIRECT_CMA_OVER_INLINE_MIN_BYTES)
/// out of one peer's post. The inline copy in writes lines that the readers hold and each
/// reader then fetches them from the writer's cache: two transfers between cores per line,
/// where a pull makes one.
///
/// Measured on an Intel Xeon 2-vCPU KVM guest (2026-12-05), oxccl-perf, 2 ranks, heap, times
/// in µs, inline against cross-memory: all-gather 16 KiB 3.65 / 2.39, 64 KiB 11.90 / 4.50,
/// 128 KiB 17.9 / 6.5 (8 KiB 2.19 / 2.20); all-to-all 16 KiB 3.56 / 2.40, 64 KiB 10.7 / 4.1;
/// broadcast 8 KiB 2.43 / 1.61, 64 KiB 20.5 / 3.9; scatter 8 KiB 1.79 / 1.43; gather 16 KiB
/// 2.35 / 1.90; reduce-scatter 32 KiB 5.78 / 4.07, 64 KiB 10.5 / 4.8; all-reduce 16 KiB
/// 7.83 / 6.51, 32 KiB 14.1 / 9.4; reduce 32 KiB 6.41 / 4.05. With 4 ranks on the 2 cores
/// inline won or tied at every inline size (a pull waits for a system call that a spinning
/// peer delays).
pub fn cma_over_inline(kind: Collective, contribution: usize, h: &Host) -> bool {
    if h.oversubscribed {
        return false;
    }
    let nranks = h.nranks;
    let per_peer = match kind {
        Collective::AllGather | Collective::Gather | Collective::Broadcast | Collective::Reduce => {
            contribution
        }
        Collective::AllToAll
        | Collective::AllToAllV
        | Collective::Scatter
        | Collective::ReduceScatter
        | Collective::AllReduce => contribution / nranks.max(1),
        Collective::Send | Collective::Recv => return false,
    };
    per_peer >= crate::tuning::DIRECT_CMA_OVER_INLINE_MIN_BYTES
}

/// What [`cma_auto`] takes, in words (for the log).
pub fn cma_auto_described() -> String {
    let mib = crate::tuning::DIRECT_CMA_AUTO_MIN_BYTES >> 20;
    let kib = crate::tuning::DIRECT_CMA_OVER_INLINE_MIN_BYTES >> 10;
    format!(
        "all-to-all(v), scatter, all-gather, broadcast (from {mib} MiB where ranks outnumber \
         cores) and two-rank all-reduce below half the L2 beyond the inline area, and every \
         collective within it where a rank would copy {kib} KiB or more from one peer and ranks \
         have cores of their own"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(nranks: usize, oversubscribed: bool) -> Host {
        Host { nranks, oversubscribed, l2_bytes: 2 << 20 }
    }

    #[test]
    fn cma_auto_takes_the_measured_winners() {
        let big = crate::tuning::DIRECT_CMA_AUTO_MIN_BYTES;
        for over in [false, true] {
            for p in [2usize, 4] {
                let h = host(p, over);
                for b in [128 << 10, big, 64 << 20] {
                    assert!(cma_auto(Collective::AllToAll, b, &h) && cma_auto(Collective::AllToAllV, b, &h));
                    assert!(cma_auto(Collective::Scatter, b, &h));
                    for k in [Collective::ReduceScatter, Collective::Reduce, Collective::Gather] {
                        assert!(!cma_auto(k, b, &h), "{k:?} {b} {over}");
                    }
                    assert!(cma_auto(Collective::AllGather, b, &h));
                    assert_eq!(cma_auto(Collective::Broadcast, b, &h), !over || b >= big);
                    // All-reduce: two ranks, below half the L2 (1 MiB here).
                    assert_eq!(cma_auto(Collective::AllReduce, b, &h), p == 2 && b < 1 << 20, "{p} {b}");
                }
            }
        }
    }

    #[test]
    fn whole_all_reduce_needs_two_ranks_and_room_in_l2() {
        let h = Host { nranks: 2, oversubscribed: false, l2_bytes: 512 << 10 };
        assert!(all_reduce_whole((256 << 10) - 4, &h));
        assert!(!all_reduce_whole(256 << 10, &h));
        assert!(!all_reduce_whole(1024, &Host { nranks: 3, ..h }));
    }

    #[test]
    fn cma_over_inline_counts_what_one_peer_gives() {
        let min = crate::tuning::DIRECT_CMA_OVER_INLINE_MIN_BYTES;
        for p in [2usize, 3, 8] {
            let (h, over) = (host(p, false), host(p, true));
            for k in [Collective::AllGather, Collective::Gather, Collective::Broadcast, Collective::Reduce] {
                assert!(cma_over_inline(k, min, &h), "{k:?} {p}");
                assert!(!cma_over_inline(k, min - 1, &h), "{k:?} {p}");
                assert!(!cma_over_inline(k, 64 << 10, &over), "{k:?} {p} oversubscribed");
            }
            for k in
                [Collective::AllToAll, Collective::Scatter, Collective::ReduceScatter, Collective::AllReduce]
            {
                assert!(cma_over_inline(k, min * p, &h), "{k:?} {p}");
                assert!(!cma_over_inline(k, min * p - 1, &h), "{k:?} {p}");
                assert!(!cma_over_inline(k, 64 << 10, &over), "{k:?} {p} oversubscribed");
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

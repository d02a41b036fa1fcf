//! A cost model of oxccl's bootstrap (the rendezvous root, the peer table, the control
//! connections), dense against sparse, for rank counts no machine here can start.
//!
//! The phases, as the code runs them (`oxccl::bootstrap`):
//! 1. Every rank connects to the root and sends its join (one message each). The root takes
//!    joins one at a time: `join_us` each, serial.
//! 2. Dense: the root writes the whole table (N entries) to every rank, N² entries through
//!    one NIC. Sparse: the root writes a route (O(log N) bytes) to every rank and the table to
//!    rank 0 only, which relays it down a binary heap: depth ⌊log₂ N⌋, each hop a connect and
//!    the table to two children in turn (the second child's copy waits for the first).
//! 3. Each rank decodes the table (`decode_us_per_entry`), off the relay path.
//! 4. Each rank opens control connections to its lifelines, one after another: dense, all
//!    N − 1 peers; sparse, its neighbours (at most 11: ring 2, two trees 6, relay tree 3).
//!
//! Rounds are the message latencies on the critical path: dense pays 2 + (N − 1) (its
//! connects are sequential), sparse 2 + ⌊log₂ N⌋ + 11.

/// What the model is given.
#[derive(Clone, Debug)]
pub struct BootParams {
    /// Bytes per table entry (measured from the real encoder).
    pub entry_bytes: f64,
    /// Decoding, µs per entry (measured).
    pub decode_us_per_entry: f64,
    /// The root's serial cost per join, µs (measured with `root_throughput`).
    pub join_us: f64,
    /// A TCP connect plus the hello, µs.
    pub connect_us: f64,
    /// The bootstrap interface's bandwidth, GB/s.
    pub gbs: f64,
    /// Sparse lifelines per rank (an upper bound).
    pub sparse_lifelines: usize,
}

/// The model's answer for one rank count and mode.
#[derive(Clone, Debug, PartialEq)]
pub struct BootCost {
    pub ranks: usize,
    pub sparse: bool,
    /// Message latencies on the critical path.
    pub rounds: u64,
    /// Messages (joins, routes, tables, relays, connection hellos) in all.
    pub messages: u64,
    /// Bytes the root sends.
    pub root_bytes: f64,
    /// Control connections each rank opens.
    pub conns_per_rank: u64,
    /// Seconds: the root taking joins, getting the table out (root writes or the relay),
    /// decoding, opening lifelines; and their sum.
    pub join_s: f64,
    pub table_s: f64,
    pub decode_s: f64,
    pub connect_s: f64,
    pub total_s: f64,
}

/// Depth of the relay heap's deepest rank (rank N − 1).
pub fn relay_depth(n: usize) -> u64 {
    if n <= 1 {
        0
    } else {
        u64::from(usize::BITS - n.leading_zeros() - 1)
    }
}

/// The bootstrap's cost at `n` ranks.
pub fn cost(n: usize, sparse: bool, p: &BootParams) -> BootCost {
    let nf = n as f64;
    let table = nf * p.entry_bytes;
    let bps = p.gbs * 1e9;
    let join_s = nf * p.join_us * 1e-6;
    let decode_s = nf * p.decode_us_per_entry * 1e-6;
    let lifelines = if sparse { p.sparse_lifelines.min(n.saturating_sub(1)) } else { n.saturating_sub(1) };
    let connect_s = lifelines as f64 * p.connect_us * 1e-6;
    let (table_s, root_bytes, rounds, messages) = if sparse {
        let d = relay_depth(n);
        let hop = p.connect_us * 1e-6 + 2.0 * table / bps;
        // Routes are a few hundred bytes (ancestors' addresses): counted at 200 B.
        (
            table / bps + d as f64 * hop,
            table + nf * 200.0,
            2 + d + lifelines as u64,
            3 * n as u64 + (n * lifelines) as u64,
        )
    } else {
        (nf * table / bps, nf * table, 2 + lifelines as u64, 2 * n as u64 + (n * lifelines) as u64)
    };
    BootCost {
        ranks: n,
        sparse,
        rounds,
        messages,
        root_bytes,
        conns_per_rank: lifelines as u64,
        join_s,
        table_s,
        decode_s,
        connect_s,
        total_s: join_s + table_s + decode_s + connect_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> BootParams {
        BootParams {
            entry_bytes: 113.0,
            decode_us_per_entry: 0.3,
            join_us: 40.0,
            connect_us: 50.0,
            gbs: 3.0,
            sparse_lifelines: 11,
        }
    }

    #[test]
    fn sparse_rounds_grow_as_log_n_and_dense_as_n() {
        for n in [1024usize, 1 << 14, 1 << 17] {
            let (d, s) = (cost(n, false, &p()), cost(n, true, &p()));
            assert_eq!(s.rounds, 2 + relay_depth(n) + 11);
            assert_eq!(d.rounds, 2 + (n as u64 - 1));
            // Sparse: the root sends one table and n routes; dense: n tables.
            assert_eq!(d.root_bytes, (n * n) as f64 * 113.0);
            assert!(s.root_bytes < 2.0 * n as f64 * 313.0);
            assert!(s.total_s < d.total_s);
        }
        assert_eq!(relay_depth(1), 0);
        assert_eq!(relay_depth(2), 1);
        assert_eq!(relay_depth(3), 1);
        assert_eq!(relay_depth(4), 2);
        assert_eq!(relay_depth(100_000), 16);
    }

    #[test]
    fn sparse_time_is_the_roots_joins_plus_log_many_hops() {
        let q = p();
        let s = cost(100_000, true, &q);
        let table = 100_000.0 * 113.0 / 3e9;
        let want =
            100_000.0 * 40e-6 + table + 16.0 * (50e-6 + 2.0 * table) + 100_000.0 * 0.3e-6 + 11.0 * 50e-6;
        assert!((s.total_s - want).abs() < 1e-9, "{} vs {want}", s.total_s);
    }
}

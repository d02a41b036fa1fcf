//! A cost model of oxccl's bootstrap (the rendezvous roots, the peer table, the control
//! connections), dense against sparse, with one root or R (a scalable init), for rank counts
//! no machine here can start.
//!
//! The phases, as the code runs them (`oxccl::bootstrap`, `bootstrap::roots`), with R roots
//! each in its own process on its own host (R = 1: the single root; its phases 2 and 3 cost
//! nothing):
//! 1. Every rank connects to its root (root k serves ranks of a contiguous share of ⌈N/R⌉ or
//!    ⌊N/R⌋) and sends its join. Each root takes its joins one at a time (`join_us` each); the
//!    roots work side by side: ⌈N/R⌉ · `join_us`.
//! 2. R > 1: each root k > 0, once its share is in, connects to root 0 and sends its share's
//!    entries; root 0 receives N − N/R entries through its NIC and decodes them.
//! 3. R > 1: root 0 writes the whole table to each of the R − 1 other roots, one after
//!    another, before answering its own share; each root decodes the table (to route its
//!    ranks) once it has it.
//! 4. Dense: each root writes the whole table to each rank of its share (⌈N/R⌉ tables
//!    through each root's NIC, the roots side by side; the last root's table arrives last).
//!    Sparse: each root writes a route (O(log N) bytes) to each rank of its share; root 0
//!    writes the table to rank 0, which relays it down a binary heap: depth ⌊log₂ N⌋, each
//!    hop a connect and the table to two children in turn (the second child's copy waits for
//!    the first). The ranks of the other shares wait for the relay, not for their roots.
//! 5. Each rank decodes the table (`decode_us_per_entry`), off the relay path.
//! 6. Each rank opens control connections to its lifelines, one after another: dense, all
//!    N − 1 peers; sparse, its neighbours (at most 11: ring 2, two trees 6, relay tree 3).
//!
//! Rounds are the message latencies on the critical path: dense pays 2 + (N − 1) (its
//! connects are sequential), sparse 2 + ⌊log₂ N⌋ + 11; R > 1 adds 2 (report, answer).

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
    /// Rendezvous roots.
    pub roots: usize,
    /// Message latencies on the critical path.
    pub rounds: u64,
    /// Messages (joins, routes, tables, relays, connection hellos) in all.
    pub messages: u64,
    /// Bytes root 0 sends.
    pub root_bytes: f64,
    /// Control connections each rank opens.
    pub conns_per_rank: u64,
    /// Seconds: the roots taking joins, the roots joining each other (reports to root 0 and
    /// its table back, to the moment the last root has decoded it), getting the table out
    /// (root writes or the relay: sparse, what it adds beyond the roots' decoding, which runs
    /// beside it), decoding, opening lifelines; and their sum.
    pub join_s: f64,
    pub roots_s: f64,
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

/// The bootstrap's cost at `n` ranks over `roots` rendezvous roots (at least 1, at most `n`).
pub fn cost(n: usize, sparse: bool, roots: usize, p: &BootParams) -> BootCost {
    let r = roots.clamp(1, n.max(1));
    let nf = n as f64;
    let share = n.div_ceil(r) as f64;
    let table = nf * p.entry_bytes;
    let bps = p.gbs * 1e9;
    // Phase 1: each root its share's joins, the roots side by side.
    let join_s = share * p.join_us * 1e-6;
    // Phases 2 and 3: the reports into root 0 (its NIC and its decoding), then its R − 1
    // tables out, one after another; the last root decodes its copy.
    let rest = r as f64 - 1.0;
    let (report_s, spread_s, root_decode_s) = if r > 1 {
        let others = nf - nf / r as f64;
        (
            p.connect_us * 1e-6 + others * p.entry_bytes / bps + others * p.decode_us_per_entry * 1e-6,
            rest * table / bps,
            nf * p.decode_us_per_entry * 1e-6,
        )
    } else {
        (0.0, 0.0, 0.0)
    };
    let roots_s = report_s + spread_s + root_decode_s;
    let decode_s = nf * p.decode_us_per_entry * 1e-6;
    let lifelines = if sparse { p.sparse_lifelines.min(n.saturating_sub(1)) } else { n.saturating_sub(1) };
    let connect_s = lifelines as f64 * p.connect_us * 1e-6;
    let extra_rounds = if r > 1 { 2 } else { 0 };
    let (table_s, root_bytes, rounds, messages) = if sparse {
        let d = relay_depth(n);
        let hop = p.connect_us * 1e-6 + 2.0 * table / bps;
        // Root 0 answers rank 0 after its tables to the other roots (counted in roots_s),
        // and the relay goes on from there; the other roots' decoding runs beside it.
        let relay = table / bps + d as f64 * hop;
        // Routes are a few hundred bytes (ancestors' addresses): counted at 200 B.
        (
            (relay - root_decode_s).max(0.0),
            rest * table + table + share * 200.0,
            2 + d + lifelines as u64 + extra_rounds,
            3 * n as u64 + (n * lifelines) as u64 + 2 * (r as u64 - 1),
        )
    } else {
        (
            share * table / bps,
            rest * table + share * table,
            2 + lifelines as u64 + extra_rounds,
            2 * n as u64 + (n * lifelines) as u64 + 2 * (r as u64 - 1),
        )
    };
    BootCost {
        ranks: n,
        sparse,
        roots: r,
        rounds,
        messages,
        root_bytes,
        conns_per_rank: lifelines as u64,
        join_s,
        roots_s,
        table_s,
        decode_s,
        connect_s,
        total_s: join_s + roots_s + table_s + decode_s + connect_s,
    }
}

/// The number of roots (powers of two up to `n` and 1024) the model finds fastest at `n`.
pub fn best_roots(n: usize, sparse: bool, p: &BootParams) -> usize {
    let mut best = (f64::INFINITY, 1);
    let mut r = 1;
    while r <= n.min(1024) {
        let t = cost(n, sparse, r, p).total_s;
        if t < best.0 {
            best = (t, r);
        }
        r *= 2;
    }
    best.1
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
            let (d, s) = (cost(n, false, 1, &p()), cost(n, true, 1, &p()));
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
        let s = cost(100_000, true, 1, &q);
        let table = 100_000.0 * 113.0 / 3e9;
        let want =
            100_000.0 * 40e-6 + table + 16.0 * (50e-6 + 2.0 * table) + 100_000.0 * 0.3e-6 + 11.0 * 50e-6;
        assert!((s.total_s - want).abs() < 1e-9, "{} vs {want}", s.total_s);
    }

    #[test]
    fn several_roots_split_the_joins_and_pay_for_joining_each_other() {
        let q = p();
        let (one, eight) = (cost(100_000, true, 1, &q), cost(100_000, true, 8, &q));
        assert_eq!(eight.join_s, 12_500.0 * 40e-6);
        assert_eq!(eight.rounds, one.rounds + 2);
        let table = 100_000.0 * 113.0 / 3e9;
        let roots = 50e-6 + 87_500.0 * 113.0 / 3e9 + 87_500.0 * 0.3e-6 + 7.0 * table + 100_000.0 * 0.3e-6;
        assert!((eight.roots_s - roots).abs() < 1e-9, "{} vs {roots}", eight.roots_s);
        let relay = table + 16.0 * (50e-6 + 2.0 * table) - 100_000.0 * 0.3e-6;
        assert!((eight.table_s - relay).abs() < 1e-9);
        assert!(eight.total_s < 1.0 && one.total_s > 4.0, "{} {}", eight.total_s, one.total_s);
        // One root: nothing to join.
        assert_eq!(one.roots_s, 0.0);
        assert_eq!(cost(10, false, 50, &q).roots, 10);
        let b = best_roots(100_000, true, &q);
        assert!(b > 1 && cost(100_000, true, b, &q).total_s <= eight.total_s);
        assert_eq!(best_roots(2, false, &q), 1);
    }
}

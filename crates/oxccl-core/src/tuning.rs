//! Tuning constants, in one place, with their units in their names.

/// Default bytes of buffering per connection (all of its slots together).
pub const DEFAULT_BUFFSIZE_BYTES: usize = 1 << 20;
/// Smallest and largest accepted `NCCL_BUFFSIZE`.
pub const MIN_BUFFSIZE_BYTES: usize = 4096;
pub const MAX_BUFFSIZE_BYTES: usize = 1 << 30;
/// Slots per connection: how many chunks a sender may run ahead of its receiver.
pub const SLOTS_PER_CONN: usize = 8;
/// Ring channels when nothing says otherwise, and the most a communicator builds.
pub const DEFAULT_CHANNELS: usize = 1;
pub const MAX_CHANNELS: usize = 32;
/// Defaults when a communicator's rings cross sockets (other hosts, or shared memory off):
/// 512 KiB chunks and two rings in flight. A ring step waits on its peer's previous step, so
/// over a socket each chunk pays a round of wake-ups and system calls; larger chunks and a
/// second ring hide it (P=2 loopback AllReduce: 0.85 GB/s busbw at 1 MiB × 1 ring, 1.6 at
/// 4 MiB × 2 rings; bench/results).
pub const NET_BUFFSIZE_BYTES: usize = 4 << 20;
pub const NET_CHANNELS: usize = 2;
/// The least data (bytes of the call's count) a collective puts on each ring it stripes over.
pub const RING_MIN_BYTES_PER_CHANNEL: usize = 256 << 10;
/// A hierarchical all-reduce cuts its buffer into pieces of at least this many bytes, at most
/// [`HIER_MAX_PIECES`] of them, and pipelines them: piece `j`'s exchange between hosts runs
/// beside piece `j + 1`'s reduce-scatter and piece `j − 1`'s all-gather inside the host, so
/// only the first and the last piece's host phases add to the network's time. Measured over
/// 1 Gbit/s links (2 and 4 hosts × 2 ranks, alternating): 256 KiB pieces against 1 MiB ones
/// took 0.72–0.95 of the time at 512 KiB–8 MiB. At most 32 pieces: at 16–32 MiB, 64 pieces
/// were 1–4 % faster than 16 over 4 hosts but 5–30 % slower over 2 (a phase's start waits for
/// the one before, and 2 hosts' exchange is short); 32 were within 1 % of the better of the two
/// in 7 of 8 points, one outlier.
pub const HIER_PIECE_BYTES: usize = 256 << 10;
pub const HIER_MAX_PIECES: usize = 32;

/// How long a waiting engine polls before it yields the core, then before it sleeps.
pub const SPIN_NS: u64 = 20_000;
/// The spin when a host runs more ranks than it has cores.
pub const SPIN_OVERSUBSCRIBED_NS: u64 = 1_000;
pub const YIELD_NS: u64 = 200_000;
/// The longest single sleep; waits re-check abort and deadlines at least this often.
pub const MAX_SLEEP_MS: u64 = 100;

/// Bootstrap: the largest control frame accepted from any peer or stranger.
pub const MAX_BOOTSTRAP_FRAME_BYTES: usize = 64 << 20;
/// Bootstrap: how long a connection may take to present its hello before it is dropped.
pub const HELLO_DEADLINE_MS: u64 = 10_000;
/// Bootstrap: the most connections the root or a listener holds before they authenticate.
pub const MAX_PENDING_CONNECTIONS: usize = 1024;
/// Bootstrap: delay between attempts to reach a root or peer that is not listening yet.
pub const CONNECT_RETRY_MS: u64 = 20;
/// A rank still waiting at init says what it waits for this often (`OXCCL_WAIT_NOTICE`).
pub const WAIT_NOTICE_S: u64 = 30;
/// A rendezvous root greets each connection as it accepts it; an endpoint that has not greeted
/// within this long is not an oxccl root (say, torchrun's TCPStore on `MASTER_PORT`).
pub const GREET_WAIT_MS: u64 = 3000;
/// Bootstrap: from this many ranks on (`OXCCL_BOOTSTRAP_SPARSE_FROM`), the peer table goes
/// down a binary tree of ranks instead of from the root to each, and each rank opens control
/// connections (lifelines) only to its ring and tree neighbours instead of to every peer.
pub const BOOTSTRAP_SPARSE_FROM: usize = 128;

/// Direct path: the largest contribution a rank copies into its inline post (bytes); larger
/// calls read peers' buffers in place (shared allocations) or take the ring.
pub const DIRECT_INLINE_BYTES: usize = 64 << 10;
/// Direct path: calls whose largest contribution is at most this many bytes always go
/// inline; above it, ranks whose buffers are shared allocations post them for zero-copy.
pub const DIRECT_ZERO_COPY_MIN_BYTES: usize = 1 << 10;
/// Direct path: inline contributions of at least this many bytes are copied in with
/// streaming stores, for the kinds `engine::direct` says.
pub const DIRECT_INLINE_STREAM_MIN_BYTES: usize = 16 << 10;
/// Direct path: bytes reduced per block (kept in L1 while it is written to every output).
pub const DIRECT_BLOCK_BYTES: usize = 8 << 10;
/// Direct path, cross-memory calls: bytes pulled from each peer per block of a reduction (the
/// blocks of all peers stay in L2 while they are reduced; each pull is one system call).
pub const DIRECT_CMA_BLOCK_BYTES: usize = 256 << 10;
/// Direct path, `OXCCL_CMA=auto`: broadcast calls of at least this many bytes read peers'
/// heaps even where ranks outnumber cores ([`crate::plan::hostdirect::cma_auto`] has the
/// numbers).
pub const DIRECT_CMA_AUTO_MIN_BYTES: usize = 2 << 20;
/// Direct path: a heap call small enough to go inline reads peers' heaps instead where each
/// rank would copy at least this many bytes out of some peer's post, and every rank has a core
/// of its own ([`crate::plan::hostdirect::cma_over_inline`] has the numbers).
pub const DIRECT_CMA_OVER_INLINE_MIN_BYTES: usize = 8 << 10;
/// Direct path: how long a waiting rank spins before it yields, when it has a core to itself
/// and when ranks outnumber cores.
pub const DIRECT_SPIN_NS: u64 = 20_000;
pub const DIRECT_SPIN_OVERSUBSCRIBED_NS: u64 = 300;
/// Direct path: buffers of at least this many bytes are written with streaming stores (they
/// would not stay in cache anyway, and streaming saves reading the destination first).
pub const DIRECT_STREAM_MIN_BYTES: usize = 8 << 20;

/// One-shot all-reduce (every rank sends its whole input to every peer) for calls of at most
/// this many bytes, on at most this many ranks, where the direct path does not apply.
pub const ONE_SHOT_MAX_BYTES: usize = 4 << 10;
/// The same bound for communicators whose ranks talk over sockets (several hosts, or
/// `NCCL_SHM_DISABLE=1`): a socket hop costs tens of µs, so one exchange beats the ring's
/// 2(P − 1) hops up to larger calls. Measured on loopback TCP, 4 ranks on 2 cores: one-shot
/// 61 / 72 / 98 µs at 8 / 16 / 32 KiB against the ring's 120 / 114 / 122; at 64 KiB the
/// one-shot's (P − 1)-fold traffic loses (184 against 137).
pub const ONE_SHOT_NET_MAX_BYTES: usize = 32 << 10;

/// The one-shot bound of a communicator that talks over sockets (`net`) or not.
pub fn one_shot_max_bytes(net: bool) -> usize {
    if net {
        ONE_SHOT_NET_MAX_BYTES
    } else {
        ONE_SHOT_MAX_BYTES
    }
}
pub const ONE_SHOT_MAX_RANKS: usize = 8;

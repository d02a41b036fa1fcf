//! The runtime's error type: every failure names the operation, the rank(s) involved and, for
//! OS failures, the OS error.

use oxccl_core::contract::Sig;
use oxccl_core::{CoreError, Rank};
use std::io;
use std::time::Duration;

/// Why the rendezvous root turned a rank away.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectReason {
    /// The rank presented a secret that is not this communicator's.
    WrongSecret,
    /// The rank's world size differs from the one rank 0 created the communicator with.
    WorldSizeMismatch { rank: u32, size: u32, root_size: u32 },
    /// Two processes claimed the same rank.
    DuplicateRank { rank: u32, first: String, second: String },
    /// A rank outside `0..size`.
    RankOutOfRange { rank: u32, size: u32 },
    /// Peers run incompatible protocol versions.
    Version { ours: u32, theirs: u32 },
    /// The root's process ran out of file descriptors (it holds one connection per joined
    /// rank until all have joined) after `joined` ranks; `limit` is its `RLIMIT_NOFILE`.
    RootOutOfDescriptors { joined: u32, limit: u64 },
    /// The rank whose process runs the root could not start, so the communicator cannot form.
    RootRankFailed { rank: u32, reason: String },
    /// A rank joined rendezvous root `root` of `nroots`, but its share is root `its_root`'s
    /// (a scalable init whose ranks disagree on the world size or the number of ids).
    WrongRoot { rank: u32, root: u32, its_root: u32, nroots: u32 },
    /// Two members of one scalable init passed different unique ids at `index` (ids from
    /// different jobs mixed): `by` (a rank, or a root for its ranks) passed the communicator
    /// `theirs`, the others `ours` (comm hashes).
    MixedIds { index: u32, by: String, theirs: String, ours: String },
    /// Rendezvous root `root` (of a scalable init) at `addr` failed or could not be reached.
    RootFailed { root: u32, addr: String, why: String },
}

impl core::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RejectReason::WrongSecret => {
                write!(f, "the unique id's secret does not match the communicator's (stale or foreign unique id?)")
            }
            RejectReason::WorldSizeMismatch { rank, size, root_size } => write!(
                f,
                "rank {rank} was started with world size {size}, but rank 0 created the communicator with world size {root_size}"
            ),
            RejectReason::DuplicateRank { rank, first, second } => {
                write!(f, "rank {rank} joined twice: from {first} and from {second}")
            }
            RejectReason::RankOutOfRange { rank, size } => {
                write!(f, "rank {rank} is outside the world size {size}")
            }
            RejectReason::Version { ours, theirs } => {
                write!(f, "protocol version {theirs} cannot join a version {ours} communicator")
            }
            RejectReason::RootOutOfDescriptors { joined, limit } => write!(
                f,
                "the rendezvous root (in rank 0's process) ran out of file descriptors after {joined} ranks joined: its limit is {limit}; raise `ulimit -n` above the world size for the process that calls new_unique_id"
            ),
            RejectReason::RootRankFailed { rank, reason } => write!(
                f,
                "rank {rank}, whose process runs the rendezvous root, could not start, so the communicator cannot form: {reason}"
            ),
            RejectReason::WrongRoot { rank, root, its_root, nroots } => write!(
                f,
                "rank {rank} joined rendezvous root {root} of {nroots}, but its share of the ranks is root {its_root}'s (do all ranks pass the same world size and the same unique ids?)"
            ),
            RejectReason::MixedIds { index, by, theirs, ours } => write!(
                f,
                "commIds[{index}] differs: {by} passed communicator {theirs} there, the others {ours} (unique ids from different jobs mixed?)"
            ),
            RejectReason::RootFailed { root, addr, why } => {
                write!(f, "rendezvous root {root} (commIds[{root}], at {addr}) failed: {why}")
            }
        }
    }
}

/// An oxccl failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A bad argument, setting or message (the message names which).
    #[error(transparent)]
    Invalid(#[from] CoreError),
    /// A call that is not allowed in the communicator's state.
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// An OS call failed.
    #[error("rank {rank}: {op}{}: {source}", peer.map(|p| format!(" (peer rank {p})")).unwrap_or_default())]
    Io {
        rank: Rank,
        op: &'static str,
        peer: Option<Rank>,
        #[source]
        source: io::Error,
    },
    /// The rendezvous root refused this rank or the whole communicator.
    #[error("rank {rank}: bootstrap failed: {reason}")]
    Rejected { rank: Rank, reason: RejectReason },
    /// The rendezvous address answers, but not as an oxccl root (another program listens there).
    #[error("rank {rank}: the rendezvous endpoint {addr} is not an oxccl root: {saw}; is another program listening there (torchrun's TCPStore on MASTER_PORT, say)?")]
    NotARoot { rank: Rank, addr: String, saw: String },
    /// torchrun's TCPStore (the rendezvous under torchrun) failed or answered outside its
    /// protocol.
    #[error("rank {rank}: rendezvous through torchrun's store at {addr}: {why}")]
    Store { rank: Rank, addr: String, why: String },
    /// The launcher's rendezvous could not be used (PMIx unavailable, rank 0's failure).
    #[error("rank {rank}: rendezvous through {through}: {why}")]
    Rendezvous { rank: Rank, through: String, why: String },
    /// A peer closed its connection while this rank needed it.
    #[error("rank {rank}: {op}: peer rank {peer} (host {host}) closed its connection")]
    PeerClosed { rank: Rank, op: String, peer: Rank, host: String },
    /// A peer sent data that does not match what this rank's call expects.
    #[error("rank {rank}: {op}: rank {peer} sent a {got}-byte chunk where a {want}-byte chunk was expected (the two ranks' calls differ)")]
    Mismatch { rank: Rank, op: String, peer: Rank, got: usize, want: usize },
    /// This rank's call and a peer's call differ (the contract check): another collective,
    /// data type, count, operator or root, or calls made in another order.
    #[error("rank {rank}: {op}: calls differ: rank {rank} is in {mine} but rank {peer} is in {theirs}")]
    CallMismatch { rank: Rank, op: String, peer: Rank, mine: Sig, theirs: Sig },
    /// A peer's communicator failed and it told this rank why.
    #[error("rank {rank}: {op}: rank {peer} (host {host}) failed: {reason}")]
    PeerFailed { rank: Rank, op: String, peer: Rank, host: String, reason: String },
    /// The call waited longer than the communicator's timeout.
    #[error("rank {rank}: {op} timed out after {after:.2?} (the timeout set for this communicator){}{detail}", waiting(.waiting_for))]
    Timeout { rank: Rank, op: String, after: Duration, waiting_for: Vec<Rank>, detail: String },
    /// The communicator was aborted.
    #[error("rank {rank}: communicator aborted")]
    Aborted { rank: Rank },
    /// The communicator failed earlier and cannot run more calls.
    #[error("rank {rank}: communicator unusable after an earlier failure: {first}")]
    Broken { rank: Rank, first: String },
    /// A broken internal invariant (a bug in oxccl).
    #[error("internal error: {0}")]
    Internal(String),
}

/// `1, 3` (at most 64 listed, then how many more).
pub(crate) fn rank_list(r: &[Rank]) -> String {
    const SHOWN: usize = 64;
    let mut s = r.iter().take(SHOWN).map(|r| r.0.to_string()).collect::<Vec<_>>().join(", ");
    if r.len() > SHOWN {
        s += &format!(" and {} more", r.len() - SHOWN);
    }
    s
}

/// A timeout's ", still waiting for rank(s) 1, 3", or nothing when the wait does not know whom
/// it waits for (the operation then says what).
fn waiting(r: &[Rank]) -> String {
    if r.is_empty() {
        String::new()
    } else {
        format!(", still waiting for rank(s) {}", rank_list(r))
    }
}

/// `Result` with oxccl's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(rank: Rank, op: &'static str, peer: Option<Rank>, source: io::Error) -> Self {
        Error::Io { rank, op, peer, source }
    }

    /// Whether the error leaves the communicator unusable (as opposed to a rejected call).
    pub fn is_fatal(&self) -> bool {
        !matches!(self, Error::Invalid(_) | Error::InvalidUsage(_))
    }
}

//! The algorithms a collective can run ([`Algo`]), named as NCCL names them.
//!
//! Rule: a leaf of the tuner: it names only the collectives ([`crate::coll`]), so the tuner's
//! cost model (`tuner/mod.rs`) and its settings (`tuner/enabled.rs`) both build on it.

use crate::coll::RingColl;
use std::fmt;

/// The algorithms, in NCCL's order where NCCL has them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algo {
    Tree,
    Ring,
    /// One exchange step (oxccl's direct / one-shot paths).
    Direct,
    /// Hierarchical (oxccl's; `plan/hier.rs`): inside each host over shared memory, only the
    /// hosts' shares between hosts, every rank of a host on its own rings at once.
    Hier,
}

pub const ALGOS: [Algo; 4] = [Algo::Tree, Algo::Ring, Algo::Direct, Algo::Hier];

impl Algo {
    pub fn name(self) -> &'static str {
        match self {
            Algo::Tree => "Tree",
            Algo::Ring => "Ring",
            Algo::Direct => "Direct",
            Algo::Hier => "Hier",
        }
    }

    /// Whether the algorithm exists for a collective.
    pub fn runs(self, c: RingColl) -> bool {
        match self {
            Algo::Ring => true,
            Algo::Tree | Algo::Direct => c == RingColl::AllReduce,
            Algo::Hier => matches!(c, RingColl::AllReduce | RingColl::AllGather | RingColl::ReduceScatter),
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

//! Calls on device buffers as the device engines take them, and how a group of calls becomes
//! launches (each launch one kernel: one type and operator, up to
//! [`MAX_TASKS`](super::kernels::MAX_TASKS) tasks).
//!
//! Rules both engines (threads of one process: [`super::group`]; processes mapping each
//! other's buffers: [`super::ipc`]) rely on:
//! - collectives are packed into launches from their descriptions alone (kind, type,
//!   operator, count), which every rank of the call has alike, so every rank makes the same
//!   number of collective launches in the same order (the GPU meeting counts them);
//! - send and receive tasks go into launches of their own after the collectives' (they meet
//!   only their peers).

use super::kernels::{Kop, MAX_TASKS};
use oxccl_core::plan::device::{self, DeviceColl, Task};
use oxccl_core::{DataType, ReduceOp};

/// What a call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum What {
    Coll(DeviceColl),
    /// Send to this rank.
    Send(usize),
    /// Receive from this rank.
    Recv(usize),
}

/// One call on device buffers (addresses in this process; 0 where a buffer is not used).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevCall {
    pub what: What,
    pub t: DataType,
    /// The operator of a reduction (ignored otherwise).
    pub op: Kop,
    /// PreMulSum's scalar, as the element's bit pattern.
    pub scalar: u64,
    /// NCCL's count argument.
    pub count: usize,
    pub send: u64,
    pub recv: u64,
}

impl DevCall {
    /// Collective `c` with operator `op` (ignored unless `c` reduces).
    pub fn coll(c: DeviceColl, t: DataType, op: ReduceOp, count: usize, send: u64, recv: u64) -> DevCall {
        DevCall { what: What::Coll(c), t, op: Kop::Op(op), scalar: 0, count, send, recv }
    }

    /// A PreMulSum reduction: each rank's input scaled by its `scalar` (bits of one element of
    /// `t`), then summed.
    pub fn premul(c: DeviceColl, t: DataType, scalar: u64, count: usize, send: u64, recv: u64) -> DevCall {
        DevCall { what: What::Coll(c), t, op: Kop::PreMulSum, scalar, count, send, recv }
    }

    pub fn send(peer: usize, t: DataType, count: usize, buf: u64) -> DevCall {
        DevCall {
            what: What::Send(peer),
            t,
            op: Kop::Op(ReduceOp::Sum),
            scalar: 0,
            count,
            send: buf,
            recv: 0,
        }
    }

    pub fn recv(peer: usize, t: DataType, count: usize, buf: u64) -> DevCall {
        DevCall {
            what: What::Recv(peer),
            t,
            op: Kop::Op(ReduceOp::Sum),
            scalar: 0,
            count,
            send: 0,
            recv: buf,
        }
    }

    /// The collective, if the call is one.
    pub fn collective(&self) -> Option<DeviceColl> {
        match self.what {
            What::Coll(c) => Some(c),
            _ => None,
        }
    }

    /// The kernel a reduction needs; `None` for calls that only copy.
    pub fn class(&self) -> Option<(DataType, Kop)> {
        match self.what {
            What::Coll(c) if c.reduces() => Some((self.t, self.op)),
            _ => None,
        }
    }

    /// Bytes of the data one send or receive moves.
    pub fn bytes(&self) -> usize {
        self.count * self.t.size_bytes()
    }

    /// The call in words, for errors: `all_reduce of 1000 x float (sum)`.
    pub fn describe(&self) -> String {
        let op = match self.op {
            Kop::Op(o) => o.to_string(),
            Kop::PreMulSum => "premulsum".to_string(),
        };
        match self.what {
            What::Coll(c) if c.reduces() => format!("{} of {} x {} ({op})", c.name(), self.count, self.t),
            What::Coll(c) => match c.root() {
                Some(r) => format!("{} of {} x {} (root {r})", c.name(), self.count, self.t),
                None => format!("{} of {} x {}", c.name(), self.count, self.t),
            },
            What::Send(q) => format!("send of {} x {} to rank {q}", self.count, self.t),
            What::Recv(q) => format!("recv of {} x {} from rank {q}", self.count, self.t),
        }
    }

    /// Whether two ranks' descriptions of the same collective agree (everything but the
    /// buffers and PreMulSum's per-rank scalar).
    pub fn agrees(&self, o: &DevCall) -> bool {
        (self.what, self.t, self.count) == (o.what, o.t, o.count)
            && (self.class().is_none() || self.op == o.op)
    }
}

/// Why a device engine cannot run `c` on a communicator of `p` ranks, if it cannot.
pub fn unsupported(c: &DevCall, p: usize) -> Option<String> {
    if let Some((t, op)) = c.class() {
        if super::kernels::reduce_name(t, op).is_none() {
            return Some(format!("no device kernel reduces {t} with {op:?}"));
        }
    }
    let peer = match c.what {
        What::Coll(c) => c.root(),
        What::Send(q) | What::Recv(q) => Some(q),
    };
    match peer {
        Some(q) if q >= p => Some(format!("rank {q} is not a rank of this {p}-rank communicator")),
        _ => None,
    }
}

/// One kernel launch of a group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unit {
    /// The kernel (type and operator); `None`: only copies (any kernel serves).
    pub class: Option<(DataType, Kop)>,
    pub scalar: u64,
    pub tasks: Vec<Task>,
    /// Whether the launch holds collectives (and so meets every rank).
    pub collective: bool,
    /// The most bytes any rank reads and writes in its collectives (the same on every rank).
    pub work: usize,
    /// The collectives the launch holds (the same on every rank).
    pub calls: Vec<DevCall>,
}

impl Unit {
    /// The most tasks any rank's part of this launch's collectives has (the same on every
    /// rank): what packing counts.
    pub fn nominal_tasks(&self, p: usize) -> usize {
        self.calls.iter().filter_map(|c| c.collective()).map(|c| nominal(c, p)).sum()
    }

    /// The kernel to launch: its class, or any for copies only.
    pub fn kernel(&self) -> (DataType, Kop) {
        self.class.unwrap_or((DataType::U8, Kop::Op(ReduceOp::Sum)))
    }

    /// Bytes this rank's tasks read and write.
    pub fn own_bytes(&self) -> usize {
        let elem = self.class.map_or(1, |(t, _)| t.size_bytes());
        self.tasks.iter().map(|t| t.span(elem) * (t.srcs.len() + t.dsts.len())).sum()
    }
}

/// Tasks a collective counts for packing: every rank alike, whatever its own tasks.
fn nominal(c: DeviceColl, p: usize) -> usize {
    if c == DeviceColl::AllToAll {
        p
    } else {
        1
    }
}

/// Packs collectives (each with this rank's tasks) into launches, in order: consecutive
/// collectives share a launch while their kernels agree (copies go with anything) and the
/// nominal task count fits.
pub fn collective_units(colls: &[(DevCall, Vec<Task>)], p: usize) -> Vec<Unit> {
    let mut units: Vec<Unit> = Vec::new();
    let mut nominal_in_last = 0;
    for (c, tasks) in colls {
        let Some(coll) = c.collective() else { continue };
        let n = nominal(coll, p);
        let class = c.class();
        let fits = units.last().is_some_and(|u| {
            let same = match (u.class, class) {
                (Some(a), Some(b)) => a == b && (a.1 != Kop::PreMulSum || u.scalar == c.scalar),
                _ => true,
            };
            same && nominal_in_last + n <= MAX_TASKS
        });
        if !fits {
            units.push(Unit { collective: true, ..Unit::default() });
            nominal_in_last = 0;
        }
        let u = units.last_mut().expect("a unit was just pushed");
        if class.is_some() {
            u.class = class;
            u.scalar = c.scalar;
        }
        u.tasks.extend(tasks.iter().cloned());
        u.work += device::work_bytes(coll, c.count, c.t.size_bytes(), p);
        u.calls.push(*c);
        nominal_in_last += n;
    }
    units
}

/// Send and receive copy tasks in launches of at most [`MAX_TASKS`]; at least one launch when
/// `any_p2p` (the sends' meeting needs a launch even with nothing to copy here).
pub fn p2p_units(tasks: Vec<Task>, any_p2p: bool) -> Vec<Unit> {
    let mut units: Vec<Unit> =
        tasks.chunks(MAX_TASKS).map(|c| Unit { tasks: c.to_vec(), ..Unit::default() }).collect();
    if units.is_empty() && any_p2p {
        units.push(Unit::default());
    }
    units
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bufs(p: usize) -> Vec<device::Bufs> {
        (0..p).map(|q| device::Bufs { send: (q as u64 + 1) << 32, recv: (q as u64 + 9) << 32 }).collect()
    }

    /// Ranks with different task counts (empty slices, in-place copies) still make the same
    /// launches for the same collectives; kernels are shared only where they agree.
    #[test]
    fn every_rank_packs_the_same_collectives_into_the_same_launches() {
        let p = 4;
        let calls = [
            DevCall::coll(DeviceColl::AllReduce, DataType::F32, ReduceOp::Sum, 2, 0, 0),
            DevCall::coll(DeviceColl::Broadcast(1), DataType::F16, ReduceOp::Sum, 3, 0, 0),
            DevCall::coll(DeviceColl::AllToAll, DataType::F32, ReduceOp::Sum, 5, 0, 0),
            DevCall::coll(DeviceColl::ReduceScatter, DataType::F32, ReduceOp::Sum, 5, 0, 0),
            DevCall::coll(DeviceColl::AllReduce, DataType::F32, ReduceOp::Max, 7, 0, 0),
            DevCall::premul(DeviceColl::AllReduce, DataType::F32, 3, 7, 0, 0),
            DevCall::premul(DeviceColl::AllReduce, DataType::F32, 4, 7, 0, 0),
        ];
        type Shape = (Option<(DataType, Kop)>, usize);
        let shapes: Vec<Vec<Shape>> = (0..p)
            .map(|r| {
                let colls: Vec<(DevCall, Vec<Task>)> = calls
                    .iter()
                    .map(|c| {
                        (*c, device::tasks(c.collective().unwrap(), c.count, c.t.size_bytes(), r, &bufs(p)))
                    })
                    .collect();
                collective_units(&colls, p).iter().map(|u| (u.class, u.work)).collect()
            })
            .collect();
        for r in 1..p {
            assert_eq!(shapes[r], shapes[0], "rank {r}");
        }
        let classes: Vec<_> = shapes[0].iter().map(|s| s.0).collect();
        // AllReduce + Broadcast share; the all-to-all's 4 tasks join them (6 nominal); the
        // reduce-scatter still fits (7); Max needs its own kernel; PreMulSums with different
        // scalars do not share.
        assert_eq!(
            classes,
            vec![
                Some((DataType::F32, Kop::Op(ReduceOp::Sum))),
                Some((DataType::F32, Kop::Op(ReduceOp::Max))),
                Some((DataType::F32, Kop::PreMulSum)),
                Some((DataType::F32, Kop::PreMulSum)),
            ]
        );
    }

    #[test]
    fn p2p_tasks_split_into_launches_and_a_send_alone_still_launches() {
        let t = Task::copy(1, vec![2], 8);
        assert_eq!(p2p_units(vec![t.clone(); 9], true).len(), 2);
        assert_eq!(p2p_units(vec![], true).len(), 1);
        assert!(p2p_units(vec![], false).is_empty());
    }

    #[test]
    fn unsupported_calls_say_why() {
        let c = DevCall::coll(DeviceColl::AllReduce, DataType::F32, ReduceOp::BitAnd, 1, 0, 0);
        assert!(unsupported(&c, 2).unwrap().contains("no device kernel"));
        let c = DevCall::coll(DeviceColl::Broadcast(3), DataType::F32, ReduceOp::Sum, 1, 0, 0);
        assert!(unsupported(&c, 2).unwrap().contains("rank 3 is not a rank"));
        assert_eq!(unsupported(&DevCall::send(1, DataType::U8, 4, 0), 2), None);
    }
}

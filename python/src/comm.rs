//! `oxccl.Communicator`: construction (environment, unique id, a torch-style store), the
//! collectives and send/recv on Python buffers, groups, split/shrink/abort/close.
//!
//! Rules: every call is checked while the GIL is held, then runs with the GIL released; a
//! synchronous call holds its buffers' objects until it returns, an asynchronous one (and an
//! asynchronous group) until its completion drops them on the communicator's worker thread.
//! Inside `with comm.group():` calls are recorded (with their objects) and run together when
//! the block ends; a recorded call's objects are held from the call on. Calls on one
//! communicator run in the order Python makes them (the library serializes them).

use crate::buf::{self, Buf, Place};
use crate::errors::{invalid, to_py};
use crate::ops::{self, build, Kind, Op};
use crate::work::Work;
use oxccl::{Rank, ReduceOp, UniqueId};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

type Keep = Vec<Py<PyAny>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A communicator: this process's membership in a fixed group of ranks, over which it makes
/// collectives and sends and receives (host memory, or CUDA tensors on the current stream).
///
/// `Communicator()` joins the job the launcher's environment describes (torchrun, Slurm,
/// mpirun). `Communicator(unique_id, size, rank)` joins the communicator of `unique_id` (the
/// bytes of `oxccl.unique_id()`, made on one rank and passed to the others) as rank `rank` of
/// `size`. `timeout` (seconds, keyword only): how long any call of this communicator may wait
/// for its peers before raising oxccl.TimeoutError (default: `OXCCL_TIMEOUT`, else forever, as
/// NCCL; 0: forever). `Communicator.from_store(store, rank, size)` exchanges the id through
/// any object with torch's Store interface (`set`, `get`).
///
/// Use it as a context manager (`with oxccl.Communicator() as comm:`) to close it at the end.
#[pyclass(module = "oxccl._oxccl", frozen, subclass)]
pub struct Communicator {
    comm: Mutex<Option<Arc<oxccl::Communicator>>>,
    /// The open group's recorded calls (`with comm.group():`).
    group: Mutex<Option<(Vec<Op>, Keep)>>,
    #[cfg(feature = "cuda")]
    dev: crate::dev::Devices,
}

impl Communicator {
    fn wrap(c: oxccl::Communicator) -> Communicator {
        Communicator {
            comm: Mutex::new(Some(Arc::new(c))),
            group: Mutex::new(None),
            #[cfg(feature = "cuda")]
            dev: Default::default(),
        }
    }

    pub fn get(&self) -> PyResult<Arc<oxccl::Communicator>> {
        lock(&self.comm).clone().ok_or_else(|| {
            crate::errors::raise("InvalidArgumentError", "the communicator is closed".into(), None, None)
        })
    }

    /// Runs `ops` now (or records them in the open group): synchronously, or asynchronously
    /// returning a Work.
    fn call(&self, py: Python<'_>, op: Op, keep: Keep, async_op: bool) -> PyResult<Option<Py<Work>>> {
        {
            let mut g = lock(&self.group);
            if let Some((ops, k)) = g.as_mut() {
                if async_op {
                    return Err(invalid(
                        "async_op",
                        "calls inside a group are launched by the group (comm.group(async_op=True))",
                    ));
                }
                ops.push(op);
                k.extend(keep);
                return Ok(None);
            }
        }
        self.run(py, vec![op], keep, async_op)
    }

    pub fn run(
        &self,
        py: Python<'_>,
        ops: Vec<Op>,
        keep: Keep,
        async_op: bool,
    ) -> PyResult<Option<Py<Work>>> {
        let comm = self.get()?;
        let place = ops.first().map(|o| o.place()).unwrap_or(Place::Host);
        if let Some(o) = ops.iter().find(|o| o.place() != place) {
            return Err(invalid("group", format!("mixes {place:?} and {:?} buffers", o.place())));
        }
        if let Place::Cuda(_ordinal) = place {
            #[cfg(feature = "cuda")]
            {
                self.dev.run(py, &comm, _ordinal, &ops)?;
                drop(keep);
                return if async_op { Ok(Some(Py::new(py, Work::done())?)) } else { Ok(None) };
            }
            #[cfg(not(feature = "cuda"))]
            return Err(invalid("buffer", "CUDA tensors: this build of oxccl has no CUDA support"));
        }
        if async_op {
            let mut g = comm.group();
            // SAFETY: `keep` holds every buffer's object until the worker has completed the
            // call (launch_detached drops it then); the caller may not write them meanwhile
            // (documented: a buffer of an unfinished asynchronous call is the call's).
            let d = unsafe {
                build(&mut g, &ops).map_err(to_py)?;
                g.launch_detached(Box::new(keep)).map_err(to_py)?
            };
            return Ok(Some(Py::new(py, Work::pending(d))?));
        }
        let r = py.detach(move || {
            let mut g = comm.group();
            // SAFETY: the objects in `keep` (held by this frame, dropped after this returns)
            // keep every buffer alive; Python code cannot run on them meanwhile unless another
            // thread does so, which the API documents as the caller's race.
            unsafe { build(&mut g, &ops)? };
            g.end()
        });
        drop(keep);
        r.map_err(to_py)?;
        Ok(None)
    }
}

impl Communicator {
    fn p2p(
        &self,
        py: Python<'_>,
        recv: bool,
        buf: &Bound<'_, PyAny>,
        peer: i64,
        async_op: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<Work>>> {
        let (dt, mut k) = (dtype_arg(dtype)?, Keep::new());
        let peer = rank_arg("peer", peer, self.get()?.size())?;
        let b = Some(b("buf", buf, recv, dt, &mut k)?);
        let o = if recv {
            Op::new(Kind::Recv(peer), None, b, |_| None)?
        } else {
            Op::new(Kind::Send(peer), b, None, |_| None)?
        };
        self.call(py, o, k, async_op)
    }
}

impl Communicator {
    /// A receive from any rank (`recv(buf, None)`): host memory, outside groups.
    fn recv_any(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        async_op: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<PyAny>>> {
        if lock(&self.group).is_some() {
            return Err(invalid(
                "peer",
                "None (a receive from any rank) cannot be part of a group: a group plans its receives with their peers",
            ));
        }
        let (dt, mut k) = (dtype_arg(dtype)?, Keep::new());
        let b = b("buf", buf, true, dt, &mut k)?;
        if b.place != Place::Host {
            return Err(invalid(
                "buf",
                "a receive from any rank takes host memory (CPU tensors, numpy arrays)",
            ));
        }
        let comm = self.get()?;
        if async_op {
            // SAFETY: `k` holds the buffer's object until the worker has completed the
            // receive (it is dropped there); the buffer belongs to the call until then.
            let d = unsafe { comm.recv_any_detached(b.dtype, b.ptr as *mut u8, b.len, Box::new(k)) }
                .map_err(to_py)?;
            return Ok(Some(Py::new(py, Work::pending(d))?.into_any()));
        }
        let (ptr, len, t) = (b.ptr, b.len, b.dtype);
        let r = py.detach(move || {
            // SAFETY: `k` (held by this frame until the call returns) keeps the buffer alive;
            // no other Python code writes it meanwhile unless another thread races the call.
            let buf = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            comm.recv_any_raw(t, buf)
        });
        drop(k);
        let peer = r.map_err(to_py)?;
        Ok(Some(peer.0.into_pyobject(py)?.into_any().unbind()))
    }
}

/// Parses an operator: a name (`"sum"`, `"prod"`/`"product"`, `"max"`, `"min"`, `"avg"`,
/// `"band"`, `"bor"`, `"bxor"`) or NCCL's number.
fn parse_op(o: Option<&Bound<'_, PyAny>>) -> PyResult<ReduceOp> {
    let Some(o) = o else { return Ok(ReduceOp::Sum) };
    if let Ok(v) = o.extract::<i32>() {
        return ReduceOp::from_nccl(v)
            .ok_or_else(|| invalid("op", format!("{v} is not an operator number of NCCL's")));
    }
    let s = o.str()?.to_string().to_lowercase();
    let name = s.rsplit('.').next().unwrap_or(&s);
    let name = match name {
        "product" => "prod",
        "average" => "avg",
        n => n,
    };
    ReduceOp::parse(name).ok_or_else(|| {
        invalid("op", format!("{s} is not an operator oxccl has (sum, prod, max, min, avg, band, bor, bxor)"))
    })
}

fn rank_arg(arg: &str, r: i64, size: usize) -> PyResult<Rank> {
    if r < 0 || r as u64 >= size as u64 {
        return Err(invalid(arg, format!("{r} is not a rank of this communicator (size {size})")));
    }
    Ok(Rank(r as u32))
}

fn dtype_arg(d: Option<&Bound<'_, PyAny>>) -> PyResult<Option<buf::Ty>> {
    d.map(buf::parse_dtype).transpose()
}

/// A buffer argument and the object that keeps it alive.
fn b(arg: &str, o: &Bound<'_, PyAny>, write: bool, dt: Option<buf::Ty>, keep: &mut Keep) -> PyResult<Buf> {
    let r = buf::get(arg, o, write, dt)?;
    keep.push(o.clone().unbind());
    Ok(r)
}

fn ob(
    arg: &str,
    o: Option<&Bound<'_, PyAny>>,
    write: bool,
    dt: Option<buf::Ty>,
    keep: &mut Keep,
) -> PyResult<Option<Buf>> {
    o.filter(|o| !o.is_none()).map(|o| b(arg, o, write, dt, keep)).transpose()
}

pub(crate) fn prefix_sums(counts: &[usize]) -> Vec<usize> {
    let mut at = 0;
    counts
        .iter()
        .map(|c| {
            let d = at;
            at += c;
            d
        })
        .collect()
}

fn config(timeout: Option<f64>) -> PyResult<oxccl::Config> {
    let mut cfg = oxccl::env::config().map_err(to_py)?;
    if let Some(t) = timeout {
        if !(t >= 0.0 && t.is_finite()) {
            return Err(invalid("timeout", format!("{t} is not a number of seconds ≥ 0")));
        }
        cfg.timeout = if t == 0.0 { None } else { Some(Duration::from_secs_f64(t)) };
    }
    Ok(cfg)
}

fn parse_id(o: &Bound<'_, PyAny>) -> PyResult<UniqueId> {
    let bytes: Vec<u8> = if let Ok(s) = o.cast::<PyString>() {
        s.to_string().into_bytes()
    } else {
        o.extract::<Vec<u8>>().map_err(|_| invalid("unique_id", "expected bytes (from oxccl.unique_id())"))?
    };
    UniqueId::from_bytes(&bytes).map_err(|e| to_py(e.into()))
}

#[pymethods]
impl Communicator {
    #[new]
    #[pyo3(signature = (unique_id=None, size=None, rank=None, *, timeout=None))]
    fn new(
        py: Python<'_>,
        unique_id: Option<&Bound<'_, PyAny>>,
        size: Option<usize>,
        rank: Option<i64>,
        timeout: Option<f64>,
    ) -> PyResult<Self> {
        let cfg = config(timeout)?;
        let c = match (unique_id, size, rank) {
            (None, None, None) => py.detach(|| oxccl::Communicator::from_env_with(cfg)),
            (Some(id), Some(size), Some(rank)) => {
                let id = parse_id(id)?;
                let r = rank_arg("rank", rank, size)?;
                py.detach(|| oxccl::Communicator::init(&id, size, r, cfg))
            }
            _ => {
                return Err(invalid(
                    "unique_id",
                    "pass unique_id, size and rank together (or none of them, to join from the launcher's environment)",
                ))
            }
        };
        Ok(Communicator::wrap(c.map_err(to_py)?))
    }

    /// Joins through `store`, any object with torch's Store interface: rank 0 makes a unique
    /// id and `set`s it under `key`; the others `get` it (which waits, as torch's stores do).
    /// `rank` is this process's rank of `size`; `timeout` as for `Communicator(...)`.
    #[staticmethod]
    #[pyo3(signature = (store, rank, size, *, key="oxccl/unique_id", timeout=None))]
    fn from_store(
        py: Python<'_>,
        store: &Bound<'_, PyAny>,
        rank: i64,
        size: usize,
        key: &str,
        timeout: Option<f64>,
    ) -> PyResult<Self> {
        let cfg = config(timeout)?;
        let r = rank_arg("rank", rank, size)?;
        let id = if r.0 == 0 {
            let id = py.detach(|| oxccl::new_unique_id(&cfg)).map_err(to_py)?;
            store.call_method1("set", (key, PyBytes::new(py, &id.to_bytes())))?;
            id
        } else {
            parse_id(&store.call_method1("get", (key,))?)?
        };
        let c = py.detach(|| oxccl::Communicator::init(&id, size, r, cfg)).map_err(to_py)?;
        Ok(Communicator::wrap(c))
    }

    /// This process's rank in the communicator (0 .. size − 1).
    #[getter]
    fn rank(&self) -> PyResult<u32> {
        Ok(self.get()?.rank().0)
    }

    /// The number of ranks in the communicator.
    #[getter]
    fn size(&self) -> PyResult<usize> {
        Ok(self.get()?.size())
    }

    /// A handle for the compiled fast path (`oxccl.torch`): the communicator's address behind
    /// a reference of its own, freed by the fast path's release entry point.
    fn _fast_handle(&self) -> PyResult<usize> {
        Ok(Box::into_raw(Box::new(self.get()?)) as usize)
    }

    /// Whether `close()` (or `abort()`) ended it.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.comm).is_none()
    }

    /// All-reduce: every rank's `recv` receives the element-wise reduction, by `op`, of every
    /// rank's `send` (the same length everywhere). In place (the result replaces `send`) when
    /// `recv` is None or is `send`. `op`: "sum" (the default), "prod", "max", "min", "avg",
    /// "band", "bor" or "bxor" (or NCCL's operator number); bool reduces logically and
    /// complex types with "sum" and "avg" only.
    ///
    /// `async_op=True`: returns at once with a Work (`wait()`, `is_completed()`); the buffers
    /// belong to the call until it is complete. `dtype`: the element type, read from the
    /// buffers unless named here (a name, numpy or torch dtype), which reinterprets their
    /// bytes (e.g. "bfloat16" over a uint16 array). Inside `with comm.group():` the call is
    /// recorded and runs when the block ends.
    #[pyo3(signature = (send, recv=None, op=None, *, async_op=false, dtype=None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
        async_op: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<Work>>> {
        let (dt, op, mut k) = (dtype_arg(dtype)?, parse_op(op)?, Keep::new());
        let o = match ob("recv", recv, true, dt, &mut k)? {
            None => Op::in_place(Kind::AllReduce(op), b("send", send, true, dt, &mut k)?)?,
            r => Op::new(Kind::AllReduce(op), Some(b("send", send, false, dt, &mut k)?), r, |r| Some(r.ptr))?,
        };
        self.call(py, o, k, async_op)
    }

    /// Broadcast: rank `root`'s `send` is copied into every rank's buffer. In place, each rank
    /// passes one buffer as `send` (the root's is read, the others' written); out of place,
    /// the root's `send` goes into every rank's `recv` (non-roots may pass None for `send`).
    ///
    /// `async_op=True`: returns at once with a Work (`wait()`, `is_completed()`); the buffers
    /// belong to the call until it is complete. `dtype`: the element type, read from the
    /// buffers unless named here (a name, numpy or torch dtype), which reinterprets their
    /// bytes (e.g. "bfloat16" over a uint16 array). Inside `with comm.group():` the call is
    /// recorded and runs when the block ends.
    #[pyo3(signature = (send, recv=None, root=0, *, async_op=false, dtype=None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        send: Option<&Bound<'_, PyAny>>,
        recv: Option<&Bound<'_, PyAny>>,
        root: i64,
        async_op: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<Work>>> {
        let (dt, mut k) = (dtype_arg(dtype)?, Keep::new());
        let root = rank_arg("root", root, self.get()?.size())?;
        let o = match (ob("send", send, false, dt, &mut k)?, recv.filter(|r| !r.is_none())) {
            (Some(_), None) => {
                Op::in_place(Kind::Broadcast(root), b("send", send.unwrap(), true, dt, &mut k)?)?
            }
            (s, Some(r)) => {
                Op::new(Kind::Broadcast(root), s, Some(b("recv", r, true, dt, &mut k)?), |r| Some(r.ptr))?
            }
            (None, None) => return Err(invalid("recv", "no buffer given")),
        };
        self.call(py, o, k, async_op)
    }

    /// Reduce: the element-wise reduction, by `op` (default "sum"; the operators of
    /// `all_reduce`), of every rank's `send` lands in `recv` at rank `root` only (in place in
    /// the root's `send` when `recv` is None; non-roots may pass None for `recv`).
    ///
    /// `async_op=True`: returns at once with a Work (`wait()`, `is_completed()`); the buffers
    /// belong to the call until it is complete. `dtype`: the element type, read from the
    /// buffers unless named here (a name, numpy or torch dtype), which reinterprets their
    /// bytes (e.g. "bfloat16" over a uint16 array). Inside `with comm.group():` the call is
    /// recorded and runs when the block ends.
    #[pyo3(signature = (send, recv=None, op=None, root=0, *, async_op=false, dtype=None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
        root: i64,
        async_op: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<Work>>> {
        let (dt, op, mut k) = (dtype_arg(dtype)?, parse_op(op)?, Keep::new());
        let c = self.get()?;
        let root = rank_arg("root", root, c.size())?;
        let kind = Kind::Reduce(op, root);
        let o = match ob("recv", recv, true, dt, &mut k)? {
            None if c.rank() == root => Op::in_place(kind, b("send", send, true, dt, &mut k)?)?,
            None => Op::new(kind, Some(b("send", send, false, dt, &mut k)?), None, |_| None)?,
            r => Op::new(kind, Some(b("send", send, false, dt, &mut k)?), r, |r| Some(r.ptr))?,
        };
        self.call(py, o, k, async_op)
    }

    /// All-gather: every rank's `send` lands in every rank's `recv` (size × len(send)
    /// elements), in rank order; in place when `send` is this rank's slice of `recv`, or
    /// None.
    ///
    /// `async_op=True`: returns at once with a Work (`wait()`, `is_completed()`); the buffers
    /// belong to the call until it is complete. `dtype`: the element type, read from the
    /// buffers unless named here (a name, numpy or torch dtype), which reinterprets their
    /// bytes (e.g. "bfloat16" over a uint16 array). Inside `with comm.group():` the call is
    /// recorded and runs when the block ends.
    #[pyo3(signature = (send, recv, *, async_op=false, dtype=None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        send: Option<&Bound<'_, PyAny>>,
        recv: &Bound<'_, PyAny>,
        async_op: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<Work>>> {
        let (dt, mut k) = (dtype_arg(dtype)?, Keep::new());
        let c = self.get()?;
        let (me, p) = (c.rank().idx(), c.size());
        let r = b("recv", recv, true, dt, &mut k)?;
        let o = match ob("send", send, false, dt, &mut k)? {
            None => Op::in_place(Kind::AllGather, r)?,
            s => Op::new(Kind::AllGather, s, Some(r), ops::block_of_output(me, p))?,
        };
        self.call(py, o, k, async_op)
    }

    /// Reduce-scatter: `send` (size × len(recv) elements) is reduced element-wise by `op`
    /// (default "sum"; the operators of `all_reduce`) across ranks, and block r of the result
    /// lands in rank r's `recv`; in place when `recv` is this rank's block of `send`, or None.
    ///
    /// `async_op=True`: returns at once with a Work (`wait()`, `is_completed()`); the buffers
    /// belong to the call until it is complete. `dtype`: the element type, read from the
    /// buffers unless named here (a name, numpy or torch dtype), which reinterprets their
    /// bytes (e.g. "bfloat16" over a uint16 array). Inside `with comm.group():` the call is
    /// recorded and runs when the block ends.
    #[pyo3(signature = (send, recv=None, op=None, *, async_op=false, dtype=None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
        async_op: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<Work>>> {
        let (dt, op, mut k) = (dtype_arg(dtype)?, parse_op(op)?, Keep::new());
        let me = self.get()?.rank().idx();
        let o = match ob("recv", recv, true, dt, &mut k)? {
            None => Op::in_place(Kind::ReduceScatter(op), b("send", send, true, dt, &mut k)?)?,
            r => Op::new(
                Kind::ReduceScatter(op),
                Some(b("send", send, false, dt, &mut k)?),
                r,
                ops::output_is_block(me),
            )?,
        };
        self.call(py, o, k, async_op)
    }

    /// All-to-all: `send` is cut into size equal blocks; block j goes to rank j, where it
    /// fills block i (this rank's) of `recv`. In place when `recv` is None.
    ///
    /// `async_op=True`: returns at once with a Work (`wait()`, `is_completed()`); the buffers
    /// belong to the call until it is complete. `dtype`: the element type, read from the
    /// buffers unless named here (a name, numpy or torch dtype), which reinterprets their
    /// bytes (e.g. "bfloat16" over a uint16 array). Inside `with comm.group():` the call is
    /// recorded and runs when the block ends.
    #[pyo3(signature = (send, recv=None, *, async_op=false, dtype=None))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: Option<&Bound<'_, PyAny>>,
        async_op: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<Work>>> {
        let (dt, mut k) = (dtype_arg(dtype)?, Keep::new());
        let o = match ob("recv", recv, true, dt, &mut k)? {
            None => Op::in_place(Kind::AllToAll, b("send", send, true, dt, &mut k)?)?,
            r => Op::new(Kind::AllToAll, Some(b("send", send, false, dt, &mut k)?), r, |_| None)?,
        };
        self.call(py, o, k, async_op)
    }

    /// All-to-all with counts: `send_counts[j]` elements of `send`, from `send_displs[j]`, go
    /// to rank j, which receives them into its `recv` at its `recv_displs[i]`
    /// (`recv_counts[i]` elements from rank i). Counts and displacements are in elements;
    /// displacements default to the counts' prefix sums (blocks packed in rank order).
    ///
    /// `async_op=True`: returns at once with a Work (`wait()`, `is_completed()`); the buffers
    /// belong to the call until it is complete. `dtype`: the element type, read from the
    /// buffers unless named here (a name, numpy or torch dtype), which reinterprets their
    /// bytes (e.g. "bfloat16" over a uint16 array). Inside `with comm.group():` the call is
    /// recorded and runs when the block ends.
    #[pyo3(signature = (send, recv, send_counts, recv_counts, send_displs=None, recv_displs=None, *, async_op=false, dtype=None))]
    #[allow(clippy::too_many_arguments)]
    fn all_to_all_v(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
        send_displs: Option<Vec<usize>>,
        recv_displs: Option<Vec<usize>>,
        async_op: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<Work>>> {
        let (dt, mut k) = (dtype_arg(dtype)?, Keep::new());
        let send_displs = send_displs.unwrap_or_else(|| prefix_sums(&send_counts));
        let recv_displs = recv_displs.unwrap_or_else(|| prefix_sums(&recv_counts));
        let kind = Kind::AllToAllV { send_counts, send_displs, recv_counts, recv_displs };
        let s = b("send", send, false, dt, &mut k)?;
        let r = b("recv", recv, true, dt, &mut k)?;
        let o = Op::new(kind, Some(s), Some(r), |_| None)?;
        self.call(py, o, k, async_op)
    }

    /// Gather: every rank's `send` lands in `recv` at rank `root` (size × len(send) elements,
    /// in rank order); non-roots may pass None for `recv`.
    ///
    /// `async_op=True`: returns at once with a Work (`wait()`, `is_completed()`); the buffers
    /// belong to the call until it is complete. `dtype`: the element type, read from the
    /// buffers unless named here (a name, numpy or torch dtype), which reinterprets their
    /// bytes (e.g. "bfloat16" over a uint16 array). Inside `with comm.group():` the call is
    /// recorded and runs when the block ends.
    #[pyo3(signature = (send, recv=None, root=0, *, async_op=false, dtype=None))]
    fn gather(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: Option<&Bound<'_, PyAny>>,
        root: i64,
        async_op: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<Work>>> {
        let (dt, mut k) = (dtype_arg(dtype)?, Keep::new());
        let c = self.get()?;
        let root = rank_arg("root", root, c.size())?;
        let (me, p) = (c.rank().idx(), c.size());
        let s = b("send", send, false, dt, &mut k)?;
        let r = ob("recv", recv, true, dt, &mut k)?;
        if c.rank() == root && r.is_none() {
            return Err(invalid("recv", "the root of a gather needs a recv buffer"));
        }
        let o = Op::new(Kind::Gather(root), Some(s), r, ops::block_of_output(me, p))?;
        self.call(py, o, k, async_op)
    }

    /// Scatter: rank `root`'s `send` is cut into size equal blocks, and block j lands in rank
    /// j's `recv`; non-roots may pass None for `send`.
    ///
    /// `async_op=True`: returns at once with a Work (`wait()`, `is_completed()`); the buffers
    /// belong to the call until it is complete. `dtype`: the element type, read from the
    /// buffers unless named here (a name, numpy or torch dtype), which reinterprets their
    /// bytes (e.g. "bfloat16" over a uint16 array). Inside `with comm.group():` the call is
    /// recorded and runs when the block ends.
    #[pyo3(signature = (send, recv, root=0, *, async_op=false, dtype=None))]
    fn scatter(
        &self,
        py: Python<'_>,
        send: Option<&Bound<'_, PyAny>>,
        recv: &Bound<'_, PyAny>,
        root: i64,
        async_op: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<Work>>> {
        let (dt, mut k) = (dtype_arg(dtype)?, Keep::new());
        let c = self.get()?;
        let root = rank_arg("root", root, c.size())?;
        let me = c.rank().idx();
        let s = ob("send", send, false, dt, &mut k)?;
        if c.rank() == root && s.is_none() {
            return Err(invalid("send", "the root of a scatter needs a send buffer"));
        }
        let r = b("recv", recv, true, dt, &mut k)?;
        let o = Op::new(Kind::Scatter(root), s, Some(r), ops::output_is_block(me))?;
        self.call(py, o, k, async_op)
    }

    /// Sends `buf` to rank `peer`, which receives it with `recv` (the same number of elements,
    /// the same type). A small message is handed over and the call returns; a large one
    /// returns once `peer` has taken it. Sends and receives that depend on each other (a ring
    /// exchange) go inside `with comm.group():`.
    ///
    /// `async_op=True`: returns at once with a Work (`wait()`, `is_completed()`); the buffers
    /// belong to the call until it is complete. `dtype`: the element type, read from the
    /// buffers unless named here (a name, numpy or torch dtype), which reinterprets their
    /// bytes (e.g. "bfloat16" over a uint16 array). Inside `with comm.group():` the call is
    /// recorded and runs when the block ends.
    #[pyo3(signature = (buf, peer, *, async_op=false, dtype=None))]
    fn send(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        peer: i64,
        async_op: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<Work>>> {
        self.p2p(py, false, buf, peer, async_op, dtype)
    }

    /// Receives into `buf` the message rank `peer` sends with `send` (returns None). With
    /// `peer=None` (a receive from any rank), takes the next message any rank sends to this
    /// one and returns the sender's rank (with `async_op=True`, a Work whose `source` names
    /// it once complete); such a receive takes host memory and cannot be part of a group.
    ///
    /// `async_op=True`: returns at once with a Work (`wait()`, `is_completed()`); the buffers
    /// belong to the call until it is complete. `dtype`: the element type, read from the
    /// buffers unless named here (a name, numpy or torch dtype), which reinterprets their
    /// bytes (e.g. "bfloat16" over a uint16 array). Inside `with comm.group():` the call is
    /// recorded and runs when the block ends.
    #[pyo3(signature = (buf, peer=None, *, async_op=false, dtype=None))]
    fn recv(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        peer: Option<i64>,
        async_op: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<PyAny>>> {
        let w = match peer {
            Some(peer) => self.p2p(py, true, buf, peer, async_op, dtype)?,
            None => return self.recv_any(py, buf, async_op, dtype),
        };
        Ok(w.map(|w| w.into_any()))
    }

    /// Returns once every rank of the communicator has called it.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let comm = self.get()?;
        py.detach(move || comm.barrier()).map_err(to_py)
    }

    /// A group: `with comm.group():` records the calls made inside and runs them together at
    /// the end of the block (sends and receives that depend on each other progress together,
    /// as ncclGroupStart/End). `async_op=True`: the block launches them and returns; the
    /// group's `work` attribute then holds their Work.
    #[pyo3(signature = (*, async_op=false))]
    fn group(slf: &Bound<'_, Self>, async_op: bool) -> GroupCall {
        GroupCall { comm: slf.clone().unbind(), async_op, work: Mutex::new(None) }
    }

    /// A new communicator of the ranks that pass the same `color` (None or a negative number,
    /// NCCL's NCCL_SPLIT_NOCOLOR: this rank joins none and gets None), ranked by `key`
    /// (default: this rank), then by rank. Every rank must call it.
    #[pyo3(signature = (color, key=None))]
    fn split(&self, py: Python<'_>, color: Option<i64>, key: Option<i64>) -> PyResult<Option<Communicator>> {
        let c = self.get()?;
        // A negative color (NCCL_SPLIT_NOCOLOR, -1) is None: this rank joins no communicator.
        let color = match color {
            Some(v) if v < 0 => None,
            Some(v) => {
                Some(u32::try_from(v).map_err(|_| invalid("color", format!("{v} is larger than 2³²−1")))?)
            }
            None => None,
        };
        let key = key.unwrap_or(c.rank().0 as i64);
        let r = py.detach(|| c.split(color, key)).map_err(to_py)?;
        Ok(r.map(Communicator::wrap))
    }

    /// A new communicator of the ranks not in `exclude` (a list of ranks: those that failed,
    /// say), as ncclCommShrink. The excluded ranks do not call it.
    fn shrink(&self, py: Python<'_>, exclude: Vec<i64>) -> PyResult<Communicator> {
        let c = self.get()?;
        let ex: Vec<Rank> =
            exclude.iter().map(|r| rank_arg("exclude", *r, c.size())).collect::<PyResult<_>>()?;
        let r = py.detach(|| c.shrink(&ex)).map_err(to_py)?;
        Ok(Communicator::wrap(r))
    }

    /// Ends every call in progress on this rank (they raise AbortedError) and the
    /// communicator; callable from any thread at any time.
    fn abort(&self, py: Python<'_>) {
        if let Some(c) = lock(&self.comm).take() {
            #[cfg(feature = "cuda")]
            self.dev.abort();
            py.detach(|| c.abort());
        }
    }

    /// Ends the communicator once its calls are complete (idempotent).
    fn close(&self, py: Python<'_>) {
        if let Some(c) = lock(&self.comm).take() {
            #[cfg(feature = "cuda")]
            self.dev.close();
            py.detach(|| c.close());
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) {
        self.close(py)
    }

    fn __repr__(&self) -> String {
        match lock(&self.comm).as_ref() {
            Some(c) => format!("<oxccl.Communicator rank {} of {}>", c.rank(), c.size()),
            None => "<oxccl.Communicator (closed)>".into(),
        }
    }
}

/// The context manager `comm.group()` returns.
#[pyclass(module = "oxccl._oxccl", frozen)]
pub struct GroupCall {
    comm: Py<Communicator>,
    async_op: bool,
    work: Mutex<Option<Py<Work>>>,
}

#[pymethods]
impl GroupCall {
    fn __enter__(slf: Py<Self>) -> PyResult<Py<Self>> {
        let c = slf.get().comm.get();
        let mut g = lock(&c.group);
        if g.is_some() {
            return Err(invalid(
                "group",
                "a group is already open on this communicator (groups do not nest)",
            ));
        }
        *g = Some((Vec::new(), Keep::new()));
        drop(g);
        Ok(slf)
    }

    #[pyo3(signature = (exc_type, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let c = self.comm.get();
        let Some((ops, keep)) = lock(&c.group).take() else { return Ok(false) };
        if exc_type.is_some_and(|e| !e.is_none()) || ops.is_empty() {
            // An exception inside the block: nothing was started; the exception goes on.
            return Ok(false);
        }
        let w = c.run(py, ops, keep, self.async_op)?;
        *lock(&self.work) = w;
        Ok(false)
    }

    /// The group's Work (for `group(async_op=True)`, once the block has ended).
    #[getter]
    fn work(&self, py: Python<'_>) -> Option<Py<Work>> {
        lock(&self.work).as_ref().map(|w| w.clone_ref(py))
    }
}

"""The torch.distributed backend "oxccl": `import oxccl.torch`, then
`dist.init_process_group("oxccl")` (under torchrun), `dist.new_group(backend="oxccl")`, DDP,
FSDP2 (`fully_shard`), on CPU tensors (and CUDA tensors, through the device engines on the
current stream).

Each process group gets its own oxccl communicator, set up through the group's store (rank 0
makes a unique id and sets it; the others get it). A call on CPU tensors runs on the calling
thread and is complete when it returns (as a host-memory call of NCCL's API is): its Work is
already complete, and its future already holds the outputs, so DDP's comm hooks chain on it
at once. Sends and receives run on the communicator's worker thread; a helper thread
completes their futures in order.

Operators: SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR (the library's own), and
PREMUL_SUM (torch's `_make_nccl_premul_sum(factor)`: the factor is applied to the input
before the sum). Errors surface as the oxccl exception classes (`oxccl.PeerGoneError` names
the rank that ended, `oxccl.MismatchError` both calls, `oxccl.InvalidArgumentError` the
argument).
"""

import os
import queue
import sys
import threading
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _oxccl
from .errors import InvalidArgumentError

_R = dist.ReduceOp
# torch's operator kinds → the library's operator numbers (NCCL's: the extension takes them
# without parsing).
_OPS = {
    _R.SUM: 0,
    _R.PRODUCT: 1,
    _R.MAX: 2,
    _R.MIN: 3,
    _R.AVG: 4,
    _R.BAND: 0x40,
    _R.BOR: 0x41,
    _R.BXOR: 0x42,
}
_PREMUL = _R.PREMUL_SUM


def _op(reduce_op):
    """torch's ReduceOp → (the library's operator number, PREMUL_SUM's factor or None)."""
    kind = getattr(reduce_op, "op", reduce_op)
    n = _OPS.get(kind)
    if n is not None:
        return n, None
    if kind == _PREMUL:
        # A float, or a 1-element tensor (torch's `_make_nccl_premul_sum(factor)`).
        return 0, reduce_op.factor
    raise InvalidArgumentError(f"op: {reduce_op} is not an operator oxccl has")


class _Completer:
    """Completes the futures of calls still running (sends and receives, which run on the
    communicator's worker thread), in issue order, on a thread of its own: the calls of one
    communicator complete in that order."""

    def __init__(self):
        self.q = queue.SimpleQueue()
        self.t = threading.Thread(target=self._loop, name="oxccl-futures", daemon=True)
        self.t.start()

    def _loop(self):
        while True:
            work, src = self.q.get()
            try:
                work.wait()
            except Exception as e:  # noqa: BLE001 - the future carries the call's error
                src.set_result((False, e))
            else:
                src.set_result((True, work.outputs))

    def add(self, work, src):
        self.q.put((work, src))


def _unwrap(src):
    """The value of a future completed with (ok, value): the outputs, or the call's error
    raised (torch's C++ side returns, not raises, an exception given to set_exception, so
    errors travel as values and are raised here, in a `then` callback)."""
    ok, v = src.value()
    if not ok:
        raise v
    return v


_from_future = torch._C._distributed_c10d._create_work_from_future


def _done(outputs):
    """The Work of a call complete when its method returns: torch's own Work over a completed
    future holding the outputs (so `is_completed()`, `result()` and `get_future()` answer as
    Gloo's do; a Python Work reaches the caller wrapped, and only its wait and get_future
    are seen)."""
    f = torch.futures.Future()
    f.set_result(outputs)
    return _from_future(f)


class Work(dist._Work):
    """The Work of a call still running (a send or receive on the worker thread): `wait()`
    (raising the call's error), `is_completed()`, and `get_future()` (completed in issue order
    by a helper thread; its value is the list of output tensors). The compiled fast path hands
    it to torch in a holder that answers all three (torch's own holder forwards only wait and
    get_future)."""

    # Tells the compiled fast path to keep this Python object alive with the Work it hands torch
    # (torch's own Works, which `_done` makes, are handed over as they are).
    _oxccl_python_work = True

    def __init__(self, outputs, work=None, backend=None):
        super().__init__()
        self.outputs = list(outputs)
        self._work = work  # the oxccl Work of a call still running, else None
        self._backend = backend
        self._fut = None

    def wait(self, timeout=None):
        """Blocks until the call is complete (raising its error); `timeout` is accepted for torch's
        interface and not used: the communicator's own timeout bounds the wait."""
        if self._work is not None:
            self._work.wait()
        return True

    def is_completed(self):
        """Whether the call is complete (never blocks)."""
        return self._work is None or self._work.is_completed()

    def _source_rank(self):
        """The sender of a receive from any rank (once complete), as torch's Work answers."""
        src = None if self._work is None else self._work.source
        if src is None:
            self.wait()
            src = None if self._work is None else self._work.source
        if src is None:
            raise InvalidArgumentError("_source_rank: this Work is not a receive from any rank")
        return src

    def get_future(self):
        """A torch Future completed (in issue order) with the list of output tensors."""
        if self._fut is None:
            if self._work is None:
                self._fut = torch.futures.Future()
                self._fut.set_result(self.outputs)
            else:
                src = torch.futures.Future()
                self._fut = src.then(_unwrap)
                self._backend._completer().add(self, src)
        return self._fut


_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))


def _scale(t, factor, in_place):
    """PREMUL_SUM's input `t × factor`, rounded to t's type (in place, or a new tensor).
    torch has no fp8 multiply on CPU: fp8 is scaled in float32 and rounded once."""
    if t.dtype in _FP8:
        s = (t.float() * factor).to(t.dtype)
        return t.copy_(s) if in_place else s
    return t.mul_(factor) if in_place else t * factor


def _sizes(what, big, small, p):
    """all_gather_into_tensor's and reduce_scatter_tensor's rule (Gloo's and NCCL's): the
    large tensor holds exactly world size × the small one's elements."""
    if big.numel() != small.numel() * p:
        raise InvalidArgumentError(
            f"{what}: {big.numel()} elements, but it must hold exactly world size ({p}) × "
            f"{small.numel()} (the other tensor's elements) = {small.numel() * p}"
        )


def _fast():
    """The compiled fast path (csrc/fast.cpp: torch's Python-backend trampoline with the
    common single-tensor calls answered in C++), built once per machine with torch's extension builder and
    cached by it; None where it cannot be built (no C++ compiler or ninja, another torch),
    which leaves every call on the Python path. `OXCCL_TORCH_FAST=0` turns it off."""
    if _oxccl._setting("OXCCL_TORCH_FAST") == "0":
        return None
    try:
        import shutil
        import sys

        from torch.utils import cpp_extension

        src = os.path.join(os.path.dirname(__file__), "csrc", "fast.cpp")
        path = os.environ.get("PATH", "")
        if shutil.which("ninja") is None:
            # The ninja wheel (a dependency of this package) keeps its binary beside the
            # interpreter's scripts, which need not be on the path (python -m ...).
            try:
                import ninja

                os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + path
            except ImportError:
                pass
        # One build per source, torch and Python environment: torch's builder keeps one build per
        # name and silently rebuilds it when any of them changes, so a shared name would make
        # two virtualenvs (or two versions of oxccl) rebuild each other's, unannounced.
        import hashlib

        with open(src, "rb") as f:
            key = hashlib.sha256(f.read() + torch.__version__.encode() + sys.prefix.encode()).hexdigest()[:12]
        name = f"oxccl_torch_fast_{key}"
        built = os.path.join(cpp_extension._get_build_directory(name, verbose=False), name + ".so")
        if not os.path.exists(built):
            print("oxccl.torch: compiling the torch backend's fast path (once per machine, torch, "
                  "virtualenv and oxccl version; about a minute)", file=sys.stderr, flush=True)
        try:
            return cpp_extension.load(name=name, sources=[src], extra_cflags=["-O2"], verbose=False)
        finally:
            os.environ["PATH"] = path
    except Exception as e:  # noqa: BLE001 - any failure leaves the Python path, said once
        first = str(e).splitlines()[0] if str(e) else ""
        warnings.warn(f"oxccl.torch: the compiled fast path is unavailable ({type(e).__name__}: {first}); "
                      "calls take the Python path", stacklevel=2)
        return None


def _base():
    """torch 2.15's c10d Backend, which Python may subclass and torch wraps in its own
    ProcessGroup (through the compiled fast path's subclass of it where that is available);
    older torch (2.11, say) lets Python subclass only ProcessGroup, which then is the group
    itself, and calls the methods by their older names (aliased below)."""
    b = torch._C._distributed_c10d.Backend

    class _Probe(b):
        pass

    try:
        _Probe(0, 1)
    except TypeError:
        return dist.ProcessGroup, True, None
    fast = _fast()
    return (fast.FastBackend if fast is not None else b), False, fast


_BASE, _LEGACY, _FAST = _base()


class OxcclBackend(_BASE):
    """The backend object torch wraps in a ProcessGroup: one oxccl communicator."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._timeout = timeout
        self._options = torch._C._distributed_c10d.Backend.Options("oxccl", timeout=timeout)
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else None
        self.comm = _oxccl.Communicator.from_store(store, rank, size, key="oxccl/unique_id", timeout=secs)
        if _FAST is not None:
            api = dict(_oxccl._fast_api()[0])
            self._set_fast(self.comm._fast_handle(), api["call"], api["release"], secs or 0.0)
        self._rank = rank
        self._size = size
        self._store = store
        self._monitored = 0  # monitored barriers made (each one's keys in the store)
        self._group = None  # the open coalescing group (batch_isend_irecv)
        self._done = None
        self._lock = threading.Lock()

    # What torch asks of every backend (each, left undefined, recurses in torch 2.15).
    @property
    def options(self):
        """The backend's options (its name and timeout), as torch asks every backend."""
        return self._options

    supports_splitting = property(lambda self: False, doc="False: torch makes subgroups with new_group.")
    supports_coalescing = property(lambda self: True, doc="True: coalescing blocks run as one oxccl group.")
    _supports_time_estimate = property(lambda self: False)
    supports_shrinking = property(lambda self: False, doc="False: through torch (oxccl.Communicator.shrink has it).")
    supports_reconfigure = property(lambda self: False, doc="False.")
    supports_window = property(lambda self: False, doc="False: torch's symmetric-memory windows are not offered.")

    def getBackendName(self):
        """"oxccl"."""
        return "oxccl"

    def _completer(self):
        with self._lock:
            if self._done is None:
                self._done = _Completer()
            return self._done

    # Reductions.
    def _reduce_args(self, opts, inputs, in_place):
        """(operator, inputs): PREMUL_SUM scales the inputs first (in place where the call is
        in place, else on copies)."""
        op, factor = _op(opts.reduceOp)
        if factor is not None:
            if isinstance(factor, torch.Tensor):
                factor = factor.to(device=inputs[0].device) if factor.numel() == 1 else factor
            inputs = [_scale(t, factor, in_place) for t in inputs]
        return op, inputs

    def allreduce(self, tensors, opts):
        """All-reduce of each of `tensors` in place, by `opts.reduceOp` (one group); a sparse
        COO tensor is summed as Gloo sums one (its result replaces it)."""
        if any(t.layout == torch.sparse_coo for t in tensors):
            return self._sparse_allreduce(tensors, opts)
        if len(tensors) == 1:
            op, factor = _op(opts.reduceOp)
            t = tensors[0]
            if factor is not None:
                _scale(t, factor, True)
            self.comm.all_reduce(t, None, op)
            return _done(tensors)
        op, ins = self._reduce_args(opts, tensors, True)
        with self.comm.group():
            for t in ins:
                self.comm.all_reduce(t, None, op)
        return _done(tensors)

    def _sparse_allreduce(self, tensors, opts):
        """Sparse COO tensors, summed: every rank's indices and values are gathered (padded to
        the largest count) and added up locally, coalesced; the sum replaces each tensor."""
        op, factor = _op(opts.reduceOp)
        if op != 0 or factor is not None:
            raise InvalidArgumentError(f"op: {opts.reduceOp} on a sparse tensor: oxccl sums sparse tensors only (SUM)")
        for t in tensors:
            if t.layout != torch.sparse_coo:
                raise InvalidArgumentError("tensors: sparse and dense tensors in one call")
            if t.device.type != "cpu":
                raise InvalidArgumentError(f"tensors: a sparse tensor on {t.device}: oxccl sums sparse CPU tensors")
            c = t.coalesce()
            idx, val = c.indices().contiguous(), c.values().contiguous()
            p = self._size
            counts = torch.zeros(p, dtype=torch.int64)
            self.comm.all_gather(torch.tensor([idx.shape[1]], dtype=torch.int64), counts)
            most = int(counts.max())
            pi = torch.zeros((idx.shape[0], most), dtype=idx.dtype)
            pi[:, : idx.shape[1]] = idx
            pv = torch.zeros((most, *val.shape[1:]), dtype=val.dtype)
            pv[: val.shape[0]] = val
            gi = torch.empty((p, *pi.shape), dtype=pi.dtype)
            gv = torch.empty((p, *pv.shape), dtype=pv.dtype)
            with self.comm.group():
                self.comm.all_gather(pi, gi)
                self.comm.all_gather(pv, gv)
            n = [int(k) for k in counts]
            total = torch.sparse_coo_tensor(
                torch.cat([gi[r][:, : n[r]] for r in range(p)], 1),
                torch.cat([gv[r][: n[r]] for r in range(p)], 0),
                t.shape,
            ).coalesce()
            t.copy_(total)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts):
        """As allreduce: `tensors` in place, by `opts.reduceOp`, as one group."""
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts):
        """Broadcast of each of `tensors` from rank `opts.rootRank`, in place."""
        root = opts.rootRank
        if len(tensors) == 1:
            self.comm.broadcast(tensors[0], None, root)
        else:
            with self.comm.group():
                for t in tensors:
                    self.comm.broadcast(t, None, root)
        return _done(tensors)

    def reduce(self, tensors, opts):
        """Reduce of each of `tensors` by `opts.reduceOp` into rank `opts.rootRank`'s, in place."""
        op, factor = _op(opts.reduceOp)
        root = opts.rootRank
        with self.comm.group():
            for t in tensors:
                if factor is not None and self._rank != root:
                    # A non-root's tensor is input only: PREMUL_SUM scales a copy of it.
                    self.comm.reduce(_scale(t, factor, False), None, op, root)
                else:
                    if factor is not None:
                        _scale(t, factor, True)
                    self.comm.reduce(t, None, op, root)
        return _done(tensors)

    # Gathers.
    def allgather(self, output_lists, inputs, opts):
        """All-gather: rank r's `inputs[i]` lands in every rank's `output_lists[i][r]` (`opts`
        carries nothing used)."""
        # Each rank's input into every rank's output[r]: one broadcast per rank, in a group
        # (no staging copy; outputs may differ in size, as torch allows).
        me = self._rank
        with self.comm.group():
            for outs, inp in zip(output_lists, inputs):
                for r, o in enumerate(outs):
                    self.comm.broadcast(inp if r == me else None, o, r)
        return _done(output_lists[0] if len(output_lists) == 1 else [t for ol in output_lists for t in ol])

    def allgather_coalesced(self, output_lists, inputs, opts):
        """All-gather of several tensors: rank r's `inputs[i]` lands in every rank's
        `output_lists[r][i]` (torch's layout for this call; `opts` carries nothing used)."""
        # torch's all_gather_coalesced lays the outputs out the other way round from
        # allgather's: output_lists[r][i] receives rank r's inputs[i].
        me = self._rank
        if len(output_lists) != self._size:
            raise InvalidArgumentError(
                f"output_tensor_lists: {len(output_lists)} lists, but all_gather_coalesced needs one per rank "
                f"({self._size})")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(inputs):
                raise InvalidArgumentError(
                    f"output_tensor_lists[{r}]: {len(outs)} tensors, but there are {len(inputs)} inputs")
        with self.comm.group():
            for r, outs in enumerate(output_lists):
                for i, o in enumerate(outs):
                    self.comm.broadcast(inputs[i] if r == me else None, o, r)
        return _done([t for ol in output_lists for t in ol])

    def all_gather_single(self, out, inp, opts):
        """All-gather into one tensor: every rank's `inp` into `out` (world size × inp), in
        rank order (`opts` carries nothing used)."""
        _sizes("output_tensor", out, inp, self._size)
        self.comm.all_gather(inp, out)
        return _done([out])

    def all_gather_single_coalesced(self, outs, inps, opts):
        """all_gather_single of each pair of `outs` and `inps`, as one group (`opts` unused)."""
        with self.comm.group():
            for o, i in zip(outs, inps):
                _sizes("output_tensor", o, i, self._size)
                self.comm.all_gather(i, o)
        return _done(outs)

    def reduce_scatter(self, outs, input_lists, opts):
        """Reduce-scatter: the reduction by `opts.reduceOp` of every rank's `input_lists[i][r]`
        lands in rank r's `outs[i]`."""
        me = self._rank
        with self.comm.group():
            for out, ins in zip(outs, input_lists):
                op, ins = self._reduce_args(opts, ins, False)
                for r, i in enumerate(ins):
                    self.comm.reduce(i, out if r == me else None, op, r)
        return _done(outs)

    def reduce_scatter_single(self, out, inp, opts):
        """Reduce-scatter of one tensor: block r of the reduction by `opts.reduceOp` of every
        rank's `inp` (world size × out) lands in rank r's `out`."""
        _sizes("input_tensor", inp, out, self._size)
        op, (inp,) = self._reduce_args(opts, [inp], False)
        self.comm.reduce_scatter(inp, out, op)
        return _done([out])

    def reduce_scatter_single_coalesced(self, outs, inps, opts):
        """reduce_scatter_single of each pair of `outs` and `inps` (by `opts.reduceOp`), as one
        group."""
        with self.comm.group():
            for o, i in zip(outs, inps):
                _sizes("input_tensor", i, o, self._size)
                op, (i,) = self._reduce_args(opts, [i], False)
                self.comm.reduce_scatter(i, o, op)
        return _done(outs)

    # All-to-all.
    def alltoall(self, outs, inps, opts):
        """All-to-all of tensor lists: `inps[j]` goes to rank j, into its `outs[i]` (`opts`
        carries nothing used)."""
        me = self._rank
        outs[me].copy_(inps[me])
        with self.comm.group():
            for r in range(self._size):
                if r != me:
                    self.comm.send(inps[r], r)
                    self.comm.recv(outs[r], r)
        return _done(outs)

    def all_to_all_single(self, out, inp, out_splits, in_splits, opts):
        """All-to-all of one tensor: rows of `inp` in blocks of `in_splits` (even blocks if
        empty) go to each rank, into `out` in blocks of `out_splits` (`opts` unused)."""
        if not out_splits and not in_splits:
            self.comm.all_to_all(inp, out)
            return _done([out])
        p = self._size

        def counts(t, splits, arg):
            rows = t.shape[0] if t.dim() > 0 else 0
            row = t.numel() // rows if rows else 0
            if not splits:
                if rows % p:
                    raise InvalidArgumentError(f"{arg}: {rows} rows do not split evenly over {p} ranks")
                splits = [rows // p] * p
            if len(splits) != p or sum(splits) != rows:
                raise InvalidArgumentError(
                    f"{arg}: split sizes {list(splits)} must be {p} numbers summing to the tensor's {rows} rows"
                )
            return [s * row for s in splits]

        self.comm.all_to_all_v(
            inp, out, counts(inp, in_splits, "input_split_sizes"), counts(out, out_splits, "output_split_sizes")
        )
        return _done([out])

    # Rooted gathers and scatters: point-to-point in a group (list buffers, no staging).
    def gather(self, output_lists, inputs, opts):
        """Gather: every rank's `inputs[0]` into `output_lists[0][r]` at rank `opts.rootRank`."""
        root, me = opts.rootRank, self._rank
        with self.comm.group():
            if me == root:
                outs = output_lists[0]
                for r in range(self._size):
                    if r != me:
                        self.comm.recv(outs[r], r)
            else:
                self.comm.send(inputs[0], root)
        if me == root:
            output_lists[0][me].copy_(inputs[0])
            return _done(output_lists[0])
        return _done(inputs)

    def scatter(self, outs, input_lists, opts):
        """Scatter: rank `opts.rootRank`'s `input_lists[0][r]` into rank r's `outs[0]`."""
        root, me = opts.rootRank, self._rank
        with self.comm.group():
            if me == root:
                ins = input_lists[0]
                for r in range(self._size):
                    if r != me:
                        self.comm.send(ins[r], r)
            else:
                self.comm.recv(outs[0], root)
        if me == root:
            outs[0].copy_(input_lists[0][me])
        return _done(outs)

    def monitored_barrier(self, timeout, wait_all_ranks):
        """Gloo's monitored barrier, over the group's store: every rank but 0 says it has come
        and waits for rank 0's word; rank 0 waits up to `timeout` seconds for them and names
        the first rank that did not come (every one, with `wait_all_ranks`) in a RuntimeError,
        as Gloo does; a rank that heard nothing raises naming rank 0."""
        self._monitored += 1
        key = f"oxccl/monitored_barrier/{self._monitored}"
        me, p = self._rank, self._size
        wait = timedelta(seconds=max(timeout, 0.001))
        if me != 0:
            self._store.set(f"{key}/{me}", b"1")
            try:
                self._store.wait([f"{key}/done"], wait)
            except Exception as e:  # noqa: BLE001 - the store's timeout, named
                raise RuntimeError(
                    f"Rank {me} successfully reached monitoredBarrier, but received errors while waiting for "
                    f"send/recv from rank 0 ({e})") from None
            return
        missing = []
        start = time.monotonic()
        for r in range(1, p):
            if self._store.check([f"{key}/{r}"]):
                continue
            left = start + timeout - time.monotonic()
            if left <= 0 and not wait_all_ranks:
                # Gloo's word when rank 0's own time is gone before it could wait for r.
                raise RuntimeError(f"[Rank 0]: Rank 0 timed out in monitoredBarrier after "
                                   f"{int((time.monotonic() - start) * 1000)} ms")
            try:
                self._store.wait([f"{key}/{r}"], timedelta(seconds=max(left, 0.001)))
            except Exception:  # noqa: BLE001 - not there in time
                missing.append(r)
                if not wait_all_ranks:
                    break
        if missing:
            ms = int(timeout * 1000)
            if len(missing) == 1:
                raise RuntimeError(f"[Rank 0]: Rank {missing[0]} failed to pass monitoredBarrier in {ms} ms")
            raise RuntimeError(f"[Rank 0]: Ranks {', '.join(map(str, missing))} failed to pass monitoredBarrier "
                               f"in {ms} ms")
        self._store.set(f"{key}/done", b"1")

    def barrier(self, opts):
        """Returns once every rank has called it (`opts`, device ids, are not needed on CPU)."""
        self.comm.barrier()
        return _done([])

    # Point-to-point: launched on the worker thread (an isend, then a recv, on two ranks must
    # not wait for each other), or recorded in the open coalescing group.
    def send(self, tensors, dst, tag):
        """Sends `tensors[0]` to rank `dst` (`tag` is accepted; messages match in order)."""
        return self._p2p(self.comm.send, tensors, dst)

    def recv(self, tensors, src, tag):
        """Receives into `tensors[0]` from rank `src` (`tag` is accepted; messages match in
        order)."""
        return self._p2p(self.comm.recv, tensors, src)

    def recv_anysource(self, tensors, tag):
        """Receives into `tensors[0]` the next message any rank sends this one; the Work's
        `_source_rank()` names the sender (`tag` is accepted; messages match in order)."""
        # The next message any rank sends this one; the Work's _source_rank() names it. torch
        # reads it through the Work it is handed, which only the compiled fast path's holder
        # (and the Python ProcessGroup of torch before 2.15) forwards.
        if len(tensors) != 1:
            raise InvalidArgumentError(f"tensors: recv takes one tensor, not {len(tensors)}")
        if self._group is not None:
            raise InvalidArgumentError("src: a receive from any rank (src=None) cannot be part of a coalescing block")
        if not _LEGACY and _FAST is None:
            raise InvalidArgumentError(
                "src: a receive from any rank (src=None) needs oxccl.torch's compiled fast path, which is unavailable "
                "here (see the warning at import; OXCCL_TORCH_FAST=0 turns it off)")
        return Work(tensors, self.comm.recv(tensors[0], None, async_op=True), self)

    def _p2p(self, fn, tensors, peer):
        if len(tensors) != 1:
            raise InvalidArgumentError(f"tensors: send/recv take one tensor, not {len(tensors)}")
        if self._group is not None:
            fn(tensors[0], peer)
            return None
        return Work(tensors, fn(tensors[0], peer, async_op=True), self)

    def start_coalescing(self):
        """Opens a coalescing block (batch_isend_irecv): calls until end_coalescing form one group."""
        if self._group is not None:
            raise InvalidArgumentError("start_coalescing: a coalescing block is already open")
        self._group = self.comm.group(async_op=True)
        self._group.__enter__()

    def end_coalescing(self):
        """Launches the open coalescing block's calls as one group; returns its Work."""
        g, self._group = self._group, None
        if g is None:
            raise InvalidArgumentError("end_coalescing: no coalescing block is open")
        g.__exit__(None, None, None)
        return Work([], g.work, self)

    def shutdown(self):
        """Closes the communicator once its calls are complete."""
        self.comm.close()

    def abort(self):
        """Ends every call in progress (they raise oxccl.AbortedError) and the communicator."""
        self.comm.abort()


if _LEGACY:
    # The names torch before 2.15 calls on a Python ProcessGroup.
    OxcclBackend._allgather_base = OxcclBackend.all_gather_single
    OxcclBackend.allgather_into_tensor_coalesced = OxcclBackend.all_gather_single_coalesced
    OxcclBackend._reduce_scatter_base = OxcclBackend.reduce_scatter_single
    OxcclBackend.reduce_scatter_tensor_coalesced = OxcclBackend.reduce_scatter_single_coalesced
    OxcclBackend.alltoall_base = OxcclBackend.all_to_all_single
    OxcclBackend.name = OxcclBackend.getBackendName
    del OxcclBackend.options


def _create(store, rank, size, timeout):
    backend = OxcclBackend(store, rank, size, timeout)
    return _own_group(store, rank, size, backend) or backend


def _own_group(store, rank, size, backend):
    """torch's ProcessGroup under the name "oxccl" (the compiled fast path's), holding
    `backend` for each of the group's devices, when every device of the group is oxccl's; else
    None, and torch makes its own group, named "custom" as any plugin's is. torch asks a
    group, not its backend, for the name it reports (DDP's logging data, getBackendName), and
    takes a ProcessGroup a creator returns as the group itself; whether the group mixes
    backends ("cpu:oxccl,cuda:nccl") is read from the caller, torch's group factory, and an
    unexpected caller leaves torch's own group."""
    if _FAST is None or not hasattr(_FAST, "ProcessGroup"):
        return None
    try:
        caller = sys._getframe(2).f_locals
        devices = caller["backend_config"].get_device_backend_map()
        if not devices or set(devices.values()) != {"oxccl"}:
            return None
        pg = _FAST.ProcessGroup(caller.get("prefix_store", store), rank, size)
        custom = dist.ProcessGroup.BackendType.CUSTOM
        pg._set_default_backend(custom)
        for dev in devices:
            pg._register_backend(torch.device(dev), custom, backend)
        if caller.get("device_id") is not None:
            pg.bound_device_id = caller["device_id"]
        return pg
    except Exception:  # noqa: BLE001 - any surprise leaves torch's own group
        return None


dist.Backend.register_backend("oxccl", _create, extended_api=False, devices=["cpu", "cuda"])

# oxccl records its own calls, as Gloo and NCCL do theirs: each communicator's flight recorder
# keeps its last OXCCL_FLIGHT_RECORDER calls and writes them out on a timeout, a mismatch, a
# gone peer or an abort (`oxccl analyze` reads the dumps). torch (2.15) would otherwise attach
# its generic FlightRecorderHook to the group and record every call a second time, capturing a
# Python traceback each time: about 2.6 µs of an 8-byte all_reduce.
_SELF_RECORDING = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
if isinstance(_SELF_RECORDING, set):
    _SELF_RECORDING.add("oxccl")

__all__ = ["OxcclBackend", "Work"]

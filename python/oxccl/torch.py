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
import threading
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
        if self._work is not None:
            self._work.wait()
        return True

    def is_completed(self):
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
        name = "oxccl_torch_fast"
        built = os.path.join(cpp_extension._get_build_directory(name, verbose=False), name + ".so")
        if not os.path.exists(built):
            print("oxccl.torch: compiling the torch backend's fast path (once per machine and torch "
                  "version, about a minute)", file=sys.stderr, flush=True)
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
        self._group = None  # the open coalescing group (batch_isend_irecv)
        self._done = None
        self._lock = threading.Lock()

    # What torch asks of every backend (each, left undefined, recurses in torch 2.15).
    @property
    def options(self):
        return self._options

    supports_splitting = property(lambda self: False)
    supports_coalescing = property(lambda self: True)
    _supports_time_estimate = property(lambda self: False)
    supports_shrinking = property(lambda self: False)
    supports_reconfigure = property(lambda self: False)
    supports_window = property(lambda self: False)

    def getBackendName(self):
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

    def allreduce_coalesced(self, tensors, opts):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts):
        root = opts.rootRank
        if len(tensors) == 1:
            self.comm.broadcast(tensors[0], None, root)
        else:
            with self.comm.group():
                for t in tensors:
                    self.comm.broadcast(t, None, root)
        return _done(tensors)

    def reduce(self, tensors, opts):
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
        # Each rank's input into every rank's output[r]: one broadcast per rank, in a group
        # (no staging copy; outputs may differ in size, as torch allows).
        me = self._rank
        with self.comm.group():
            for outs, inp in zip(output_lists, inputs):
                for r, o in enumerate(outs):
                    self.comm.broadcast(inp if r == me else None, o, r)
        return _done(output_lists[0] if len(output_lists) == 1 else [t for ol in output_lists for t in ol])

    def allgather_coalesced(self, output_lists, inputs, opts):
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
        _sizes("output_tensor", out, inp, self._size)
        self.comm.all_gather(inp, out)
        return _done([out])

    def all_gather_single_coalesced(self, outs, inps, opts):
        with self.comm.group():
            for o, i in zip(outs, inps):
                _sizes("output_tensor", o, i, self._size)
                self.comm.all_gather(i, o)
        return _done(outs)

    def reduce_scatter(self, outs, input_lists, opts):
        me = self._rank
        with self.comm.group():
            for out, ins in zip(outs, input_lists):
                op, ins = self._reduce_args(opts, ins, False)
                for r, i in enumerate(ins):
                    self.comm.reduce(i, out if r == me else None, op, r)
        return _done(outs)

    def reduce_scatter_single(self, out, inp, opts):
        _sizes("input_tensor", inp, out, self._size)
        op, (inp,) = self._reduce_args(opts, [inp], False)
        self.comm.reduce_scatter(inp, out, op)
        return _done([out])

    def reduce_scatter_single_coalesced(self, outs, inps, opts):
        with self.comm.group():
            for o, i in zip(outs, inps):
                _sizes("input_tensor", i, o, self._size)
                op, (i,) = self._reduce_args(opts, [i], False)
                self.comm.reduce_scatter(i, o, op)
        return _done(outs)

    # All-to-all.
    def alltoall(self, outs, inps, opts):
        me = self._rank
        outs[me].copy_(inps[me])
        with self.comm.group():
            for r in range(self._size):
                if r != me:
                    self.comm.send(inps[r], r)
                    self.comm.recv(outs[r], r)
        return _done(outs)

    def all_to_all_single(self, out, inp, out_splits, in_splits, opts):
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

    def barrier(self, opts):
        self.comm.barrier()
        return _done([])

    # Point-to-point: launched on the worker thread (an isend, then a recv, on two ranks must
    # not wait for each other), or recorded in the open coalescing group.
    def send(self, tensors, dst, tag):
        return self._p2p(self.comm.send, tensors, dst)

    def recv(self, tensors, src, tag):
        return self._p2p(self.comm.recv, tensors, src)

    def recv_anysource(self, tensors, tag):
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
        if self._group is not None:
            raise InvalidArgumentError("start_coalescing: a coalescing block is already open")
        self._group = self.comm.group(async_op=True)
        self._group.__enter__()

    def end_coalescing(self):
        g, self._group = self._group, None
        if g is None:
            raise InvalidArgumentError("end_coalescing: no coalescing block is open")
        g.__exit__(None, None, None)
        return Work([], g.work, self)

    def shutdown(self):
        self.comm.close()

    def abort(self):
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
    return OxcclBackend(store, rank, size, timeout)


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

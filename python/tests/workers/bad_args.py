"""Bad arguments: every rank makes the same wrong calls; each must raise
oxccl.InvalidArgumentError (a ValueError) at once, with a message naming the argument, and
leave the communicator usable (correct collectives afterwards, exact).

    torchrun --nproc-per-node P bad_args.py

Through oxccl.Communicator (numpy arrays, torch tensors, the constructor) and through
torch.distributed's backend "oxccl". Calls whose error only the root can see (a gather's root
without a recv buffer) are made by the root alone.
"""

import time

import numpy as np
import torch
import torch.distributed as dist

import oxccl
import oxccl.torch  # noqa: F401
from common import Checks, main

INV = oxccl.InvalidArgumentError


def run():
    dist.init_process_group("oxccl")
    comm = oxccl.Communicator()
    me, p = comm.rank, comm.size
    c = Checks()

    def bad(what, fn, *needles, cls=INV):
        t0 = time.monotonic()
        e = c.raises(what, fn, cls, *needles)
        dt = time.monotonic() - t0
        c.true(f"{what}: raised at once", dt < 5.0, f"took {dt:.2f} s")
        if cls is INV and e is not None:
            c.true(f"{what}: is a ValueError", isinstance(e, ValueError), type(e).__name__)
            c.true(f"{what}: is an oxccl.Error", isinstance(e, oxccl.Error), type(e).__name__)

    x = np.ones(4, np.float32)
    ro = np.ones(4, np.float32)
    ro.setflags(write=False)

    # --------------------------------------------------------- Communicator, numpy arrays
    # (Every numpy and torch element type, reduced or moved or refused: workers/dtypes.py.)
    bad("int16 array reduced", lambda: comm.all_reduce(np.ones(4, np.int16)), "send:", "int16 cannot be reduced")
    bad("complex64 array, max", lambda: comm.all_reduce(np.ones(4, np.complex64), op="max"), "op:", "complex64")
    bad("float128 array reduced", lambda: comm.all_reduce(np.ones(4, np.longdouble)), "send:", "longdouble")
    bad("object array", lambda: comm.broadcast(np.array([1, "a"], dtype=object)), "send:", "Python objects")
    bad("non-contiguous array", lambda: comm.all_reduce(np.ones(8, np.float32)[::2]), "send:", "not C-contiguous")
    bad("non-contiguous recv", lambda: comm.all_reduce(x, np.ones((4, 2), np.float32)[:, 0]), "recv:",
        "not C-contiguous")
    bad("Fortran-order 2-D array", lambda: comm.all_reduce(np.ones((3, 2), np.float32, order="F")),
        "not C-contiguous", "Fortran order", "numpy.ascontiguousarray")
    bad("read-only array written in place", lambda: comm.all_reduce(ro), "send:", "read-only")
    bad("read-only recv", lambda: comm.all_reduce(x, ro), "recv:", "read-only")
    bad("read-only broadcast buffer", lambda: comm.broadcast(ro, root=0), "send:", "read-only")
    bad("read-only recv of recv()", lambda: comm.recv(ro, (me + 1) % p), "buf:", "read-only")
    bad("read-only all_gather recv", lambda: comm.all_gather(x, _ro(4 * p)), "recv:", "read-only")
    bad("a list", lambda: comm.all_reduce([1.0, 2.0]), "send:", "list", "buffer protocol")
    bad("None as the buffer", lambda: comm.all_reduce(None), "send:")
    bad("dtype= unknown name", lambda: comm.all_reduce(x, dtype="float128"), "dtype:", "float128")
    bad("dtype= int16, reduced", lambda: comm.all_reduce(bytearray(8), dtype="int16"), "send:", "int16 cannot")
    bad("dtype= quantized", lambda: comm.all_reduce(x, dtype="qint8"), "dtype:", "quantized")
    bad("bytes not a whole number of elements", lambda: comm.all_reduce(bytearray(6), dtype="float32"),
        "send:", "6 bytes")
    bad("send and recv types differ", lambda: comm.all_reduce(x, np.zeros(4, np.int32)), "recv:", "int32", "float")
    bad("send and recv overlap", lambda: comm.all_reduce(x[:3], x[1:]), "recv:", "overlap")
    bad("op unknown name", lambda: comm.all_reduce(x, op="median"), "op:", "median")
    bad("op unknown number", lambda: comm.all_reduce(x, op=99), "op:", "99")
    bad("op band on floats", lambda: comm.all_reduce(x, op="band"), "band", "float")
    bad("op bxor on bfloat16", lambda: comm.all_reduce(np.ones(4, np.uint16), op="bxor", dtype="bfloat16"),
        "bxor", "bfloat16")
    bad("reduce_scatter op unknown", lambda: comm.reduce_scatter(np.ones(2 * p, np.float32), op="mean"), "op:", "mean")
    for root in (p, -1, 1 << 40):
        bad(f"broadcast root={root}", lambda: comm.broadcast(x, root=root), "root:", str(root))
    bad("reduce root out of range", lambda: comm.reduce(x, None, "sum", p), "root:")
    bad("gather root out of range", lambda: comm.gather(x, np.zeros(4 * p, np.float32), p), "root:")
    bad("scatter root out of range", lambda: comm.scatter(np.zeros(4 * p, np.float32), x, -2), "root:")
    bad("send peer out of range", lambda: comm.send(x, p), "peer:", str(p))
    bad("recv peer -1", lambda: comm.recv(np.zeros(4, np.float32), -1), "peer:", "-1")
    bad("send to itself, no matching recv", lambda: comm.send(x, me), "peer", "itself")
    # Asynchronous: the launch checks the group, so the error comes from wait() (or the call).
    bad("async send to itself, no matching recv", lambda: comm.send(x, me, async_op=True).wait(timeout=5),
        "peer", "itself")
    bad("all_gather recv too small", lambda: comm.all_gather(x, np.zeros(4 * p - 1, np.float32)),
        "recv", f"{4 * p - 1} elements")
    bad("reduce_scatter recv larger than its block",
        lambda: comm.reduce_scatter(np.ones(4 * p, np.float32), np.zeros(5, np.float32)), "send", "elements")
    bad("all_to_all recv too small",
        lambda: comm.all_to_all(np.ones(2 * p, np.float32), np.zeros(2 * p - 1, np.float32)), "recv")
    bad("all_to_all_v counts of the wrong length",
        lambda: comm.all_to_all_v(x, np.zeros(4, np.float32), [1] * p, [1] * (p + 1)), "recv_counts")
    bad("all_to_all_v counts past the buffer",
        lambda: comm.all_to_all_v(x, np.zeros(4 * p, np.float32), [4] * p, [4] * p), "send", "elements")
    bad("broadcast with no buffer", lambda: comm.broadcast(None, None), "recv:", "no buffer")
    bad("async call inside a group", lambda: _in_group(comm, lambda: comm.all_reduce(x, async_op=True)), "async_op")
    bad("nested group", lambda: _in_group(comm, lambda: comm.group().__enter__()), "group:", "nest")
    bad("Work.wait(timeout=-1)", lambda: comm.barrier() or _work(comm).wait(timeout=-1), "timeout:")
    bad("shrink excluding a rank out of range", lambda: comm.shrink([p]), "exclude:")
    # Torch tensors through the Communicator.
    bad("int16 tensor", lambda: comm.all_reduce(torch.ones(4, dtype=torch.int16)), "send:", "int16 cannot")
    bad("complex tensor, prod", lambda: comm.all_reduce(torch.ones(4, dtype=torch.complex64), op="prod"), "op:",
        "complex64")
    bad("non-contiguous tensor", lambda: comm.all_reduce(torch.ones(4, 4)[:, 1]), "send:", "not contiguous")
    bad("meta tensor", lambda: comm.all_reduce(torch.ones(4, device="meta")), "send:", "meta")
    bad("tensor and array of different types", lambda: comm.all_reduce(torch.ones(4), np.zeros(4, np.float64)),
        "recv:", "float64")
    # Constructor arguments.
    bad("unique_id without size and rank", lambda: oxccl.Communicator(b"x" * 128), "unique_id")
    bad("malformed unique id", lambda: oxccl.Communicator(b"garbage", 2, 0), "unique id")
    bad("rank out of range", lambda: oxccl.Communicator(oxccl.unique_id(), 2, 5), "rank:", "5")
    bad("negative timeout", lambda: oxccl.Communicator(b"x" * 128, 2, 0, timeout=-1), "timeout:")
    bad("from_store rank out of range", lambda: oxccl.Communicator.from_store(None, p, p), "rank:")

    # Calls only the root can find wrong: the root alone makes them.
    if me == 0:
        bad("gather's root without recv", lambda: comm.gather(x, None, 0), "recv:", "root")
        bad("scatter's root without send", lambda: comm.scatter(None, np.zeros(4, np.float32), 0), "send:", "root")
    comm.barrier()

    # The communicator is unharmed: exact results after the errors.
    y = np.arange(6, dtype=np.int64) * (me + 1)
    comm.all_reduce(y)
    c.array("all_reduce after the bad calls", y, np.arange(6, dtype=np.int64) * (p * (p + 1) // 2))
    out = np.zeros(3 * p, np.float32)
    comm.all_gather(np.full(3, me, np.float32), out)
    c.array("all_gather after the bad calls", out, np.repeat(np.arange(p, dtype=np.float32), 3))
    s = np.zeros(4, np.float32)
    with comm.group():
        comm.send(np.full(4, me, np.float32), (me + 1) % p)
        comm.recv(s, (me - 1) % p)
    c.array("send/recv after the bad calls", s, np.full(4, (me - 1) % p, np.float32))

    # --------------------------------------------------------- torch.distributed "oxccl"
    t = torch.ones(4)
    bad("dist: int16 tensor", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)), "int16 cannot be reduced")
    bad("dist: bool AVG", lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist.ReduceOp.AVG),
        "op:", "avg", "bool")
    bad("dist: non-contiguous tensor", lambda: dist.all_reduce(torch.ones(4, 4)[:, 0]), "contiguous")
    # Gloo's and NCCL's rule: the large tensor holds exactly world size × the small one.
    for what, fn, arg in (
        ("output too small", lambda: dist.all_gather_into_tensor(torch.zeros(4 * p - 1), t), "output_tensor"),
        ("output too large", lambda: dist.all_gather_into_tensor(torch.zeros(4 * p + 1), t), "output_tensor"),
        ("2-D output too large", lambda: dist.all_gather_into_tensor(torch.zeros(p + 1, 4), t), "output_tensor"),
    ):
        bad(f"dist: all_gather_into_tensor {what}", fn, f"{arg}:", "exactly world size")
    for what, fn in (
        ("output too large", lambda: dist.reduce_scatter_tensor(torch.zeros(5), torch.ones(4 * p))),
        ("input too large", lambda: dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * p + 1))),
        ("input too small", lambda: dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * p - 1))),
    ):
        bad(f"dist: reduce_scatter_tensor {what}", fn, "input_tensor:", "exactly world size")
    bad("dist: BAND on floats", lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND), "band", "float")
    bad("recv from any rank inside a group", lambda: _in_group(comm, lambda: comm.recv(np.zeros(4, np.float32))),
        "peer:", "group")
    bad("dist: all_to_all_single split sizes that do not sum",
        lambda: dist.all_to_all_single(torch.zeros(2 * p), torch.ones(2 * p), [1] * p, [3] * p), "input_split_sizes")
    bad("dist: all_to_all_single split count wrong",
        lambda: dist.all_to_all_single(torch.zeros(2 * p), torch.ones(2 * p), [2] * p, [2 * p]), "input_split_sizes")
    bad("dist: all_to_all_single rows not divisible",
        lambda: dist.all_to_all_single(torch.zeros(p + 1), torch.ones(p + 1), [], []), "send", "multiple")
    # torch checks these itself (no library call is made); the point is: no hang.
    bad("dist: broadcast src out of range", lambda: dist.broadcast(t, src=p + 3), "", cls=ValueError)
    bad("dist: send to itself", lambda: dist.send(t, dst=me), "", cls=ValueError)

    dist.barrier()
    u = torch.arange(5, dtype=torch.float64) + me
    dist.all_reduce(u, op=dist.ReduceOp.MAX)
    c.tensor("dist all_reduce after the bad calls", u, torch.arange(5, dtype=torch.float64) + p - 1)
    o = torch.zeros(2 * p, dtype=torch.int32)
    dist.all_gather_into_tensor(o, torch.full((2,), me, dtype=torch.int32))
    c.tensor("dist all_gather_into_tensor after the bad calls", o,
             torch.arange(p, dtype=torch.int32).repeat_interleave(2))
    dist.destroy_process_group()
    comm.close()
    c.finish()


def _ro(n):
    a = np.zeros(n, np.float32)
    a.setflags(write=False)
    return a


def _in_group(comm, fn):
    with comm.group():
        fn()


def _work(comm):
    return comm.all_reduce(np.ones(2), async_op=True)


if __name__ == "__main__":
    main(run)

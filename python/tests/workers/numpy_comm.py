"""oxccl.Communicator on numpy arrays (no torch.distributed), exact against references
computed here.

    torchrun --nproc-per-node P numpy_comm.py FILESTORE_PATH

Every collective in and out of place × every data type oxccl has (bfloat16 and both fp8
formats as uint16/uint8 arrays with dtype=) × every operator valid for it; asynchronous
calls and Work (wait, wait(timeout), is_completed, exception); groups of sends and receives
and of collectives (synchronous and async_op=True); split; Communicator.from_store with
torch's TCPStore (torchrun's own store), a FileStore and a PrefixStore; Communicator(unique
id, size, rank); buffers other than numpy arrays; close, abort, the context manager; a
communicator timeout; shrink. torch is imported only for its stores and a dtype= check.
"""

import array
import functools
import gc
import math
import os
import sys
import time
from datetime import timedelta

import numpy as np

import oxccl
from common import Checks, main, say

SIGNED = [-2, -1, 1, 2]
UNSIGNED = [1, 2, 3]


def fp8_bits(values, mbits, bias):
    """The fp8 encodings of exactly representable values (sign, exponent, mantissa)."""
    out = np.zeros(len(values), np.uint8)
    for i, x in enumerate(values):
        x = float(x)
        if x == 0:
            out[i] = 0x80 if math.copysign(1.0, x) < 0 else 0
            continue
        a = abs(x)
        e = math.floor(math.log2(a))
        m = (a / 2.0**e - 1) * 2**mbits
        assert m == int(m) and e + bias >= 1, f"{x} is not a normal fp8 value"
        out[i] = (0x80 if x < 0 else 0) | ((e + bias) << mbits) | int(m)
    return out


def bf16_bits(values):
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


# (label, storage dtype, dtype= argument, kind, encode float64 values → storage)
TYPES = [
    ("int8", np.int8, None, "int", None),
    ("uint8", np.uint8, None, "uint", None),
    ("int32", np.int32, None, "int", None),
    ("uint32", np.uint32, None, "uint", None),
    ("int64", np.int64, None, "int", None),
    ("uint64", np.uint64, None, "uint", None),
    ("float16", np.float16, None, "float", None),
    ("float32", np.float32, np.dtype(np.float32), "float", None),  # dtype= a numpy dtype (same type)
    ("float64", np.float64, None, "float", None),
    ("bfloat16", np.uint16, "bfloat16", "float", bf16_bits),
    ("f8e4m3", np.uint8, "f8e4m3", "float", lambda v: fp8_bits(v, 3, 7)),
    ("f8e5m2", np.uint8, "float8_e5m2", "float", lambda v: fp8_bits(v, 2, 15)),
]
ARITH = ["sum", "prod", "max", "min", "avg"]
BITWISE = ["band", "bor", "bxor"]


def rng(rank, salt):
    return np.random.default_rng(1_000_003 * salt + 7919 * rank + 5)


def run():
    comm = oxccl.Communicator()
    me, p = comm.rank, comm.size
    c = Checks()
    c.eq("rank from the environment", me, int(os.environ["RANK"]))
    c.eq("size from the environment", p, int(os.environ["WORLD_SIZE"]))
    c.eq("repr", repr(comm), f"<oxccl.Communicator rank {me} of {p}>")
    c.eq("closed", comm.closed, False)
    c.eq("data_types", oxccl.data_types(),
         ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16",
          "float8_e4m3fn", "float8_e5m2", "bool", "complex32", "complex64", "complex128"])
    c.true("__version__", isinstance(oxccl.__version__, str) and oxccl.__version__.count(".") == 2, oxccl.__version__)
    c.true("InvalidArgumentError is a ValueError", issubclass(oxccl.InvalidArgumentError, ValueError))
    c.true("TimeoutError is the built-in TimeoutError", issubclass(oxccl.TimeoutError, TimeoutError))
    salt = [0]

    def nxt():
        salt[0] += 1
        return salt[0]

    # ----------------------------------------------------------------- inputs, references
    def red_in(t, op, rank, n, s):
        """(array as passed, wide values for the reference)."""
        label, store, _, kind, enc = t
        g = rng(rank, s)
        if op in BITWISE:
            a = g.integers(0, 256, n * np.dtype(store).itemsize, dtype=np.uint8).view(store)
            return a, a
        vals = UNSIGNED if kind == "uint" else SIGNED
        wide = np.array(vals, np.float64 if kind == "float" else np.int64)[g.integers(0, len(vals), n)]
        return (enc(wide) if enc else wide.astype(store)), wide

    def ref(t, op, wides):
        label, store, _, kind, enc = t
        if op in BITWISE:
            f = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
            return functools.reduce(f, wides)
        s = np.stack(wides)
        if op == "sum":
            out = s.sum(0)
        elif op == "prod":
            out = s.prod(0)
        elif op == "max":
            out = s.max(0)
        elif op == "min":
            out = s.min(0)
        elif op == "avg":  # integers: truncated toward zero (oxccl-core ReduceOp::Avg)
            out = s.sum(0) / p if kind == "float" else np.sign(s.sum(0)) * (np.abs(s.sum(0)) // p)
        return enc(out) if enc else out.astype(store)

    def bits(t, rank, n, s):
        store = t[1]
        return rng(rank, s + 777_777).integers(0, 256, n * np.dtype(store).itemsize, dtype=np.uint8).view(store).copy()

    def empty(t, n):
        return np.full(n * np.dtype(t[1]).itemsize, 0xA5, np.uint8).view(t[1]).copy()

    def ro(a):
        a = a.copy()
        a.setflags(write=False)
        return a

    def what(coll, t, op="", extra=""):
        return f"{coll} dtype={t[0]}" + (f" op={op}" if op else "") + extra

    # ----------------------------------------------------------------- the matrix
    for t in TYPES:
        dt = t[2]
        ops = ARITH + (BITWISE if t[3] != "float" else [])
        for op in ops:
            for n in (1, 9, 1003):
                s = nxt()
                ins = [red_in(t, op, r, n, s) for r in range(p)]
                want = ref(t, op, [w for _, w in ins])
                x = ins[me][0].copy()
                comm.all_reduce(x, op=op, dtype=dt)
                c.array(what("all_reduce in place", t, op, f" n={n}"), x, want)
                out = empty(t, n)
                send = ro(ins[me][0])
                comm.all_reduce(send, out, op, dtype=dt)
                c.array(what("all_reduce out of place", t, op, f" n={n}"), out, want)
                c.array(what("all_reduce send unchanged", t, op), send, ins[me][0])
            x = ins[me][0].copy()
            comm.all_reduce(x, x, op=op, dtype=dt)  # recv is send: in place
            c.array(what("all_reduce recv=send", t, op), x, want)
            # reduce: every root, out of place (non-roots pass no recv) and in place.
            for root in range(p):
                s = nxt()
                ins = [red_in(t, op, r, 11, s) for r in range(p)]
                want = ref(t, op, [w for _, w in ins])
                out = empty(t, 11) if me == root else None
                comm.reduce(ro(ins[me][0]), out, op, root, dtype=dt)
                if me == root:
                    c.array(what("reduce out of place", t, op, f" root={root}"), out, want)
                x = ins[me][0].copy()
                comm.reduce(x, None, op=op, root=root, dtype=dt)
                if me == root:
                    c.array(what("reduce in place", t, op, f" root={root}"), x, want)
                else:
                    c.array(what("reduce in place: a non-root's buffer is unchanged", t, op, f" root={root}"), x,
                            ins[me][0])
            # reduce_scatter: out of place, in place (recv None), in place (recv = my block).
            m = 5
            s = nxt()
            ins = [red_in(t, op, r, p * m, s) for r in range(p)]
            want = ref(t, op, [w[me * m:(me + 1) * m] for _, w in ins])
            out = empty(t, m)
            comm.reduce_scatter(ro(ins[me][0]), out, op, dtype=dt)
            c.array(what("reduce_scatter out of place", t, op), out, want)
            x = ins[me][0].copy()
            comm.reduce_scatter(x, op=op, dtype=dt)
            c.array(what("reduce_scatter in place (recv None)", t, op), x[me * m:(me + 1) * m], want)
            x = ins[me][0].copy()
            comm.reduce_scatter(x, x[me * m:(me + 1) * m], op, dtype=dt)
            c.array(what("reduce_scatter in place (recv = my block)", t, op), x[me * m:(me + 1) * m], want)

        # Data movement on random bytes (every bit pattern).
        n = 6
        for root in range(p):
            s = nxt()
            x = bits(t, me, n, s)
            comm.broadcast(x, root=root, dtype=dt)
            c.array(what("broadcast in place", t, extra=f" root={root}"), x, bits(t, root, n, s))
            out = empty(t, n)
            comm.broadcast(ro(bits(t, me, n, s)) if me == root else None, out, root, dtype=dt)
            c.array(what("broadcast out of place", t, extra=f" root={root}"), out, bits(t, root, n, s))
            # gather: out of place (non-roots pass no recv), in place (send = my block of recv).
            out = empty(t, p * n) if me == root else None
            comm.gather(ro(bits(t, me, n, s)), out, root, dtype=dt)
            gathered = np.concatenate([bits(t, r, n, s) for r in range(p)])
            if me == root:
                c.array(what("gather", t, extra=f" root={root}"), out, gathered)
                out = empty(t, p * n)
                out[me * n:(me + 1) * n] = bits(t, me, n, s)
                comm.gather(out[me * n:(me + 1) * n], out, root, dtype=dt)
                c.array(what("gather in place", t, extra=f" root={root}"), out, gathered)
            else:
                comm.gather(bits(t, me, n, s), None, root, dtype=dt)
            # scatter: out of place (non-roots pass no send), in place at the root.
            src = np.concatenate([bits(t, root, n, s * 100 + j) for j in range(p)])
            out = empty(t, n)
            comm.scatter(ro(src) if me == root else None, out, root, dtype=dt)
            c.array(what("scatter", t, extra=f" root={root}"), out, bits(t, root, n, s * 100 + me))
            if me == root:
                y = src.copy()
                comm.scatter(y, y[me * n:(me + 1) * n], root, dtype=dt)
                c.array(what("scatter in place: root's buffer", t, extra=f" root={root}"), y, src)
            else:
                out = empty(t, n)
                comm.scatter(None, out, root, dtype=dt)
                c.array(what("scatter (second)", t, extra=f" root={root}"), out, bits(t, root, n, s * 100 + me))
        s = nxt()
        want = np.concatenate([bits(t, r, n, s) for r in range(p)])
        out = empty(t, p * n)
        comm.all_gather(ro(bits(t, me, n, s)), out, dtype=dt)
        c.array(what("all_gather out of place", t), out, want)
        out = empty(t, p * n)
        out[me * n:(me + 1) * n] = bits(t, me, n, s)
        comm.all_gather(None, out, dtype=dt)
        c.array(what("all_gather in place (send None)", t), out, want)
        out = empty(t, p * n)
        out[me * n:(me + 1) * n] = bits(t, me, n, s)
        comm.all_gather(out[me * n:(me + 1) * n], out, dtype=dt)
        c.array(what("all_gather in place (send = my block)", t), out, want)
        # all_to_all: rank r's block j (n elements) goes to rank j's block r.
        s = nxt()
        mine = np.concatenate([bits(t, me, n, s * 100 + j) for j in range(p)])
        want = np.concatenate([bits(t, r, n, s * 100 + me) for r in range(p)])
        out = empty(t, p * n)
        comm.all_to_all(ro(mine), out, dtype=dt)
        c.array(what("all_to_all out of place", t), out, want)
        x = mine.copy()
        comm.all_to_all(x, dtype=dt)
        c.array(what("all_to_all in place", t), x, want)

        # all_to_all_v: rank r sends cnt(r, j) elements to j; default displacements, then
        # explicit ones with gaps (which must stay untouched).
        def cnt(a, b):
            return (a * 3 + b * 2) % 5

        s = nxt()
        sc = [cnt(me, j) for j in range(p)]
        rc = [cnt(j, me) for j in range(p)]
        src = bits(t, me, sum(sc), s)
        out = empty(t, sum(rc))
        comm.all_to_all_v(ro(src), out, sc, rc, dtype=dt)
        parts = []
        for j in range(p):
            jc = [cnt(j, k) for k in range(p)]
            jsrc = bits(t, j, sum(jc), s)
            parts.append(jsrc[sum(jc[:me]):sum(jc[:me]) + jc[me]])
        c.array(what("all_to_all_v", t, extra=f" send_counts={sc}"), out, np.concatenate(parts))
        sd = [sum(sc[:j]) for j in range(p)]
        rd = [sum(rc[:j]) + 2 * j for j in range(p)]  # two untouched elements before each block
        out = empty(t, sum(rc) + 2 * p)
        comm.all_to_all_v(src, out, sc, rc, sd, rd, dtype=dt)
        want = empty(t, sum(rc) + 2 * p)
        for j in range(p):
            want[rd[j]:rd[j] + rc[j]] = parts[j]
        c.array(what("all_to_all_v with displacements", t, extra=f" recv_displs={rd}"), out, want)
        # send/recv around the ring: blocking (even ranks send first), then in a group.
        nx, pv = (me + 1) % p, (me - 1) % p
        s = nxt()
        out = empty(t, n)
        if me % 2 == 0:
            comm.send(ro(bits(t, me, n, s)), nx, dtype=dt)
            comm.recv(out, pv, dtype=dt)
        else:
            comm.recv(out, pv, dtype=dt)
            comm.send(bits(t, me, n, s), nx, dtype=dt)
        c.array(what("send/recv", t, extra=f" from={pv}"), out, bits(t, pv, n, s))
        comm.barrier()

    # ----------------------------------------------------------------- groups
    nx, pv = (me + 1) % p, (me - 1) % p
    outs = {j: np.zeros(4 + me, np.float64) for j in range(p) if j != me}
    with comm.group():
        for j in outs:
            comm.send(np.full(4 + j, 100.0 * me + j), j)
            comm.recv(outs[j], j)
    for j, o in outs.items():
        c.array(f"group send/recv from {j}", o, np.full(4 + me, 100.0 * j + me))
    a, b = np.full(3, me + 1, np.int32), np.full(5, me + 1.0, np.float32)
    bc = np.full(2, me, np.int64)
    with comm.group():
        comm.all_reduce(a)
        comm.all_reduce(b, op="max")
        comm.broadcast(bc, root=p - 1)
    c.array("group of collectives: all_reduce sum", a, np.full(3, p * (p + 1) // 2, np.int32))
    c.array("group of collectives: all_reduce max", b, np.full(5, float(p), np.float32))
    c.array("group of collectives: broadcast", bc, np.full(2, p - 1, np.int64))
    got = np.zeros(8, np.float32)
    g = comm.group(async_op=True)
    c.eq("group(async_op=True).work before the block", g.work, None)
    with g:
        comm.send(np.full(8, float(me), np.float32), nx)
        comm.recv(got, pv)
    c.true("group(async_op=True).work after the block", isinstance(g.work, oxccl.Work), repr(g.work))
    c.eq("async group wait", g.work.wait(), True)
    c.array("async group send/recv", got, np.full(8, float(pv), np.float32))
    # An exception inside the block: nothing was started, the next call is not disturbed.
    try:
        with comm.group():
            comm.all_reduce(np.ones(3))
            raise KeyError("inside")
    except KeyError:
        c.ok()
    x = np.full(3, me + 1.0)
    comm.all_reduce(x)
    c.array("a call after a group left by an exception", x, np.full(3, p * (p + 1) / 2))

    # ----------------------------------------------------------------- async calls
    xs = [np.full(7, me + k, np.int64) for k in range(4)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    c.true("async all_reduce returns a Work", all(isinstance(w, oxccl.Work) for w in works), repr(works))
    for k in reversed(range(4)):
        c.eq(f"async all_reduce #{k} wait", works[k].wait(), True)
        c.eq(f"async all_reduce #{k} is_completed", works[k].is_completed(), True)
        c.eq(f"async all_reduce #{k} exception", works[k].exception(), None)
        c.eq(f"async all_reduce #{k} wait again", works[k].wait(), True)
        c.array(f"async all_reduce #{k}", xs[k], np.full(7, sum(r + k for r in range(p)), np.int64))
    c.eq("completed Work repr", repr(works[0]), "<oxccl.Work completed>")
    out = np.zeros(p * 3, np.float32)
    w1 = comm.all_gather(np.full(3, me, np.float32), out, async_op=True)
    bb = np.full(4, me, np.uint8)
    w2 = comm.broadcast(bb, root=0, async_op=True)
    rs = np.zeros(2, np.float64)
    w3 = comm.reduce_scatter(np.arange(2 * p, dtype=np.float64) * (me + 1), rs, "sum", async_op=True)
    a2 = np.zeros(p, np.int32)
    w4 = comm.all_to_all(np.arange(p, dtype=np.int32) + 10 * me, a2, async_op=True)
    gt = np.zeros(p * 2, np.int32) if me == 0 else None
    w5 = comm.gather(np.full(2, me, np.int32), gt, 0, async_op=True)
    sc = np.zeros(2, np.int32)
    w6 = comm.scatter(np.arange(2 * p, dtype=np.int32) if me == p - 1 else None, sc, p - 1, async_op=True)
    rd = np.zeros(3, np.float32) if me == 0 else None
    w7 = comm.reduce(np.full(3, me + 1.0, np.float32), rd, "max", 0, async_op=True)
    av = np.zeros(p, np.int64)
    w8 = comm.all_to_all_v(np.arange(p, dtype=np.int64) + 10 * me, av, [1] * p, [1] * p, async_op=True)
    for k, w in enumerate((w1, w2, w3, w4, w5, w6, w7, w8)):
        c.eq(f"async collective #{k} wait", w.wait(), True)
    c.array("async all_gather", out, np.repeat(np.arange(p, dtype=np.float32), 3))
    c.array("async broadcast", bb, np.zeros(4, np.uint8))
    c.array("async reduce_scatter", rs, np.arange(2 * p, dtype=np.float64)[2 * me:2 * me + 2] * (p * (p + 1) / 2))
    c.array("async all_to_all", a2, np.array([me + 10 * r for r in range(p)], np.int32))
    if me == 0:
        c.array("async gather", gt, np.repeat(np.arange(p, dtype=np.int32), 2))
        c.array("async reduce max", rd, np.full(3, float(p), np.float32))
    c.array("async scatter", sc, np.arange(2 * p, dtype=np.int32)[2 * me:2 * me + 2])
    c.array("async all_to_all_v", av, np.array([me + 10 * r for r in range(p)], np.int64))
    # An async call keeps its buffers alive: the only reference to the send buffer is the call's.
    got = np.zeros(1000, np.float64)
    ws = comm.send(np.arange(1000, dtype=np.float64) + me, nx, async_op=True)
    gc.collect()
    wr = comm.recv(got, pv, async_op=True)
    ws.wait()
    wr.wait()
    c.array("async send of a buffer only the call references", got, np.arange(1000, dtype=np.float64) + pv)
    # Work.wait(timeout): rank 1 sends 0.6 s late; rank 0's wait(0.05) times out, the call goes on.
    if me in (0, 1):
        peer = 1 - me
        if me == 0:
            buf = np.zeros(5, np.int32)
            w = comm.recv(buf, peer, async_op=True)
            t0 = time.monotonic()
            e = c.raises("Work.wait(timeout=0.05) before the peer sends", lambda: w.wait(timeout=0.05),
                         oxccl.TimeoutError, "not complete after")
            dt = time.monotonic() - t0
            c.true("Work.wait(timeout) returned before the peer sent", dt < 0.6, f"{dt:.3f} s")
            c.true("the timed-out wait's exception is also a TimeoutError", isinstance(e, TimeoutError))
            c.eq("is_completed while the peer is late", w.is_completed(), False)
            c.eq("exception() while pending", w.exception(), None)
            c.eq("pending Work repr", repr(w), "<oxccl.Work pending>")
            c.eq("wait() after a timed-out wait", w.wait(), True)
            c.array("recv completed after the timed-out wait", buf, np.arange(5, dtype=np.int32))
        else:
            time.sleep(0.6)
            comm.send(np.arange(5, dtype=np.int32), peer)
    comm.barrier()

    # dtype= a numpy scalar type (as numpy's own functions take it) and a torch dtype.
    x = np.full(3, me + 1.0, np.float32)
    comm.all_reduce(x, dtype=np.float32)
    c.array("dtype=np.float32 (a numpy scalar type)", x, np.full(3, p * (p + 1) / 2, np.float32))
    x = np.full(3, me + 1, np.int64)
    comm.all_reduce(x, op="max", dtype=np.int64)
    c.array("dtype=np.int64 (a numpy scalar type)", x, np.full(3, p, np.int64))
    import torch

    x = bf16_bits(np.full(3, me + 1.0))
    comm.all_reduce(x, dtype=torch.bfloat16)
    c.array("dtype=torch.bfloat16 over uint16", x, bf16_bits(np.full(3, p * (p + 1) / 2)))

    # ----------------------------------------------------------------- other buffers
    ba = bytearray(np.full(4, me + 1, np.int32).tobytes())
    comm.all_reduce(ba, dtype="int32")
    c.array("bytearray with dtype=int32", np.frombuffer(bytes(ba), np.int32), np.full(4, p * (p + 1) // 2, np.int32))
    aa = array.array("d", [me + 0.5] * 3)
    comm.all_reduce(aa, op="max")
    c.eq("array.array('d') max", list(aa), [p - 0.5] * 3)
    mv = memoryview(bytearray(8))
    if me == 0:
        mv[:] = np.arange(8, dtype=np.uint8).tobytes()
    comm.broadcast(mv, root=0)
    c.eq("memoryview broadcast", bytes(mv), bytes(range(8)))
    x2 = np.full((3, 4), me + 1, np.float32)  # multi-dimensional, C-contiguous
    comm.all_reduce(x2, op="prod")
    c.array("2-D array prod", x2, np.full((3, 4), float(math.factorial(p)), np.float32))

    # ----------------------------------------------------------------- split
    color = None if me == 0 else me % 2
    sub = comm.split(color, key=p - me)  # reversed order inside each color
    if color is None:
        c.eq("split with color None", sub, None)
    else:
        members = sorted([r for r in range(1, p) if r % 2 == color], reverse=True)
        c.eq(f"split color={color}: size", sub.size, len(members))
        c.eq(f"split color={color}: rank (by key)", sub.rank, members.index(me))
        x = np.full(4, float(me + 1))
        sub.all_reduce(x)
        c.array(f"split color={color}: all_reduce", x, np.full(4, float(sum(r + 1 for r in members))))
        y = np.full(2, me, np.int64)
        sub.broadcast(y, root=0)
        c.array(f"split color={color}: broadcast from its rank 0 (global {members[0]})", y,
                np.full(2, members[0], np.int64))
        sub.abort()
        c.eq("abort: closed", sub.closed, True)
        c.raises("a call after abort", lambda: sub.all_reduce(np.ones(2)), oxccl.InvalidArgumentError, "closed")
    x = np.full(2, 1.0)
    comm.all_reduce(x)
    c.array("parent after split and the child's abort", x, np.full(2, float(p)))

    # ----------------------------------------------------------------- stores, unique ids
    import torch.distributed as dist  # only for its stores

    tcp = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), p, False,
                        timeout=timedelta(seconds=60))
    cs = oxccl.Communicator.from_store(tcp, me, p, key="oxccl-test/numpy/tcp")
    x = np.full(3, me, np.int64)
    cs.all_reduce(x, op="max")
    c.array("from_store(TCPStore) all_reduce", x, np.full(3, p - 1, np.int64))
    c.eq("from_store(TCPStore) rank", cs.rank, me)
    cs.close()
    c.eq("close: closed", cs.closed, True)
    c.eq("close: repr", repr(cs), "<oxccl.Communicator (closed)>")
    cs.close()  # idempotent
    c.raises("a call after close", lambda: cs.all_reduce(np.ones(2)), oxccl.InvalidArgumentError, "closed")
    c.raises("rank after close", lambda: cs.rank, oxccl.InvalidArgumentError, "closed")

    fs = dist.FileStore(sys.argv[1], p)
    with oxccl.Communicator.from_store(fs, me, p) as cf:
        x = np.full(5, me + 1, np.uint64)
        cf.all_reduce(x, op="prod")
        c.array("from_store(FileStore) all_reduce prod", x, np.full(5, math.factorial(p), np.uint64))
    c.eq("context manager closes", cf.closed, True)
    ps = dist.PrefixStore("numpy-test", tcp)
    cp = oxccl.Communicator.from_store(ps, me, p, key="another/key", timeout=30)
    x = np.full(2, me, np.int32)
    cp.all_reduce(x)
    c.array("from_store(PrefixStore) all_reduce", x, np.full(2, p * (p - 1) // 2, np.int32))
    cp.close()
    # Communicator(unique_id, size, rank): rank 0 makes the id, the store carries it.
    if me == 0:
        uid = oxccl.unique_id()
        c.eq("unique_id length", len(uid), 128)
        tcp.set("oxccl-test/numpy/uid", bytes(uid))
    uid = tcp.get("oxccl-test/numpy/uid")
    cu = oxccl.Communicator(uid, p, me)
    x = np.full(3, me + 1.0, np.float16)
    cu.all_reduce(x, op="avg")
    c.array("Communicator(unique_id, size, rank) avg", x, np.full(3, (p + 1) / 2, np.float16))

    # A communicator timeout: rank 0 calls, the others do not; rank 0 raises
    # oxccl.TimeoutError near the deadline, naming the ranks it waited for.
    ct = oxccl.Communicator.from_store(tcp, me, p, key="oxccl-test/numpy/timeout", timeout=1.0)
    if me == 0:
        t0 = time.monotonic()
        c.raises("a call no other rank makes (timeout=1 s)", lambda: ct.all_reduce(np.ones(4)), oxccl.TimeoutError,
                 "timed out")
        dt = time.monotonic() - t0
        c.true("timed out near 1 s", 0.9 <= dt < 10, f"{dt:.2f} s")
    tcp.set(f"oxccl-test/numpy/timeout-done/{me}", b"1")
    for r in range(p):
        tcp.get(f"oxccl-test/numpy/timeout-done/{r}")
    ct.abort()

    # ----------------------------------------------------------------- shrink (healthy)
    # Every rank but the last makes a communicator without it; the last does not call.
    cu.barrier()
    if me != p - 1:
        sh = cu.shrink([p - 1])
        c.eq("shrink: size", sh.size, p - 1)
        c.eq("shrink: rank", sh.rank, me)
        x = np.full(3, me + 1, np.int32)
        sh.all_reduce(x)
        c.array("shrink: all_reduce", x, np.full(3, (p - 1) * p // 2, np.int32))
        sh.close()
    comm.barrier()
    comm.close()
    say(f"numpy worker done on rank {me}")
    c.finish()


if __name__ == "__main__":
    main(run)

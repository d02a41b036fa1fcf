"""Every element type numpy and torch have, through oxccl.Communicator and the torch.distributed
backend "oxccl": each is reduced exactly, moved exactly by the calls that only move data, or
refused by name (InvalidArgumentError naming the type); never a silent wrong result.

    torchrun --nproc-per-node P dtypes.py

- `oxccl.data_types()` is the list reductions take, and the list an error prints: every name
  in it all-reduces exactly (torch tensors of that dtype), and a refused reduction's message
  carries exactly that list.
- numpy: bool reduces logically (sum/max or, prod/min and, bitwise and/or/xor; avg refused,
  and the result stays 0/1), complex64/128 by sum and avg (others refused); int16, uint16,
  longdouble, clongdouble, string, void, structured and non-native byte order arrays move
  exactly and are refused by reductions; object arrays are refused everywhere; datetime64 and
  timedelta64 (which numpy cannot export as buffers) are refused naming their dtype.
- torch: every torch.dtype this torch has (found by looking, so a new one is covered too)
  that a tensor can be made of: exact or refused naming it, in broadcast and all_reduce; lazy
  conjugate / negative views and sparse tensors refused; bool and complex and int16 through
  torch.distributed (its compiled fast path and its Python path).
"""

import numpy as np
import torch
import torch.distributed as dist

import oxccl
import oxccl.torch  # noqa: F401
from common import Checks, main, say

INV = oxccl.InvalidArgumentError
OPS = ["sum", "prod", "max", "min", "avg", "band", "bor", "bxor"]


def run():
    dist.init_process_group("oxccl")
    comm = oxccl.Communicator()
    me, p = comm.rank, comm.size
    c = Checks()
    names = oxccl.data_types()

    def refused(what, fn, *needles):
        c.raises(what, fn, INV, *needles)

    def bytes_of(a):
        return np.ascontiguousarray(a).view(np.uint8).reshape(-1)

    # ------------------------------------------------------------- the list is what works
    for name in names:
        dt = getattr(torch, name)
        vals = torch.tensor([1.0, 2.0, 1.0, 2.0], dtype=torch.float64)
        mine = vals * (me % 2 + 1)
        want = sum(vals * (r % 2 + 1) for r in range(p))
        if dt == torch.bool:
            mine, want = torch.tensor([me == 0, False, True, me == p - 1]), torch.tensor([True, False, True, True])
        elif dt.is_complex:
            mine, want = torch.complex(mine, -mine).to(dt), torch.complex(want, -want).to(dt)
        else:
            mine, want = mine.to(dt), want.to(dt)
        comm.all_reduce(mine)
        c.tensor(f"all_reduce sum of {name} (oxccl.data_types())", mine, want)
    e = c.raises("int16 reduction names the list", lambda: comm.all_reduce(np.ones(4, np.int16)), INV, "int16")
    c.true("the refusal's list is oxccl.data_types()", e is not None and ", ".join(names) in str(e), str(e))

    # ------------------------------------------------------------------------------ numpy
    # bool: every operator, logically; the bytes stay 0 or 1.
    pattern = [[True, False, True, False], [True, True, False, False]]
    bits = [np.array(pattern[r % 2] + [r == 0, r == p - 1], bool) for r in range(p)]
    stack = np.stack(bits)
    logical = {
        "sum": stack.any(0), "max": stack.any(0), "bor": stack.any(0),
        "prod": stack.all(0), "min": stack.all(0), "band": stack.all(0),
        "bxor": np.logical_xor.reduce(stack, 0),
    }
    for op, want in logical.items():
        a = bits[me].copy()
        comm.all_reduce(a, op=op)
        c.array(f"numpy bool all_reduce {op}", a, want)
        c.true(f"numpy bool all_reduce {op}: bytes are 0/1", set(a.view(np.uint8).tolist()) <= {0, 1},
               str(a.view(np.uint8)))
        out = np.zeros(6, bool)
        comm.all_reduce(bits[me], out, op=op)
        c.array(f"numpy bool all_reduce {op} out of place", out, want)
    refused("numpy bool avg", lambda: comm.all_reduce(bits[me].copy(), op="avg"), "op:", "avg", "bool")
    blk = np.zeros(2, bool)
    comm.reduce_scatter(np.tile(bits[me][:2], p), blk, op="sum")
    c.array("numpy bool reduce_scatter sum", blk, np.stack([b[:2] for b in bits]).any(0))

    # complex: sum and avg exact, everything else refused naming the type.
    for ct in (np.complex64, np.complex128):
        name = np.dtype(ct).name
        mk = lambda r: np.array([complex(r + 1, -2 * (r + 1)), complex(2 * p, 4 * r)], ct)  # noqa: E731
        total = sum(mk(r) for r in range(p))
        for op, want in (("sum", total), ("avg", (total / p).astype(ct))):
            a = mk(me)
            comm.all_reduce(a, op=op)
            c.array(f"numpy {name} all_reduce {op}", a, want)
        for op in ("prod", "max", "min", "band", "bor", "bxor"):
            refused(f"numpy {name} {op}", lambda: comm.all_reduce(mk(me), op=op), "op:", op, name)

    # Types without arithmetic: moved exactly, refused by reductions naming them.
    rng = np.random.default_rng(11)
    structured = np.dtype([("a", "<i4"), ("b", "<f8"), ("c", "S3")])
    moved = [
        ("int16", np.int16, "int16"), ("uint16", np.uint16, "uint16"),
        ("longdouble", np.longdouble, "longdouble"), ("clongdouble", np.clongdouble, "clongdouble"),
        ("bytes S5", np.dtype("S5"), "bytes string"), ("unicode U3", np.dtype("U3"), "unicode string"),
        ("void V6", np.dtype("V6"), "format"), ("structured", structured, "structured"),
        ("big-endian int32", np.dtype(">i4"), "non-native byte order"),
        ("big-endian float64", np.dtype(">f8"), "non-native byte order"),
    ]
    for label, dt, needle in moved:
        dt = np.dtype(dt)

        def make(r, n=5, dt=dt):
            raw = np.random.default_rng(100 + r).integers(0, 256, n * dt.itemsize, dtype=np.uint8)
            return raw.view(dt).copy()

        a = make(me) if me == 0 else np.zeros(5, dt)
        comm.broadcast(a, root=0)
        c.array(f"numpy {label} broadcast", bytes_of(a), bytes_of(make(0)))
        out = np.zeros(5 * p, dt)
        comm.all_gather(make(me), out)
        c.array(f"numpy {label} all_gather", bytes_of(out), np.concatenate([bytes_of(make(r)) for r in range(p)]))
        got = np.zeros(5, dt)
        with comm.group():
            comm.send(make(me), (me + 1) % p)
            comm.recv(got, (me - 1) % p)
        c.array(f"numpy {label} send/recv", bytes_of(got), bytes_of(make((me - 1) % p)))
        refused(f"numpy {label} all_reduce", lambda: comm.all_reduce(make(me)), "send:", needle, "cannot be reduced")
        refused(f"numpy {label} reduce", lambda: comm.reduce(make(me), None, "max", 0), "send:", "cannot be reduced")
    del rng
    refused("numpy object broadcast", lambda: comm.broadcast(np.array([None, 1], dtype=object)), "send:",
            "Python objects")
    refused("numpy object all_gather", lambda: comm.all_gather(np.array([1], dtype=object),
                                                            np.zeros(p, dtype=object)), "Python objects")
    for dt in ("datetime64[D]", "timedelta64[s]"):
        refused(f"numpy {dt}", lambda: comm.broadcast(np.zeros(3, dtype=dt)), "send:", dt, "view")
    refused("dtype='bool' avg", lambda: comm.all_reduce(np.zeros(4, np.uint8), op="avg",
                                                                               dtype="bool"), "bool")

    # ------------------------------------------------------------------------------ torch
    seen = {}
    for n in dir(torch):
        d = getattr(torch, n)
        if isinstance(d, torch.dtype):
            seen.setdefault(d, n)
    reducible = {getattr(torch, n) for n in names}
    made = refused_n = moved_n = reduced_n = 0
    for d, n in sorted(seen.items(), key=lambda kv: str(kv[0])):
        try:
            t = torch.zeros(6, dtype=d)
            raw = t.view(torch.uint8)
        except Exception:  # noqa: BLE001 - a dtype no tensor can be made of cannot reach oxccl
            continue
        made += 1
        tname = str(d).replace("torch.", "")
        src = torch.from_numpy(np.random.default_rng(7).integers(0, 256, raw.numel(), dtype=np.uint8))
        if d == torch.bool:
            src = src % 2
        elif d.is_floating_point:
            src = src & 0x3F  # finite values (no NaN bit patterns, which have no order)

        def fresh(bytes_, d=d):
            # clone() and copies are not implemented for some dtypes (int1, ...); bytes are.
            e = torch.empty(6, dtype=d)
            e.view(torch.uint8).copy_(bytes_)
            return e

        t = fresh(src)
        if d.is_complex:  # small integers: their sums are exact in every order
            t = torch.complex(torch.arange(6.0) - 2, 3 - torch.arange(6.0)).to(d)
        tb_ = t.view(torch.uint8).clone()
        b = fresh(tb_) if me == 0 else fresh(torch.zeros_like(tb_))
        try:
            comm.broadcast(b, root=0)
        except INV as e:
            ok = tname in str(e) and d not in reducible
            c.true(f"torch {tname} broadcast refused naming it", ok, str(e))
            c.raises(f"torch {tname} all_reduce refused too", lambda: comm.all_reduce(fresh(tb_)), INV, tname)
            refused_n += 1
            continue
        c.tensor(f"torch {tname} broadcast", b.view(torch.uint8), tb_)
        moved_n += 1
        x = fresh(tb_)
        try:
            comm.all_reduce(x, op="max" if not d.is_complex else "sum")
        except INV as e:
            c.true(f"torch {tname} all_reduce refused naming it", tname in str(e) and d not in reducible, str(e))
            continue
        c.true(f"torch {tname} all_reduce ran: it is in oxccl.data_types()", d in reducible, tname)
        want = (t.to(torch.complex128) * p).to(d) if d.is_complex else t
        c.tensor(f"torch {tname} all_reduce of equal inputs", x, want)
        reduced_n += 1
    c.true("every dtype oxccl.data_types() names was made and reduced", reduced_n == len(names),
           f"{reduced_n} reduced, {len(names)} named")
    c.true("some torch dtypes were made, moved and refused", made > 20 and moved_n > reduced_n and refused_n > 0,
           f"made {made}, moved {moved_n}, reduced {reduced_n}, refused {refused_n}")
    say(f"DTYPES torch: {made} dtypes made into tensors, {moved_n} moved, {reduced_n} of them reduced, "
        f"{refused_n} refused")
    q = torch.quantize_per_tensor(torch.ones(4), 0.5, 0, torch.qint8)
    refused("torch quantized tensor", lambda: comm.broadcast(q), "send:", "qint8", "dequantize")
    z = torch.complex(torch.ones(4), torch.ones(4))
    refused("torch lazily conjugated view", lambda: comm.all_reduce(z.conj()), "send:", "is_conj", "resolve_conj")
    refused("torch lazily negated real view (the imaginary part of a conjugate)",
            lambda: comm.broadcast(torch.complex(torch.ones(1), torch.ones(1)).conj().imag), "send:", "is_neg",
            "resolve_neg")
    refused("torch sparse tensor", lambda: comm.broadcast(torch.ones(4).to_sparse()), "send:", "sparse", "to_dense")
    for label, make in (("sparse CSR", lambda: torch.eye(3).to_sparse_csr()),
                        ("mkldnn", lambda: torch.ones(4).to_mkldnn()),
                        ("nested jagged", lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)],
                                                                             layout=torch.jagged))):
        try:
            x = make()
        except Exception:  # noqa: BLE001 - a layout this torch cannot make cannot reach oxccl
            continue
        refused(f"torch {label} tensor", lambda: comm.broadcast(x), "send:", "layout", "to_dense")
    zr = z.conj().resolve_conj()
    comm.all_reduce(zr)
    c.tensor("torch resolved conjugate all_reduce", zr, torch.complex(torch.ones(4), -torch.ones(4)) * p)

    # ------------------------------------------------------------------ torch.distributed
    tb = [torch.tensor(pattern[r % 2] + [r == 0, r == p - 1]) for r in range(p)]
    tstack = torch.stack(tb)
    R = dist.ReduceOp
    for op, want in ((R.SUM, tstack.any(0)), (R.MAX, tstack.any(0)), (R.PRODUCT, tstack.all(0)),
                     (R.MIN, tstack.all(0)), (R.BXOR, tstack.sum(0) % 2 == 1)):
        x = tb[me].clone()
        dist.all_reduce(x, op=op)  # the compiled fast path, where it is built
        c.tensor(f"dist bool all_reduce {op}", x, want)
        c.true(f"dist bool all_reduce {op}: bytes are 0/1", int(x.view(torch.uint8).max()) <= 1)
        xs = [tb[me].clone(), tb[me].clone()]
        dist.all_reduce_coalesced(xs, op=op)  # the Python path
        c.tensor(f"dist bool all_reduce_coalesced {op}", xs[1], want)
        r = tb[me].clone()
        dist.reduce(r, dst=p - 1, op=op)
        if me == p - 1:
            c.tensor(f"dist bool reduce {op}", r, want)
    zc = torch.complex(torch.full((3,), float(me + 1)), torch.arange(3.0))
    dist.all_reduce(zc)
    c.tensor("dist complex64 all_reduce sum", zc,
             torch.complex(torch.full((3,), float(p * (p + 1) // 2)), torch.arange(3.0) * p))
    i16 = torch.arange(5, dtype=torch.int16) * 1000 + 7 if me == 0 else torch.zeros(5, dtype=torch.int16)
    dist.broadcast(i16, src=0)
    c.tensor("dist int16 broadcast", i16, torch.arange(5, dtype=torch.int16) * 1000 + 7)
    g = [torch.zeros(2, dtype=torch.uint16) for _ in range(p)]
    dist.all_gather(g, torch.full((2,), 40000 + me, dtype=torch.uint16))
    c.tensor("dist uint16 all_gather", torch.stack(g).reshape(-1),
             torch.tensor([40000 + r for r in range(p) for _ in range(2)], dtype=torch.uint16))
    dist.destroy_process_group()
    comm.close()
    c.finish()


if __name__ == "__main__":
    main(run)

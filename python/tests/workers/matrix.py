"""Every torch.distributed collective × data type × operator through the backend "oxccl",
exact against references computed here (tref.py), in and out of place where torch has both.

    torchrun --nproc-per-node P matrix.py

Prints `CHECKS rank=R passed=N failed=F` and `COUNT rank=R <what> <n>` lines (how many
calls of each kind were checked, so the test can see nothing was skipped).
"""

import collections
import os
import warnings

import torch
import torch.distributed as dist

import oxccl
import oxccl.torch  # noqa: F401  registers the backend "oxccl"
from common import Checks, main, say
from tref import DTYPES, filled, name, ops_for, rand_bits, red_input, reference, torch_op

warnings.filterwarnings("ignore")



def run():
    dist.init_process_group("oxccl")
    me, p = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "oxccl", dist.get_backend()
    c = Checks()
    count = collections.Counter()
    salt = [0]

    def nxt():
        salt[0] += 1
        return salt[0]

    def ctx(coll, dt, op="", n=None, extra=""):
        return f"{coll} dtype={name(dt)}" + (f" op={op}" if op else "") + (f" n={n}" if n is not None else "") + extra

    # ------------------------------------------------------------------ reductions
    def reductions(dt, op):
        def want(inputs):
            return reference(op, dt, [w for _, w in inputs], p)

        # all_reduce (in place only in torch), several sizes.
        for n in (1, 13, 1031):
            s = nxt()
            ins = [red_input(r, n, dt, op, s) for r in range(p)]
            x = ins[me][0].clone()
            dist.all_reduce(x, op=torch_op(op))
            c.tensor(ctx("all_reduce", dt, op, n), x, want(ins))
            count["all_reduce"] += 1
        # all_reduce_coalesced (two tensors of different sizes in one call).
        if hasattr(dist, "all_reduce_coalesced"):
            s = nxt()
            ins_a = [red_input(r, 5, dt, op, s) for r in range(p)]
            ins_b = [red_input(r, 9, dt, op, s + 10_000) for r in range(p)]
            a, b = ins_a[me][0].clone(), ins_b[me][0].clone()
            dist.all_reduce_coalesced([a, b], op=torch_op(op))
            c.tensor(ctx("all_reduce_coalesced[0]", dt, op), a, want(ins_a))
            c.tensor(ctx("all_reduce_coalesced[1]", dt, op), b, want(ins_b))
            count["all_reduce_coalesced"] += 1
        # The coalescing manager's fast path (allreduce_coalesced through torch's own code).
        s = nxt()
        ins_a = [red_input(r, 6, dt, op, s) for r in range(p)]
        ins_b = [red_input(r, 3, dt, op, s + 10_000) for r in range(p)]
        a, b = ins_a[me][0].clone(), ins_b[me][0].clone()
        with dist._coalescing_manager():
            dist.all_reduce(a, op=torch_op(op))
            dist.all_reduce(b, op=torch_op(op))
        c.tensor(ctx("_coalescing_manager all_reduce[0]", dt, op), a, want(ins_a))
        c.tensor(ctx("_coalescing_manager all_reduce[1]", dt, op), b, want(ins_b))
        count["coalescing_manager_all_reduce"] += 1
        # reduce, every root.
        for root in range(p):
            s = nxt()
            ins = [red_input(r, 11, dt, op, s) for r in range(p)]
            x = ins[me][0].clone()
            dist.reduce(x, dst=root, op=torch_op(op))
            if me == root:
                c.tensor(ctx("reduce", dt, op, extra=f" root={root}"), x, want(ins))
            count["reduce"] += 1
        # reduce_scatter (list of inputs), out of place.
        m = 7
        s = nxt()
        ins = [[red_input(r, m, dt, op, s * 100 + j) for j in range(p)] for r in range(p)]
        out = filled(m, dt)
        dist.reduce_scatter(out, [t.clone() for t, _ in ins[me]], op=torch_op(op))
        c.tensor(ctx("reduce_scatter", dt, op), out, want([ins[r][me] for r in range(p)]))
        count["reduce_scatter"] += 1
        # reduce_scatter_tensor: flat, 2-D (p, m), and in place (the output is this rank's
        # block of the input).
        for form in ("flat", "2d", "in_place"):
            s = nxt()
            ins = [red_input(r, p * m, dt, op, s) for r in range(p)]
            expect = reference(op, dt, [w[me * m:(me + 1) * m] for _, w in ins], p)
            inp = ins[me][0].clone()
            keep = inp.clone()
            if form == "flat":
                o = filled(m, dt)
                dist.reduce_scatter_tensor(o, inp, op=torch_op(op))
            elif form == "2d":
                o = filled(m, dt).reshape(1, m)
                dist.reduce_scatter_tensor(o, inp.reshape(p, m), op=torch_op(op))
            else:
                o = inp[me * m:(me + 1) * m]
                dist.reduce_scatter_tensor(o, inp, op=torch_op(op))
            c.tensor(ctx("reduce_scatter_tensor", dt, op, extra=f" form={form}"), o, expect)
            if form != "in_place":
                c.tensor(ctx("reduce_scatter_tensor input unchanged", dt, op, extra=f" form={form}"), inp, keep)
            count["reduce_scatter_tensor"] += 1

    # ------------------------------------------------------------------ data movement
    def movement(dt):
        n = 10
        # broadcast, every root (1-D and 2-D).
        for root in range(p):
            s = nxt()
            x = rand_bits(n, dt, me, s, shape=(2, 5))
            dist.broadcast(x, src=root)
            c.tensor(ctx("broadcast", dt, extra=f" root={root}"), x, rand_bits(n, dt, root, s, shape=(2, 5)))
            count["broadcast"] += 1
        # all_gather (list), equal sizes, then uneven sizes (rank r contributes n + r).
        s = nxt()
        outs = [filled(n, dt) for _ in range(p)]
        dist.all_gather(outs, rand_bits(n, dt, me, s))
        for j in range(p):
            c.tensor(ctx("all_gather", dt, extra=f" block={j}"), outs[j], rand_bits(n, dt, j, s))
        count["all_gather"] += 1
        s = nxt()
        outs = [filled(n + j, dt) for j in range(p)]
        dist.all_gather(outs, rand_bits(n + me, dt, me, s))
        for j in range(p):
            c.tensor(ctx("all_gather uneven", dt, extra=f" block={j}"), outs[j], rand_bits(n + j, dt, j, s))
        count["all_gather_uneven"] += 1
        # all_gather_into_tensor: flat, stacked (p, n), in place.
        want = torch.cat([rand_bits(n, dt, j, s + 1) for j in range(p)])
        for form in ("flat", "2d", "in_place"):
            if form == "flat":
                o = filled(p * n, dt)
                dist.all_gather_into_tensor(o, rand_bits(n, dt, me, s + 1))
            elif form == "2d":
                o = filled(p * n, dt).reshape(p, n)
                dist.all_gather_into_tensor(o, rand_bits(n, dt, me, s + 1))
            else:
                o = filled(p * n, dt)
                o[me * n:(me + 1) * n] = rand_bits(n, dt, me, s + 1)
                dist.all_gather_into_tensor(o, o[me * n:(me + 1) * n])
            c.tensor(ctx("all_gather_into_tensor", dt, extra=f" form={form}"), o, want)
            count["all_gather_into_tensor"] += 1
        s = nxt()
        # all_to_all (list): rank r's block j is rand_bits(.., r, s*1000+j).
        ins = [rand_bits(3 + j, dt, me, s * 1000 + j) for j in range(p)]  # block j goes to rank j
        outs = [filled(3 + me, dt) for _ in range(p)]
        dist.all_to_all(outs, ins)
        for j in range(p):
            c.tensor(ctx("all_to_all", dt, extra=f" from={j}"), outs[j], rand_bits(3 + me, dt, j, s * 1000 + me))
        count["all_to_all"] += 1
        # all_to_all_single: even (rows of 3), then uneven split sizes.
        s = nxt()
        rows = 2
        inp = rand_bits(p * rows * 3, dt, me, s, shape=(p * rows, 3))
        o = filled(p * rows * 3, dt).reshape(p * rows, 3)
        dist.all_to_all_single(o, inp)
        want = torch.cat([rand_bits(p * rows * 3, dt, j, s, shape=(p * rows, 3))[me * rows:(me + 1) * rows]
                          for j in range(p)])
        c.tensor(ctx("all_to_all_single even", dt), o, want)
        count["all_to_all_single_even"] += 1

        def split(src, dst):  # rows rank src sends rank dst
            return (src * 2 + dst * 3) % 4  # includes zero-row blocks

        s = nxt()
        in_splits = [split(me, j) for j in range(p)]
        out_splits = [split(j, me) for j in range(p)]
        inp = rand_bits(sum(in_splits) * 3, dt, me, s, shape=(sum(in_splits), 3))
        o = filled(sum(out_splits) * 3, dt).reshape(sum(out_splits), 3)
        dist.all_to_all_single(o, inp, output_split_sizes=out_splits, input_split_sizes=in_splits)
        parts = []
        for j in range(p):
            src_splits = [split(j, k) for k in range(p)]
            src = rand_bits(sum(src_splits) * 3, dt, j, s, shape=(sum(src_splits), 3))
            at = sum(src_splits[:me])
            parts.append(src[at:at + src_splits[me]])
        c.tensor(ctx("all_to_all_single uneven", dt, extra=f" in_splits={in_splits}"), o, torch.cat(parts))
        count["all_to_all_single_uneven"] += 1
        # gather and scatter, every root.
        for root in range(p):
            s = nxt()
            gl = [filled(n, dt) for _ in range(p)] if me == root else None
            dist.gather(rand_bits(n, dt, me, s), gather_list=gl, dst=root)
            if me == root:
                for j in range(p):
                    c.tensor(ctx("gather", dt, extra=f" root={root} block={j}"), gl[j], rand_bits(n, dt, j, s))
            count["gather"] += 1
            s = nxt()
            sl = [rand_bits(n, dt, root, s * 1000 + j) for j in range(p)] if me == root else None
            o = filled(n, dt)
            dist.scatter(o, scatter_list=sl, src=root)
            c.tensor(ctx("scatter", dt, extra=f" root={root}"), o, rand_bits(n, dt, root, s * 1000 + me))
            count["scatter"] += 1
        # send/recv around the ring: blocking (even ranks send first), then isend/irecv.
        nx, pv = (me + 1) % p, (me - 1) % p
        s = nxt()
        o = filled(n, dt)
        if me % 2 == 0:
            dist.send(rand_bits(n, dt, me, s), dst=nx)
            dist.recv(o, src=pv)
        else:
            dist.recv(o, src=pv)
            dist.send(rand_bits(n, dt, me, s), dst=nx)
        c.tensor(ctx("send/recv", dt, extra=f" from={pv}"), o, rand_bits(n, dt, pv, s))
        count["send_recv"] += 1
        s = nxt()
        o = filled(n, dt)
        ws = [dist.isend(rand_bits(n, dt, me, s), dst=nx), dist.irecv(o, src=pv)]
        for w in ws:
            w.wait()
        c.tensor(ctx("isend/irecv", dt, extra=f" from={pv}"), o, rand_bits(n, dt, pv, s))
        count["isend_irecv"] += 1
        # batch_isend_irecv: a message to and from every other rank, recvs posted first.
        s = nxt()
        outs = {j: filled(n + me, dt) for j in range(p) if j != me}
        ops = [dist.P2POp(dist.irecv, outs[j], j) for j in outs]
        ops += [dist.P2POp(dist.isend, rand_bits(n + j, dt, me, s * 1000 + j), j) for j in outs]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        for j, t in outs.items():
            c.tensor(ctx("batch_isend_irecv", dt, extra=f" from={j}"), t, rand_bits(n + me, dt, j, s * 1000 + me))
        count["batch_isend_irecv"] += 1

    # ------------------------------------------------------------------ the matrix
    for dt in DTYPES + [torch.bool]:
        movement(dt)
        for op in ops_for(dt):
            reductions(dt, op)
        dist.barrier()
        count["barrier"] += 1

    # PREMUL_SUM with the factor as a 1-element tensor (torch's other form), and factors
    # other than 2 (a power of two keeps the products exact).
    for dt in (torch.float32, torch.bfloat16, torch.float64):
        for factor in (torch.tensor([0.5], dtype=torch.float64), 4.0):
            s = nxt()
            ins = [red_input(r, 9, dt, "PREMUL_SUM", s) for r in range(p)]
            f = float(factor) if not isinstance(factor, float) else factor
            want = reference("PREMUL_SUM", dt, [w for _, w in ins], p, factor=f)
            x = ins[me][0].clone()
            dist.all_reduce(x, op=dist._make_nccl_premul_sum(factor))
            c.tensor(ctx("all_reduce", dt, "PREMUL_SUM", extra=f" factor={f}"), x, want)
            count["premul_factor_forms"] += 1

    # Large calls (several chunks, the pipelined algorithms), a few types and operators.
    big = 300_007
    for dt, op in ((torch.float32, "SUM"), (torch.bfloat16, "AVG"), (torch.int32, "MAX"), (torch.float8_e5m2, "SUM")):
        s = nxt()
        ins = [red_input(r, big, dt, op, s) for r in range(p)]
        x = ins[me][0].clone()
        dist.all_reduce(x, op=torch_op(op))
        c.tensor(ctx("all_reduce large", dt, op, big), x, reference(op, dt, [w for _, w in ins], p))
        m = big // p
        o = filled(m, dt)
        dist.reduce_scatter_tensor(o, ins[me][0][: p * m].clone(), op=torch_op(op))
        c.tensor(ctx("reduce_scatter_tensor large", dt, op, m), o,
                 reference(op, dt, [w[me * m:(me + 1) * m] for _, w in ins], p))
        o = filled(p * m, dt)
        dist.all_gather_into_tensor(o, rand_bits(m, dt, me, s))
        c.tensor(ctx("all_gather_into_tensor large", dt, n=m), o, torch.cat([rand_bits(m, dt, j, s) for j in range(p)]))
        x = rand_bits(big, dt, me, s)
        dist.broadcast(x, src=p - 1)
        c.tensor(ctx("broadcast large", dt, n=big, extra=f" root={p - 1}"), x, rand_bits(big, dt, p - 1, s))
        count["large"] += 1

    # Complex tensors (torch passes them as real views) and the object collectives (pickles
    # in uint8 tensors, sizes in int64 ones).
    for dt in (torch.complex64, torch.complex128):
        s = nxt()
        parts = [torch.complex(red_input(r, 6, torch.float64, "SUM", s)[1],
                               red_input(r, 6, torch.float64, "SUM", s + 1)[1]) for r in range(p)]
        x = parts[me].to(dt).clone()
        dist.all_reduce(x)
        c.tensor(ctx("all_reduce complex", dt, "SUM"), x, sum(parts).to(dt))
        x = parts[me].to(dt).clone()
        dist.broadcast(x, src=p - 1)
        c.tensor(ctx("broadcast complex", dt), x, parts[p - 1].to(dt))
        count["complex"] += 1
    objs = [None] * p
    dist.all_gather_object(objs, {"rank": me, "text": "x" * (me * 7)})
    c.eq("all_gather_object", objs, [{"rank": r, "text": "x" * (r * 7)} for r in range(p)])
    lst = [f"from {me}", me] if me == 1 % p else [None, None]
    dist.broadcast_object_list(lst, src=1 % p)
    c.eq("broadcast_object_list", lst, [f"from {1 % p}", 1 % p])
    got = [None] * p if me == 0 else None
    dist.gather_object(("g", me), got, dst=0)
    if me == 0:
        c.eq("gather_object", got, [("g", r) for r in range(p)])
    out = [None]
    dist.scatter_object_list(out, [("s", r) for r in range(p)] if me == p - 1 else None, src=p - 1)
    c.eq("scatter_object_list", out, [("s", me)])
    count["objects"] += 1

    # Which calls reach the Python methods: one plain call of each kind the compiled fast path
    # answers (contiguous CPU tensors, an operator oxccl has), counted by wrapping the Python
    # methods the trampoline would call. With the fast path every count is 0; without it every
    # one is 1 (so the counting itself is seen to work). Results are checked too.
    seen = collections.Counter()
    cls = oxccl.torch.OxcclBackend
    names = ("allreduce", "broadcast", "reduce", "all_gather_single", "reduce_scatter_single",
             "all_to_all_single", "barrier")
    saved = {n: getattr(cls, n) for n in names}

    def counted(n, f):
        def w(*a, **k):
            seen[n] += 1
            return f(*a, **k)
        return w

    for n in names:
        setattr(cls, n, counted(n, saved[n]))
    try:
        s = nxt()
        x = rand_bits(7, torch.float32, me, s)
        dist.broadcast(x, src=p - 1)
        c.tensor("plain broadcast", x, rand_bits(7, torch.float32, p - 1, s))
        x = torch.full((5,), float(me + 1))
        dist.all_reduce(x)
        c.tensor("plain all_reduce", x, torch.full((5,), float(p * (p + 1) // 2)))
        x = torch.full((3,), me + 1, dtype=torch.int64)
        dist.reduce(x, dst=0, op=dist.ReduceOp.MAX)
        if me == 0:
            c.tensor("plain reduce", x, torch.full((3,), p, dtype=torch.int64))
        o = torch.empty(2 * p, dtype=torch.int32)
        dist.all_gather_into_tensor(o, torch.tensor([me, -me], dtype=torch.int32))
        c.tensor("plain all_gather_into_tensor", o,
                 torch.tensor([v for r in range(p) for v in (r, -r)], dtype=torch.int32))
        o = torch.empty(2, dtype=torch.float64)
        dist.reduce_scatter_tensor(o, torch.arange(2 * p, dtype=torch.float64) + me)
        c.tensor("plain reduce_scatter_tensor", o,
                 torch.tensor([p * (2 * me + i) + p * (p - 1) / 2 for i in range(2)], dtype=torch.float64))
        o = torch.empty(p, dtype=torch.int32)
        dist.all_to_all_single(o, torch.tensor([100 * me + j for j in range(p)], dtype=torch.int32))
        c.tensor("plain all_to_all_single", o, torch.tensor([100 * j + me for j in range(p)], dtype=torch.int32))
        ins = [1 + (me + j) % 2 for j in range(p)]  # rows this rank sends to j
        outs = [1 + (j + me) % 2 for j in range(p)]  # rows j sends here
        o = torch.empty(sum(outs), 2, dtype=torch.int64)
        inp = torch.cat([torch.full((ins[j], 2), 10 * me + j, dtype=torch.int64) for j in range(p)])
        dist.all_to_all_single(o, inp, output_split_sizes=outs, input_split_sizes=ins)
        c.tensor("plain all_to_all_single uneven", o,
                 torch.cat([torch.full((outs[j], 2), 10 * j + me, dtype=torch.int64) for j in range(p)]))
        dist.barrier()
    finally:
        for n in names:
            setattr(cls, n, saved[n])
    for n in names:
        say(f"PYPATH rank={me} {n} {seen[n]}")

    # The library was used through the "oxccl" backend: its communicator exists and is open.
    fast = getattr(oxccl.torch, "_FAST", None) is not None
    say(f"FASTPATH rank={me} {fast}")
    if os.environ.get("OXCCL_TORCH_FAST") == "0":
        c.eq("OXCCL_TORCH_FAST=0 leaves the compiled fast path off", fast, False)
    elif os.environ.get("OXCCL_REQUIRE_ALL") == "1":
        # CI provides a C++ compiler and ninja: the fast path must have been built and used.
        c.eq("the compiled fast path is built (OXCCL_REQUIRE_ALL=1)", fast, True)
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    c.true("backend object", isinstance(be, oxccl.torch.OxcclBackend), f"{type(be)}")
    c.eq("backend communicator size", be.comm.size, p)
    for k in sorted(count):
        say(f"COUNT rank={me} {k} {count[k]}")
    dist.destroy_process_group()
    c.finish()


if __name__ == "__main__":
    main(run)

"""Asynchronous calls and futures, and subgroups, through torch.distributed's backend "oxccl".

    torchrun --nproc-per-node P async_groups.py

Async: `async_op=True` Works (wait, is_completed, get_future: its value is the list of
outputs, and `then` chains on it), point-to-point futures (completed on the backend's helper
thread), collect_all. Subgroups: `new_group(ranks=..., backend="oxccl")` over a subset, over
every rank and over one rank; members see their group rank and size, the others get
GroupMember.NON_GROUP_MEMBER; collectives inside each; two overlapping groups used
alternately.
"""

import torch
import torch.distributed as dist

import oxccl.torch  # noqa: F401
from common import Checks, main, probe
from tref import rand_bits


def work_result(what, w, out):
    """Work.result() (Gloo's and NCCL's: the output tensors) — known to be missing on the
    Python path: test_work_result."""
    try:
        res = w.result()
        probe("work_result", isinstance(res, list) and len(res) == 1 and res[0].data_ptr() == out.data_ptr(),
              f"{what}: result() = {res!r}")
    except Exception as e:  # noqa: BLE001
        probe("work_result", False, f"{what}: result() raised {type(e).__name__}: {e}")


def run():
    dist.init_process_group("oxccl")
    me, p = dist.get_rank(), dist.get_world_size()
    c = Checks()

    # ----------------------------------------------------------------- async + futures
    def vals(r, n=6, k=0):
        return torch.arange(n, dtype=torch.float32) * (r + 1) + k

    want_sum = sum(vals(r) for r in range(p))
    x = vals(me)
    w = dist.all_reduce(x, async_op=True)
    c.true("all_reduce async returns a Work", w is not None and hasattr(w, "wait"), repr(w))
    c.eq("all_reduce Work.wait()", w.wait(), True)
    probe("work_is_completed", w.is_completed() is True,
          f"all_reduce: is_completed() after wait() = {w.is_completed()!r}")
    work_result("all_reduce", w, x)
    c.tensor("all_reduce async result", x, want_sum)
    fut = w.get_future()
    v = fut.wait()
    c.true("all_reduce future value is a list of one tensor", isinstance(v, list) and len(v) == 1, repr(v))
    c.true("all_reduce future value is the call's tensor", v[0].data_ptr() == x.data_ptr())
    c.tensor("all_reduce future value", v[0], want_sum)
    chained = fut.then(lambda f: f.value()[0] * 2).then(lambda f: f.value() + 1).wait()
    c.tensor("all_reduce future.then.then", chained, want_sum * 2 + 1)
    c.true("future.done()", fut.done())

    # Several calls in flight, waited in reverse order.
    xs = [vals(me, k=k) for k in range(5)]
    works = [dist.all_reduce(t, async_op=True) for t in xs]
    for k in reversed(range(5)):
        works[k].wait()
        c.tensor(f"in-flight all_reduce #{k}", xs[k], sum(vals(r, k=k) for r in range(p)))

    # Every collective with async_op=True: outputs through the future.
    b = rand_bits(8, torch.float32, me, 1)
    w = dist.broadcast(b, src=p - 1, async_op=True)
    w.wait()
    probe("work_is_completed", w.is_completed() is True,
          f"broadcast: is_completed() after wait() = {w.is_completed()!r}")
    work_result("broadcast", w, b)
    v = w.get_future().wait()
    c.tensor("broadcast async future value", v[0], rand_bits(8, torch.float32, p - 1, 1))
    c.tensor("broadcast async tensor", b, rand_bits(8, torch.float32, p - 1, 1))
    o = torch.zeros(p * 4)
    w = dist.all_gather_into_tensor(o, vals(me, 4), async_op=True)
    w.wait()
    work_result("all_gather_into_tensor", w, o)
    v = w.get_future().wait()
    c.tensor("all_gather_into_tensor async", v[0], torch.cat([vals(r, 4) for r in range(p)]))
    c.true("all_gather_into_tensor future holds the output", v[0].data_ptr() == o.data_ptr())
    o = torch.zeros(3)
    w = dist.reduce_scatter_tensor(o, vals(me, 3 * p), async_op=True)
    v = w.get_future().then(lambda f: f.value()[0].clone()).wait()
    c.tensor("reduce_scatter_tensor async", v, sum(vals(r, 3 * p) for r in range(p))[me * 3:(me + 1) * 3])
    o = torch.zeros(2 * p)
    w = dist.all_to_all_single(o, vals(me, 2 * p), async_op=True)
    w.wait()
    c.tensor("all_to_all_single async", o, torch.cat([vals(r, 2 * p)[2 * me:2 * me + 2] for r in range(p)]))
    outs = [torch.zeros(5) for _ in range(p)]
    w = dist.all_gather(outs, vals(me, 5), async_op=True)
    w.get_future().wait()
    for r in range(p):
        c.tensor(f"all_gather async block {r}", outs[r], vals(r, 5))
    c.eq("barrier async wait", dist.barrier(async_op=True).wait(), True)

    # Point-to-point futures (pending until the helper thread completes them), then-chains
    # on them and collect_all over several, in issue order.
    nx, pv = (me + 1) % p, (me - 1) % p
    sends = [dist.isend(vals(me, 4, k), dst=nx) for k in range(3)]
    bufs = [torch.zeros(4) for _ in range(3)]
    recvs = [dist.irecv(bufs[k], src=pv) for k in range(3)]
    rf = [w.get_future() for w in recvs]
    doubled = rf[0].then(lambda f: f.value()[0] * 2)
    allf = torch.futures.collect_all([w.get_future() for w in sends] + rf).wait()
    c.eq("collect_all futures", len(allf), 6)
    for k in range(3):
        c.tensor(f"irecv #{k} future value", rf[k].value()[0], vals(pv, 4, k))
        c.tensor(f"irecv #{k} buffer", bufs[k], vals(pv, 4, k))
        probe("work_is_completed", recvs[k].is_completed() is True,
              f"irecv #{k}: is_completed() after its future completed = {recvs[k].is_completed()!r}")
        c.eq(f"isend #{k} wait", sends[k].wait(), True)
    c.tensor("irecv future.then", doubled.wait(), vals(pv, 4, 0) * 2)

    # batch_isend_irecv: one Work per op; their futures complete too.
    buf = torch.zeros(7)
    ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, vals(me, 7, 9), nx), dist.P2POp(dist.irecv, buf, pv)])
    for w_ in ws:
        w_.wait()
    c.tensor("batch_isend_irecv async", buf, vals(pv, 7, 9))

    # ----------------------------------------------------------------- subgroups
    if p >= 4:
        specs = {"A": [1, 3], "B": [0, 1, 2], "ALL": list(range(p)), "ONE": [2]}
    else:
        specs = {"A": [1], "B": [0, 1], "ALL": list(range(p)), "ONE": [0]}
    groups = {k: dist.new_group(ranks=rs, backend="oxccl") for k, rs in specs.items()}
    for k, rs in specs.items():
        g = groups[k]
        if me in rs:
            c.true(f"group {k}: a member gets a group", g is not dist.GroupMember.NON_GROUP_MEMBER and g is not None)
            c.eq(f"group {k}: get_rank", dist.get_rank(g), rs.index(me))
            c.eq(f"group {k}: get_world_size", dist.get_world_size(g), len(rs))
            c.eq(f"group {k}: backend", dist.get_backend(g), "oxccl")
            c.eq(f"group {k}: global ranks", dist.get_process_group_ranks(g), rs)
        else:
            c.true(f"group {k}: rank {me} (not a member) gets no group",
                   g is dist.GroupMember.NON_GROUP_MEMBER, repr(g))
            c.eq(f"group {k}: get_rank of a non-member", dist.get_rank(g), -1)

    def in_group(k, salt):
        rs, g = specs[k], groups[k]
        if me not in rs:
            return
        n = len(rs)
        t = vals(me, 5, salt)
        dist.all_reduce(t, group=g)
        c.tensor(f"group {k} all_reduce salt={salt}", t, sum(vals(r, 5, salt) for r in rs))
        t = vals(me, 5, salt)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g)
        c.tensor(f"group {k} all_reduce MAX salt={salt}", t, vals(max(rs), 5, salt))
        t = rand_bits(6, torch.bfloat16, me, salt)
        dist.broadcast(t, src=rs[-1], group=g)  # src: a global rank
        c.tensor(f"group {k} broadcast src={rs[-1]}", t, rand_bits(6, torch.bfloat16, rs[-1], salt))
        t = vals(me, 5, salt)
        dist.reduce(t, dst=rs[0], group=g)
        if me == rs[0]:
            c.tensor(f"group {k} reduce dst={rs[0]}", t, sum(vals(r, 5, salt) for r in rs))
        o = torch.zeros(n * 3)
        dist.all_gather_into_tensor(o, vals(me, 3, salt), group=g)
        c.tensor(f"group {k} all_gather_into_tensor", o, torch.cat([vals(r, 3, salt) for r in rs]))
        o = torch.zeros(2)
        dist.reduce_scatter_tensor(o, vals(me, 2 * n, salt), group=g)
        i = rs.index(me)
        c.tensor(f"group {k} reduce_scatter_tensor", o, sum(vals(r, 2 * n, salt) for r in rs)[2 * i:2 * i + 2])
        o = torch.zeros(n)
        dist.all_to_all_single(o, vals(me, n, salt), group=g)
        c.tensor(f"group {k} all_to_all_single", o, torch.tensor([float(vals(r, n, salt)[i]) for r in rs]))
        gl = [torch.zeros(2) for _ in rs] if me == rs[-1] else None
        dist.gather(vals(me, 2, salt), gather_list=gl, dst=rs[-1], group=g)
        if gl is not None:
            for j, r in enumerate(rs):
                c.tensor(f"group {k} gather dst={rs[-1]} block {j}", gl[j], vals(r, 2, salt))
        if n >= 2 and me in rs[:2]:
            peer = rs[1] if me == rs[0] else rs[0]
            buf = torch.zeros(4)
            ws = [dist.isend(vals(me, 4, salt), dst=peer, group=g), dist.irecv(buf, src=peer, group=g)]
            for w_ in ws:
                w_.wait()
            c.tensor(f"group {k} isend/irecv with global rank {peer}", buf, vals(peer, 4, salt))
        w_ = dist.all_reduce(t := vals(me, 3, salt), group=g, async_op=True)
        c.tensor(f"group {k} async future", w_.get_future().wait()[0], sum(vals(r, 3, salt) for r in rs))
        del t

    for k in specs:
        in_group(k, 0)
    # Two overlapping groups (and the default group) used alternately.
    for it in range(1, 4):
        in_group("A", it)
        in_group("B", it)
        t = vals(me, 4, it)
        dist.all_reduce(t)
        c.tensor(f"default group between subgroups, round {it}", t, sum(vals(r, 4, it) for r in range(p)))
    dist.barrier()
    dist.destroy_process_group()
    c.finish()


if __name__ == "__main__":
    main(run)

"""DDP and FSDP2 training over oxccl against Gloo and against an exact single-process
reference, from the same seed and the same per-rank data.

    torchrun --nproc-per-node P ddp.py          (P = 4: run with OXCCL_DETERMINISTIC=1)

The default group is Gloo; a second group over the same ranks is `new_group(backend="oxccl")`.
Each variant trains the same model STEPS steps (SGD with momentum), each rank on its own
data:
- DDP with no hook, with default_hooks.allreduce_hook and with default_hooks.fp16_compress_hook
  (comm hooks chain on the Work's future), over Gloo and over oxccl;
- FSDP2 (fully_shard on a CPU DeviceMesh of the group): over oxccl (reduce-scatter with AVG),
  and over Gloo (which has no AVG: set_force_sum_reduction_for_comms(True), SUM then a
  division).
The reference: a plain copy of the model on every rank computes every rank's gradients
itself (the same computation each rank does) and combines them as the reduction does with
OXCCL_DETERMINISTIC=1 (and, at 2 ranks, always): a left fold in rank order,
((g0/P + g1/P) + g2/P) + g3/P in float32 (division by a power of two is exact, so this equals
the fold of the gradients divided by P, as AVG computes); for fp16_compress_hook the fold of
(g.half()/P) in float16, each addition rounded (oxccl widens to float32 and rounds each
addition, which for two float16 values is the correctly rounded float16 sum, as torch's).

Checks (bitwise): oxccl == reference for every variant; at 2 ranks also oxccl == Gloo.
Prints `PARITY rank=0 <variant> bitwise=<bool> maxdiff=<x>`: oxccl against Gloo (ddp/*,
fsdp2), and oxccl and Gloo against the reference.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import oxccl.torch  # noqa: F401
from common import Checks, main, say

STEPS = 6
LR, MOMENTUM = 0.05, 0.9


def make_model():
    torch.manual_seed(1234)
    # 30 and 6 output features: FSDP2 pads the uneven shards at 4 ranks.
    return nn.Sequential(nn.Linear(16, 30), nn.ReLU(), nn.Linear(30, 64), nn.Tanh(), nn.Linear(64, 6))


def data(rank, step):
    g = torch.Generator().manual_seed(10_000 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 6, generator=g)


def fold(ts):
    acc = ts[0].clone()
    for t in ts[1:]:
        acc = acc + t
    return acc


def reference(p, hook):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        per_rank = []
        for r in range(p):
            model.zero_grad(set_to_none=True)
            x, y = data(r, step)
            F.mse_loss(model(x), y).backward()
            per_rank.append([q.grad.detach().clone() for q in model.parameters()])
        for i, q in enumerate(model.parameters()):
            gs = [g[i] for g in per_rank]
            if hook == "fp16_compress_hook":
                q.grad = fold([g.to(torch.float16).div_(p) for g in gs]).to(torch.float32)
            else:
                q.grad = fold([g * (1.0 / p) for g in gs])
        opt.step()
    return [q.detach().clone() for q in model.parameters()]


def train_ddp(group, hook, me):
    model = DDP(make_model(), process_group=group, bucket_cap_mb=0.004)  # ~4 KB: several buckets
    if hook is not None:
        model.register_comm_hook(group, getattr(default_hooks, hook))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        x, y = data(me, step)
        F.mse_loss(model(x), y).backward()
        opt.step()
    return [q.detach().clone() for q in model.module.parameters()]


def train_fsdp2(group, me, force_sum):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, "cpu")
    model = make_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if force_sum:
        model.set_force_sum_reduction_for_comms(True)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        x, y = data(me, step)
        F.mse_loss(model(x), y).backward()
        opt.step()
    return [q.full_tensor().detach().clone() for q in model.parameters()]


def run():
    dist.init_process_group("gloo")
    me, p = dist.get_rank(), dist.get_world_size()
    og = dist.new_group(backend="oxccl")
    gloo = dist.group.WORLD
    det = os.environ.get("OXCCL_DETERMINISTIC") == "1"
    exact_vs_gloo = p == 2  # a sum of two is the same in any order
    c = Checks()
    names = [n for n, _ in make_model().named_parameters()]
    init = [q.detach().clone() for q in make_model().parameters()]

    def compare(what, got, want, record=None):
        diff = max(float((a.double() - b.double()).abs().max()) for a, b in zip(got, want))
        bitwise = all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(got, want))
        if record is not None and me == 0:
            say(f"PARITY rank=0 {record} bitwise={bitwise} maxdiff={diff:.3e}")
        return bitwise, diff

    def check_equal(what, got, want):
        for n, a, b in zip(names, got, want):
            c.tensor(f"{what}: parameter {n}", a, b)

    for hook in (None, "allreduce_hook", "fp16_compress_hook"):
        label = hook or "no hook"
        ref = reference(p, hook)
        ox = train_ddp(og, hook, me)
        gl = train_ddp(gloo, hook, me)
        c.true(f"DDP {label}: training changed the parameters", not all(torch.equal(a, b) for a, b in zip(ox, init)))
        tag = label.replace(" ", "_")
        if p == 2 or det:
            check_equal(f"DDP {label} over oxccl vs the rank-order reference", ox, ref)
        compare(label, ox, ref, record=f"ddp-oxccl-vs-reference/{tag}")
        _, diff = compare(label, ox, gl, record=f"ddp/{tag}")
        if exact_vs_gloo:
            check_equal(f"DDP {label} over oxccl vs over Gloo", ox, gl)
        else:  # another summation order: equal to within the rounding of a few steps
            tol = 1e-3 if hook == "fp16_compress_hook" else 1e-6
            c.true(f"DDP {label}: oxccl and Gloo within rounding ({tol})", diff < tol, f"max difference {diff:.3e}")
        compare(label, gl, ref, record=f"ddp-gloo-vs-reference/{tag}")
        # Every rank holds the same parameters.
        flat = torch.cat([q.reshape(-1) for q in ox])
        allp = [torch.empty_like(flat) for _ in range(p)]
        dist.all_gather(allp, flat, group=og)
        for r in range(p):
            c.tensor(f"DDP {label}: rank {r}'s parameters equal rank {me}'s", allp[r], flat)

    ref = reference(p, None)
    fo = train_fsdp2(og, me, force_sum=False)
    fg = train_fsdp2(gloo, me, force_sum=True)
    c.true("FSDP2: training changed the parameters", not all(torch.equal(a, b) for a, b in zip(fo, init)))
    if p == 2 or det:
        check_equal("FSDP2 over oxccl vs the rank-order reference", fo, ref)
    compare("fsdp2", fo, ref, record="fsdp2-oxccl-vs-reference")
    _, diff = compare("fsdp2", fo, fg, record="fsdp2")
    if exact_vs_gloo:
        check_equal("FSDP2 over oxccl vs over Gloo", fo, fg)
    else:
        c.true("FSDP2: oxccl and Gloo within rounding (1e-6)", diff < 1e-6, f"max difference {diff:.3e}")
    compare("fsdp2", fg, ref, record="fsdp2-gloo-vs-reference")
    dist.destroy_process_group()
    c.finish()


if __name__ == "__main__":
    main(run)

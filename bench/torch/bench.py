"""Gloo and oxccl side by side under torchrun, on CPU tensors: the collectives torch programs
call (all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast,
all_to_all_single) from 8 B to 256 MiB, and a DDP training step on an MLP of about 25 M
parameters.

    torchrun --nproc-per-node 2 bench/torch/bench.py --out DIR

One process group of each backend in one run (the default group is Gloo, the second is a
`new_group(backend="oxccl")` over the same ranks); every size is timed alternately, Gloo then
oxccl, for --rounds rounds, after 5 untimed calls of each (nccl-tests' default warm-up), and
the median round is reported. Sizes follow nccl-tests: the largest buffer of the call
(all-gather's output, reduce-scatter's input). Rank 0 writes one JSON file per backend and
collective in nccl-tests' `-J` layout (`oxccl-perf --plot` reads them) and ddp.json;
bench/torch/render.py makes the tables and plots.
"""

import argparse
import json
import os
import shlex
import statistics
import sys
import time

import torch
import torch.distributed as dist

import oxccl.torch  # noqa: F401  registers the backend "oxccl"

# Untimed calls per size and backend before timing: nccl-tests' default (-w 5).
WARMUP = 5

COLLS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "all_to_all_single")


def busbw_factor(coll, p):
    if coll == "all_reduce":
        return 2 * (p - 1) / p
    if coll == "broadcast":
        return 1.0
    return (p - 1) / p


def make(coll, size, p):
    """The call's tensors for `size` bytes of float32 (the largest buffer)."""
    n = max(size // 4, p) // p * p
    if coll == "all_reduce":
        x = torch.ones(n)
        return lambda g: dist.all_reduce(x, group=g)
    if coll == "broadcast":
        x = torch.ones(n)
        return lambda g: dist.broadcast(x, src=0, group=g)
    if coll == "all_gather_into_tensor":
        out, inp = torch.empty(n), torch.ones(n // p)
        return lambda g: dist.all_gather_into_tensor(out, inp, group=g)
    if coll == "reduce_scatter_tensor":
        out, inp = torch.empty(n // p), torch.ones(n)
        return lambda g: dist.reduce_scatter_tensor(out, inp, group=g)
    if coll == "all_to_all_single":
        out, inp = torch.empty(n), torch.ones(n)
        return lambda g: dist.all_to_all_single(out, inp, group=g)
    raise ValueError(coll)


def iters_for(size):
    """Enough calls for a stable time, few at the large sizes (Gloo takes ~1 s at 256 MiB)."""
    return max(2, min(2000, (64 << 20) // max(size, 1) // 4 + 2))


def time_calls(fn, g, n):
    dist.barrier(group=g)
    t0 = time.perf_counter()
    for _ in range(n):
        fn(g)
    # The slowest rank's time: every rank's elapsed time, maximum.
    dt = torch.tensor([(time.perf_counter() - t0) / n])
    dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=g)
    return dt.item()


def sizes(lo, hi):
    s, out = lo, []
    while s <= hi:
        out.append(s)
        s *= 4
    if out[-1] != hi:
        out.append(hi)
    return out


class MLP(torch.nn.Module):
    def __init__(self, width=4096, io=1024):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(io, width), torch.nn.ReLU(),
            torch.nn.Linear(width, width), torch.nn.ReLU(),
            torch.nn.Linear(width, io),
        )

    def forward(self, x):
        return self.net(x)


def ddp_bench(groups, steps, batch, bucket_view=False):
    """Median step times: no DDP (local), then DDP over each backend, alternating.
    `bucket_view`: DDP's gradient_as_bucket_view (gradients live in the buckets, so DDP copies
    them neither in nor out), for every backend alike."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    base = MLP()
    nparams = sum(p.numel() for p in base.parameters())
    models = {"local": base}
    for name, g in groups.items():
        m = MLP()
        m.load_state_dict(base.state_dict())
        models[name] = DDP(m, process_group=g, gradient_as_bucket_view=bucket_view)
    # DDP's own work, without communication: a comm hook that hands the bucket back as it is
    # (DDP still fills the buckets, divides by the world size and copies the results out).
    m = MLP()
    m.load_state_dict(base.state_dict())
    models["no_comm"] = DDP(m, process_group=groups["oxccl"], gradient_as_bucket_view=bucket_view)

    def no_comm(_state, bucket):
        f = torch.futures.Future()
        f.set_result(bucket.buffer())
        return f

    models["no_comm"].register_comm_hook(None, no_comm)
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in models.items()}
    x = torch.randn(batch, 1024)
    y = torch.randn(batch, 1024)
    times = {k: [] for k in models}
    for step in range(steps + 2):
        for k, m in models.items():
            dist.barrier(group=groups["gloo"])
            t0 = time.perf_counter()
            opts[k].zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opts[k].step()
            dt = time.perf_counter() - t0
            if step >= 2:
                times[k].append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    return nparams, med


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the JSON results")
    ap.add_argument("--min-bytes", type=int, default=8)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--colls", default=",".join(COLLS))
    ap.add_argument("--ddp-steps", type=int, default=10)
    ap.add_argument("--ddp-batch", type=int, default=32)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": dist.group.WORLD, "oxccl": dist.new_group(backend="oxccl")}
    os.makedirs(a.out, exist_ok=True)
    for coll in [c for c in a.colls.split(",") if c]:
        res = {b: [] for b in groups}
        for size in sizes(a.min_bytes, a.max_bytes):
            fn = make(coll, size, p)
            n = iters_for(size)
            for g in groups.values():
                for _ in range(WARMUP):
                    fn(g)  # warm-up (connections, first touch, adaptive choices)
            t = {b: [] for b in groups}
            for _ in range(a.rounds):
                for b, g in groups.items():
                    t[b].append(time_calls(fn, g, n))
            for b in groups:
                us = statistics.median(t[b]) * 1e6
                bw = size / (us * 1e3) * busbw_factor(coll, p)
                res[b].append({"size": size, "type": "float", "redop": "sum", "root": 0,
                               "out_of_place": {"time": us, "bus_bw": bw}})
            if rank == 0:
                r = res["oxccl"][-1]["out_of_place"]["bus_bw"] / max(res["gloo"][-1]["out_of_place"]["bus_bw"], 1e-12)
                print(f"P={p} {coll:24s} {size:>10d} B  gloo {res['gloo'][-1]['out_of_place']['time']:10.1f} us"
                      f"  oxccl {res['oxccl'][-1]['out_of_place']['time']:10.1f} us  ratio {r:6.1f}x", flush=True)
            del fn
        if rank == 0:
            for b in groups:
                with open(os.path.join(a.out, f"{b}-{coll}-P{p}.json"), "w") as f:
                    json.dump({"label": f"{b} P={p}", "results": res[b]}, f)
    if a.ddp_steps > 0:
        # DDP as constructed by default, then with gradient_as_bucket_view=True.
        for view, suffix in ((False, ""), (True, "-bucket-view")):
            nparams, med = ddp_bench(groups, a.ddp_steps, a.ddp_batch, bucket_view=view)
            if rank == 0:
                comm = {b: med[b] - med["local"] for b in groups}
                print(f"P={p} DDP step (gradient_as_bucket_view={view}), MLP of {nparams/1e6:.1f} M parameters, "
                      f"batch {a.ddp_batch}: " + ", ".join(f"{k} {v*1e3:.1f} ms" for k, v in med.items())
                      + f"; communication gloo {comm['gloo']*1e3:.1f} ms, oxccl {comm['oxccl']*1e3:.1f} ms", flush=True)
                with open(os.path.join(a.out, f"ddp-P{p}{suffix}.json"), "w") as f:
                    json.dump({"params": nparams, "batch": a.ddp_batch, "steps": a.ddp_steps,
                               "bucket_view": view, "step_s": med, "comm_s": comm,
                               "command": f"torchrun --nproc-per-node {p} bench/torch/bench.py "
                                          + shlex.join(sys.argv[1:])}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

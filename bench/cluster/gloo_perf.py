"""torch.distributed's Gloo backend with oxccl-perf's sizes, columns and JSON (nccl-tests' -J
layout), for the emulated cluster (one torchrun per host: `oxccl-cluster --peer gloo`).

    torchrun ... gloo_perf.py all_reduce -b 8 -e 64M -f 2 -n 20 -w 5 -J out.json -L gloo

Per size: WARMUP calls, a barrier, ITERS timed calls on CPU float32 tensors; the per-call time
is averaged over ranks (as bench/peers/mpi_perf.c). Sizes are nccl-tests': the largest buffer
of the call (all-gather's output, reduce-scatter's input); sizes the call cannot have exactly
(not a multiple of 4 bytes, or of 4 bytes × ranks where the buffer is split into equal shares)
are skipped. After the timed calls one more call on fresh data is checked exactly; #wrong
counts the elements that differ.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def busbw_factor(coll, p):
    return {"all_reduce": 2 * (p - 1) / p, "broadcast": 1.0}.get(coll, (p - 1) / p)


def make(coll, size, p, rank):
    """(call, check): the call on tensors of `size` bytes, and a function that runs it once on
    fresh data and returns the number of wrong elements."""
    n = size // 4
    if coll == "all_reduce":
        x = torch.ones(n)

        def check():
            y = torch.full((n,), float(rank + 1))
            dist.all_reduce(y)
            return int((y != p * (p + 1) / 2).sum())
        return (lambda: dist.all_reduce(x)), check
    if coll == "broadcast":
        x = torch.ones(n)

        def check():
            y = torch.full((n,), float(rank + 7))
            dist.broadcast(y, src=0)
            return int((y != 7).sum())
        return (lambda: dist.broadcast(x, src=0)), check
    if coll == "all_gather":
        out, inp = torch.empty(n), torch.ones(n // p)

        def check():
            o = torch.empty(n)
            dist.all_gather_into_tensor(o, torch.full((n // p,), float(rank)))
            want = torch.arange(p, dtype=torch.float32).repeat_interleave(n // p)
            return int((o != want).sum())
        return (lambda: dist.all_gather_into_tensor(out, inp)), check
    if coll == "reduce_scatter":
        out, inp = torch.empty(n // p), torch.ones(n)

        def check():
            o = torch.empty(n // p)
            dist.reduce_scatter_tensor(o, torch.full((n,), float(rank + 1)))
            return int((o != p * (p + 1) / 2).sum())
        return (lambda: dist.reduce_scatter_tensor(out, inp)), check
    if coll == "alltoall":
        out, inp = torch.empty(n), torch.ones(n)

        def check():
            o = torch.empty(n)
            dist.all_to_all_single(o, torch.full((n,), float(rank)))
            want = torch.arange(p, dtype=torch.float32).repeat_interleave(n // p)
            return int((o != want).sum())
        return (lambda: dist.all_to_all_single(out, inp)), check
    raise SystemExit(f"gloo_perf.py: unknown collective {coll!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("coll", choices=["all_reduce", "broadcast", "all_gather", "reduce_scatter", "alltoall"])
    ap.add_argument("-b", default="8")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-f", type=int, default=2)
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("-w", type=int, default=5)
    ap.add_argument("-J", default=None)
    ap.add_argument("-L", default="gloo")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"# {a.L} {a.coll}_perf, {p} ranks, float sum, out-of-place, {a.n} iterations")
        print("# %10s  %12s  %8s  %6s  %6s  %9s  %6s  %6s  %6s" % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"))
    results, wrong_total = [], 0
    size = parse_size(a.b)
    while size <= parse_size(a.e):
        # Sizes the call cannot have exactly are skipped: under 4 bytes, or for the collectives
        # that split the buffer into equal shares, not a multiple of 4 bytes × ranks.
        per_rank = a.coll in ("all_gather", "reduce_scatter", "alltoall")
        if size < 4 or size % 4 or (per_rank and size % (4 * p)):
            size = size * a.f if a.f > 1 else size + (1 << 20)
            continue
        call, check = make(a.coll, size, p, rank)
        for _ in range(a.w):
            call()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.n):
            call()
        dt = torch.tensor([(time.perf_counter() - t0) / a.n], dtype=torch.float64)
        dist.all_reduce(dt)
        wrong = torch.tensor([check()], dtype=torch.int64)
        dist.all_reduce(wrong)
        us = dt.item() / p * 1e6
        algbw = size / (us * 1e3)
        busbw = algbw * busbw_factor(a.coll, p)
        wrong_total += int(wrong.item())
        if rank == 0:
            print("  %10d  %12d  %8s  %6s  %6d  %9.1f  %6.2f  %6.2f  %6d" % (size, size // 4, "float", "sum", 0, us, algbw, busbw, wrong.item()), flush=True)
            results.append({"size": size, "count": size // 4, "type": "float", "redop": "sum", "root": 0,
                            "out_of_place": {"time": us, "alg_bw": algbw, "bus_bw": busbw, "wrong": int(wrong.item())}})
        size = size * a.f if a.f > 1 else size + (1 << 20)
    if rank == 0:
        print(f"# Out of bounds values : {wrong_total} {'OK' if wrong_total == 0 else 'FAILED'}")
        if a.J:
            with open(a.J, "w") as f:
                json.dump({"label": a.L, "library": a.L, "benchmark": f"{a.coll}_perf", "nranks": p,
                           "hosts": int(os.environ.get("GROUP_WORLD_SIZE", "0")) or None, "results": results}, f)
    dist.destroy_process_group()
    sys.exit(1 if wrong_total else 0)


if __name__ == "__main__":
    main()

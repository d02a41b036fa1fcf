"""8-byte all_reduce through torch.distributed on the backend "oxccl" (CPU tensor of two
floats): the median of --rounds rounds of --iters calls, each round's time being the slowest
rank's. Prints one line `torch_8B_us <median>` (and the rounds) on rank 0.

    torchrun --nproc-per-node 2 bench/torch/latency.py
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import oxccl.torch  # noqa: F401


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", default="oxccl")
    a = ap.parse_args()
    dist.init_process_group(a.backend)
    t = torch.zeros(2)
    for _ in range(1000):
        dist.all_reduce(t)
    rounds = []
    for _ in range(a.rounds):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            dist.all_reduce(t)
        dt = torch.tensor([(time.perf_counter() - t0) / a.iters * 1e6], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        rounds.append(dt.item())
    if dist.get_rank() == 0:
        fast = getattr(oxccl.torch, "_FAST", None) is not None
        print(f"torch_8B_us {statistics.median(rounds):.3f} rounds {' '.join(f'{x:.3f}' for x in rounds)} "
              f"backend {a.backend} fast_path {fast}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

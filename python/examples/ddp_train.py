"""Trains a small MLP with DistributedDataParallel on the torch.distributed backend "oxccl"
(CPU tensors), and checks that every rank ends with the same parameters.

    torchrun --nproc-per-node 2 python/examples/ddp_train.py
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import oxccl.torch  # noqa: F401  registers the backend "oxccl"


def main():
    ap = argparse.ArgumentParser(description="DDP on the oxccl backend")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--backend", default="oxccl")
    a = ap.parse_args()
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1 + rank)  # each rank its own data
    w_true = torch.linspace(-1, 1, 32)
    for step in range(a.steps):
        x = torch.randn(64, 32, generator=g)
        y = (x @ w_true).unsqueeze(1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % 5 == 0 or step == a.steps - 1):
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)
    # Every rank must hold the same parameters after training.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    mine = flat.clone()
    dist.broadcast(flat, 0)
    if not torch.equal(flat, mine):
        raise SystemExit(f"rank {rank}: parameters differ from rank 0's after training")
    if rank == 0:
        print(f"{world} ranks trained {a.steps} steps on backend {dist.get_backend()}: parameters identical on every rank")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

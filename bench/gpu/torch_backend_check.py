"""The Python package on CUDA tensors: oxccl.Communicator's calls and the torch.distributed
backend "oxccl", processes of one host on one GPU, every result exact.

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/gpu/torch_backend_check.py

Values are small integers (every reduction order gives the same answer in every type). Prints
one line per check on rank 0; exits 1 if any check failed on any rank.
"""

import sys
import time

import torch
import torch.distributed as dist

import oxccl
import oxccl.torch  # noqa: F401

TYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.uint8]
failed = []


def check(name, got, want):
    ok = torch.equal(got.cpu(), want.cpu())
    if not ok:
        failed.append(name)
        print(f"rank {dist.get_rank()}: FAIL {name}: got {got.cpu().tolist()[:8]} want {want.cpu().tolist()[:8]}", flush=True)
    elif dist.get_rank() == 0:
        print(f"ok {name}", flush=True)


def main():
    dist.init_process_group("oxccl")
    r, p = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    n = 1000
    for t in TYPES:
        x = torch.full((n,), r + 1, dtype=t, device=dev)
        dist.all_reduce(x)
        check(f"all_reduce {t}", x, torch.full((n,), p * (p + 1) // 2, dtype=t))
        out = torch.empty(n * p, dtype=t, device=dev)
        dist.all_gather_into_tensor(out, torch.full((n,), r, dtype=t, device=dev))
        check(f"all_gather_into_tensor {t}", out, torch.arange(p).repeat_interleave(n).to(t))
        inp = torch.arange(p, dtype=t, device=dev).repeat_interleave(n)
        o = torch.empty(n, dtype=t, device=dev)
        dist.reduce_scatter_tensor(o, inp)
        check(f"reduce_scatter_tensor {t}", o, torch.full((n,), r * p, dtype=t))
        b = torch.full((n,), r, dtype=t, device=dev)
        dist.broadcast(b, p - 1)
        check(f"broadcast {t}", b, torch.full((n,), p - 1, dtype=t))
        a = torch.full((p * 3,), r, dtype=t, device=dev)
        ao = torch.empty(p * 3, dtype=t, device=dev)
        dist.all_to_all_single(ao, a)
        check(f"all_to_all_single {t}", ao, torch.arange(p).repeat_interleave(3).to(t))
    # Uneven all_to_all_single, send/recv, batch_isend_irecv.
    ins = [i + 1 for i in range(p)]  # rank r sends i+1 rows to rank i
    a = torch.full((sum(ins),), float(r), device=dev)
    outs = [r + 1] * p
    ao = torch.empty(sum(outs), device=dev)
    dist.all_to_all_single(ao, a, outs, ins)
    check("all_to_all_single uneven", ao, torch.cat([torch.full((r + 1,), float(i)) for i in range(p)]))
    nxt, prv = (r + 1) % p, (r - 1) % p
    rb = torch.empty(n, device=dev)
    sb = torch.full((n,), float(r), device=dev)
    if oxccl.torch._LEGACY:
        # torch before 2.15 sends a batch's calls one by one (no coalescing for a Python
        # group), and the device engine pairs a peer's point-to-point calls in issue order:
        # even ranks send first, odd ranks receive first (NCCL-safe ordering without a group).
        if r % 2 == 0:
            dist.send(sb, nxt)
            dist.recv(rb, prv)
        else:
            dist.recv(rb, prv)
            dist.send(sb, nxt)
        check("send/recv ring (ordered)", rb, torch.full((n,), float(prv)))
    else:
        ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, sb, nxt), dist.P2POp(dist.irecv, rb, prv)])
        for w in ws:
            w.wait()
        check("batch_isend_irecv", rb, torch.full((n,), float(prv)))
    # oxccl.Communicator directly, on torch's current stream.
    c = oxccl.Communicator.from_store(dist.distributed_c10d._get_default_store(), r, p, key="direct")
    x = torch.full((n,), float(r + 1), device=dev)
    y = torch.empty(n, device=dev)
    c.all_reduce(x, y, "max")
    check("Communicator.all_reduce max (out of place)", y, torch.full((n,), float(p)))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        z = torch.full((n,), float(r), device=dev)
        c.all_reduce(z)
    s.synchronize()
    check("Communicator.all_reduce on a side stream", z, torch.full((n,), float(p * (p - 1) // 2)))
    # DDP on CUDA tensors: every rank ends with the same parameters.
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    m = DDP(torch.nn.Linear(64, 8).to(dev))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(5):
        opt.zero_grad()
        m(torch.randn(16, 64, device=dev) + r).sum().backward()
        opt.step()
    flat = torch.cat([q.detach().reshape(-1) for q in m.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    check("DDP on CUDA: parameters equal on every rank", flat, ref)
    # 8-byte all_reduce through torch.distributed on a CUDA tensor (time to return).
    t8 = torch.zeros(2, device=dev)
    for _ in range(200):
        dist.all_reduce(t8)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        dist.all_reduce(t8)
    torch.cuda.synchronize()
    if r == 0:
        print(f"8 B all_reduce on CUDA through torch.distributed: {(time.perf_counter() - t0) / 2000 * 1e6:.1f} us per call", flush=True)
    c.close()
    bad = torch.tensor([len(failed)])
    dist.all_reduce(bad)
    dist.destroy_process_group()
    if r == 0:
        print("ALL CUDA CHECKS PASSED" if bad.item() == 0 else f"{bad.item()} CHECKS FAILED")
    sys.exit(1 if bad.item() else 0)


if __name__ == "__main__":
    main()

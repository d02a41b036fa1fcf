"""PyTorch, unchanged, over whichever libnccl.so.2 the loader gives it.

    python3 bench/gpu/torch_check.py [WORLD] [--timing | --graph | --two-hosts]

Starts WORLD processes (default 4) on GPU 0 with backend "nccl" and checks every collective
PyTorch offers against exact references: values are small integers, so every reduction order
gives the same answer in every type. Prints one line per check, then which libnccl each process
had mapped; exits 1 if any check failed. Run it with LD_PRELOAD=.../libnccl.so.2 to test oxccl.
With --timing it only times all-reduce (rank 0 prints, per size, how long a call takes to
return and how long an op takes to complete on the stream), checking the last result.
"""

import datetime
import os
import sys

import torch
import torch.cuda.nccl
import torch.distributed as dist
import torch.multiprocessing as mp

TYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.uint8]


def mapped_nccl():
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f if "libnccl" in line}
    return sorted(libs)


def worker(rank, world, port, failures, timing_only):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if TWO_HOSTS:
        # Two hosts as oxccl sees them (ranks 0-1 and 2-3): between them TCP over loopback,
        # and device buffers staged through host memory by the proxy, as across real hosts.
        os.environ["OXCCL_HOST_ID"] = f"torch-check-host-{rank * 2 // world}"
    # One GPU per rank where there are enough (issue 9's machines), else shared in turn (on
    # the one lent H200 every rank is on GPU 0).
    gpu = rank % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    dev = torch.device("cuda", gpu)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    bad = []

    def check(name, got, want):
        ok = torch.equal(got.cpu(), want.cpu())
        if not ok:
            diff = (got.cpu().double() - want.cpu().double()).abs()
            bad.append(f"{name}: rank {rank}: {int((diff != 0).sum())} of {want.numel()} wrong")
        return ok

    def base(n, r, dt):
        # Small non-negative integers: exact in every type, sums of 4 stay below 256.
        return ((torch.arange(n, device=dev) % 13) + r + 1).to(dt)

    if timing_only:
        timing(rank, world, dev, check)
        finish(rank, bad, failures)
        return
    if GRAPH:
        graph(rank, world, dev, check, bad, failures)
        return

    # Chained on the stream, no host sync between: each all-reduce reads what the kernel
    # before it wrote, and the kernel after it reads its result (sum of ones is world; minus
    # world - 1 is one again).
    x = torch.ones(4099, device=dev)
    for _ in range(50):
        dist.all_reduce(x)
        x.sub_(world - 1)
    check("50 chained all_reduce + kernel, no sync", x, torch.ones(4099, device=dev))

    n = 4099  # not a multiple of anything convenient
    for dt in TYPES:
        # AllReduce: sum, max, min, product (out of place on a clone, in place on the tensor).
        x = base(n, rank, dt)
        dist.all_reduce(x)
        check(f"all_reduce sum {dt}", x, sum(base(n, r, torch.int64) for r in range(world)).to(dt))
        x = base(n, rank, dt)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        check(f"all_reduce max {dt}", x, base(n, world - 1, dt))
        x = base(n, rank, dt)
        dist.all_reduce(x, op=dist.ReduceOp.MIN)
        check(f"all_reduce min {dt}", x, base(n, 0, dt))
        x = torch.full((n,), 1 + (rank % 2), device=dev).to(dt)
        dist.all_reduce(x, op=dist.ReduceOp.PRODUCT)
        check(f"all_reduce prod {dt}", x, torch.full((n,), 2 ** (world // 2), device=dev).to(dt))
        if dt.is_floating_point:
            x = (base(n, rank, torch.int64) * world).to(dt)
            dist.all_reduce(x, op=dist.ReduceOp.AVG)
            check(f"all_reduce avg {dt}", x, sum(base(n, r, torch.int64) for r in range(world)).to(dt))

        # Broadcast from the last rank.
        root = world - 1
        x = base(n, rank, dt)
        dist.broadcast(x, src=root)
        check(f"broadcast {dt}", x, base(n, root, dt))

        # Reduce to rank 1.
        x = base(n, rank, dt)
        dist.reduce(x, dst=1 % world)
        if rank == 1 % world:
            check(f"reduce {dt}", x, sum(base(n, r, torch.int64) for r in range(world)).to(dt))

        # AllGather: into one tensor, and into a list.
        out = torch.empty(world * n, device=dev, dtype=dt)
        dist.all_gather_into_tensor(out, base(n, rank, dt))
        want = torch.cat([base(n, r, dt) for r in range(world)])
        check(f"all_gather_into_tensor {dt}", out, want)
        outs = [torch.empty(n, device=dev, dtype=dt) for _ in range(world)]
        dist.all_gather(outs, base(n, rank, dt))
        check(f"all_gather list {dt}", torch.cat(outs), want)

        # ReduceScatter.
        inp = torch.cat([base(n, rank + 10 * b, torch.int64) for b in range(world)]).to(dt) if dt != torch.uint8 else \
            torch.cat([base(n, rank + b, torch.int64) for b in range(world)]).to(dt)
        out = torch.empty(n, device=dev, dtype=dt)
        dist.reduce_scatter_tensor(out, inp)
        step = 10 if dt != torch.uint8 else 1
        want = sum(base(n, r + step * rank, torch.int64) for r in range(world)).to(dt)
        check(f"reduce_scatter_tensor {dt}", out, want)

        # AllToAll: equal splits, then unequal ones (PyTorch sends those as grouped send/recv).
        inp = torch.cat([base(n, 7 * rank + b, torch.int64) for b in range(world)]).to(dt)
        out = torch.empty(world * n, device=dev, dtype=dt)
        dist.all_to_all_single(out, inp)
        want = torch.cat([base(n, 7 * r + rank, torch.int64) for r in range(world)]).to(dt)
        check(f"all_to_all_single {dt}", out, want)
        sizes = [r + 1 for r in range(world)]  # rank r gets r+1 elements from each peer
        send_splits = [sizes[p] for p in range(world)]
        recv_splits = [sizes[rank]] * world
        inp = torch.cat([base(sizes[p], rank * 3 + p, torch.int64) for p in range(world)]).to(dt)
        out = torch.empty(sum(recv_splits), device=dev, dtype=dt)
        dist.all_to_all_single(out, inp, recv_splits, send_splits)
        want = torch.cat([base(sizes[rank], r * 3 + rank, torch.int64) for r in range(world)]).to(dt)
        check(f"all_to_all_single uneven {dt}", out, want)

        # Send/recv: a ring of batched isend/irecv, then a blocking pair.
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        got = torch.empty(n, device=dev, dtype=dt)
        ops = [dist.P2POp(dist.isend, base(n, rank, dt), nxt), dist.P2POp(dist.irecv, got, prv)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        check(f"batch_isend_irecv ring {dt}", got, base(n, prv, dt))
        if world >= 2:
            if rank == 0:
                dist.send(base(n, 42 % 200, dt), dst=1)
            elif rank == 1:
                got = torch.empty(n, device=dev, dtype=dt)
                dist.recv(got, src=0)
                check(f"send/recv {dt}", got, base(n, 42 % 200, dt))

    # Communicators made and destroyed again (ncclCommDestroy / ncclCommAbort release the
    # device engine): each new group's first call makes it, its destroy gives it back.
    for i in range(6):
        g = dist.new_group(list(range(world)))
        x = base(1031, rank + i, torch.float32)
        dist.all_reduce(x, group=g)
        check(f"new_group {i} all_reduce", x, sum(base(1031, r + i, torch.int64) for r in range(world)).to(torch.float32))
        dist.destroy_process_group(g)

    # Large: 64 MiB of float32 and bf16 all-reduce.
    big = 16 << 20
    for dt in (torch.float32, torch.bfloat16):
        x = base(big, rank, dt)
        dist.all_reduce(x)
        check(f"all_reduce 64MiB-class {dt}", x, sum(base(big, r, torch.int64) for r in range(world)).to(dt))
    finish(rank, bad, failures)


def finish(rank, bad, failures):
    dist.barrier()
    torch.cuda.synchronize()
    print(f"rank {rank}: {len(bad)} failures; libnccl mapped: {' '.join(mapped_nccl()) or 'none'}", flush=True)
    for b in bad:
        print("FAIL", b, flush=True)
    if bad:
        failures.put(rank)
    dist.destroy_process_group()


def timing(rank, world, dev, check):
    """All-reduce sum of float32 ones, back to back: time until the calls return, and until
    the stream has finished them (host clock around a synchronize)."""
    import time

    for nbytes, iters in ((8, 200), (1 << 20, 50), (64 << 20, 10)):
        n = nbytes // 4
        x = torch.ones(n, device=dev)
        for _ in range(3):
            dist.all_reduce(x)
            x.fill_(1.0)
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
            x.div_(world)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        check(f"timing all_reduce {nbytes} B", x, torch.ones(n, device=dev))
        if rank == 0:
            print(f"timing all_reduce {nbytes} B x{iters}: calls return in {(t1 - t0) / iters * 1e6:.1f} us, "
                  f"ops complete in {(t2 - t0) / iters * 1e6:.1f} us each (incl. one div kernel)", flush=True)


def graph(rank, world, dev, check, bad, failures):
    """torch.cuda.graph capturing a chain of kernels, all_reduce and all_gather_into_tensor,
    replayed REPLAYS times, then checked exactly. With OXCCL_CUDA_IPC=0 (calls staged through
    host memory) the capture must be refused with oxccl's message instead."""
    n = 4099
    x = torch.zeros(n, device=dev)
    y = torch.empty(world * n, device=dev)
    acc = torch.zeros(n, device=dev)
    # Warm-up on a side stream, as torch.cuda.graph asks: eager calls first.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            dist.all_reduce(x)
            dist.all_gather_into_tensor(y, x)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    x.zero_()
    acc.zero_()
    g = torch.cuda.CUDAGraph()
    staged = os.environ.get("OXCCL_CUDA_IPC") == "0"
    try:
        with torch.cuda.graph(g):
            x.add_(1)  # every rank: c + 1 at replay c
            dist.all_reduce(x)  # world * (c + 1)
            x.div_(world)  # c + 1
            dist.all_gather_into_tensor(y, x + rank)  # block r: c + 1 + r
            acc.add_(y.view(world, n).sum(0))  # + world * (c + 1) + world * (world - 1) / 2
    except Exception as e:  # noqa: BLE001 - the refusal is what is checked
        msg = str(e).replace("\n", " ")
        refused = "captured into a CUDA graph" in msg
        print(f"rank {rank}: capture refused{' with oxccl message' if refused else ''}: {msg[:400]}", flush=True)
        if not (staged and refused):
            failures.put(rank)
        os._exit(0)
    if staged:
        print(f"rank {rank}: FAIL capture on the staged path was not refused", flush=True)
        failures.put(rank)
    torch.cuda.synchronize()
    for _ in range(REPLAYS):
        g.replay()
    torch.cuda.synchronize()
    r = REPLAYS
    check(f"graph x after {r} replays", x, torch.full((n,), float(r), device=dev))
    want_y = torch.cat([torch.full((n,), float(r + q), device=dev) for q in range(world)])
    check(f"graph all_gather after {r} replays", y, want_y)
    want_acc = world * r * (r + 1) / 2 + r * world * (world - 1) / 2
    check(f"graph chain sum after {r} replays", acc, torch.full((n,), float(want_acc), device=dev))
    # Eager calls after the replays still meet (the device counters ran on).
    z = torch.ones(n, device=dev)
    dist.all_reduce(z)
    check("eager all_reduce after replays", z, torch.full((n,), float(world), device=dev))
    if rank == 0:
        print(f"graph: {r} replays of kernel, all_reduce, kernel, all_gather_into_tensor, kernel", flush=True)
    finish(rank, bad, failures)


REPLAYS = 100
TIMING = "--timing" in sys.argv
GRAPH = "--graph" in sys.argv
TWO_HOSTS = "--two-hosts" in sys.argv


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    world = int(args[0]) if args else 4
    port = 29500 + os.getpid() % 1000
    ctx = mp.get_context("spawn")
    failures = ctx.SimpleQueue()
    mp.start_processes(worker, args=(world, port, failures, TIMING), nprocs=world, start_method="spawn")
    n_bad = 0
    while not failures.empty():
        failures.get()
        n_bad += 1
    hosts = " as two hosts" if TWO_HOSTS else ""
    ngpu = min(world, torch.cuda.device_count())
    where = "one GPU" if ngpu == 1 else f"{ngpu} GPUs"
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    print(f"torch {torch.__version__} (NCCL {nccl} as loaded: {', '.join(mapped_nccl()) or 'none mapped'}): "
          f"{world} processes on {where}{hosts}, {n_bad} with failures")
    sys.exit(1 if n_bad else 0)


if __name__ == "__main__":
    main()

"""Receives from any rank: oxccl.Communicator.recv(buf) with no peer (synchronous: returns the
sender; async_op=True: the Work's `source`), and torch.distributed's recv / irecv without
src on the backend "oxccl" (through its compiled fast path's Work, whose _source_rank torch
reads). Every rank but 0 sends rank 0 messages that name their sender and their order; rank
0 checks each exactly against the sender it was told, and that every message came once.

    torchrun --nproc-per-node P anysource.py
"""

import numpy as np
import torch
import torch.distributed as dist

import oxccl
import oxccl.torch  # noqa: F401
from common import Checks, main


def payload(frm, k, n):
    return np.arange(n, dtype=np.int64) + (frm << 40) + (k << 24)


def run():
    dist.init_process_group("oxccl")
    comm = oxccl.Communicator()
    me, p = comm.rank, comm.size
    c = Checks()
    per = 3
    for n in (1, 1000, 200_000):  # the last goes by the zero-copy path
        if me == 0:
            seen = {r: 0 for r in range(1, p)}
            for i in range(per * (p - 1)):
                buf = np.zeros(n, np.int64)
                if i % 2:
                    w = comm.recv(buf, async_op=True)
                    c.eq(f"n={n} Work.source before wait is None or a rank", w.source in (None, *seen), True)
                    w.wait()
                    frm = w.source
                else:
                    frm = comm.recv(buf)
                c.true(f"n={n} sender {frm} is another rank", frm in seen, repr(frm))
                if frm in seen:
                    c.array(f"n={n} message {seen[frm]} from rank {frm}", buf, payload(frm, seen[frm], n))
                    seen[frm] += 1
            c.eq(f"n={n} messages per sender", seen, {r: per for r in range(1, p)})
        else:
            for k in range(per):
                comm.send(payload(me, k, n), 0)
        comm.barrier()
    # torch.distributed: recv and irecv without src.
    t = torch.full((4, 4), float(me))
    if me == 0:
        got = []
        for i in range(2 * (p - 1)):
            out = torch.full((4, 4), -1.0)
            if i % 2:
                w = dist.irecv(out)
                w.wait()
                frm = w._source_rank()
            else:
                frm = dist.recv(out)
            got.append(frm)
            c.tensor(f"dist recv from any: the tensor of rank {frm}", out, torch.full((4, 4), float(frm)))
        c.eq("dist recv from any: senders", sorted(got), sorted([r for r in range(1, p)] * 2))
    else:
        dist.send(t, 0)
        dist.send(t, 0)
    dist.barrier()
    dist.destroy_process_group()
    comm.close()
    c.finish()


if __name__ == "__main__":
    main(run)

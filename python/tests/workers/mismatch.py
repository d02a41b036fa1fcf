"""Ranks whose calls differ: every rank in the call raises oxccl.MismatchError naming both
calls, within a bounded time; the communicator stays failed (its next call says so, same
class); other communicators are unharmed.

    torchrun --nproc-per-node 2 mismatch.py      (rank 1 is the one that differs)

Each case runs on a communicator of its own (comm.split of a healthy parent, or a new
torch.distributed group). Prints `MISMATCH rank=R <case> <class>: <message>` for each case,
and `PROBE` lines for two cases that test_errors.py reads on their own:
test_group_kind_mismatch (another collective as a group's second call, on a communicator
with a timeout, so that a regression fails as a timeout instead of hanging) and
test_sendrecv_small_mismatch_sender (a send that returned before the receiver saw the
mismatch: the sender's next call raises).
"""

import os
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

import oxccl
import oxccl.torch  # noqa: F401
from common import Checks, main, probe, say


def run():
    dist.init_process_group("oxccl")
    comm = oxccl.Communicator()
    me, p = comm.rank, comm.size
    c = Checks()
    x = np.ones(1000, np.float32)

    def case(name, fn, mine, theirs, comm_of=None):
        """`fn(sub)` on a fresh communicator; every rank must raise MismatchError naming
        `mine` (this rank's call) and `theirs` (rank 1's, or rank 0's on rank 1)."""
        sub = comm.split(0) if comm_of is None else None
        target = sub if comm_of is None else comm_of()
        t0 = time.monotonic()
        try:
            fn(target)
        except oxccl.MismatchError as e:
            dt = time.monotonic() - t0
            msg = str(e)
            say(f"MISMATCH rank={me} {name} {type(e).__name__}: {msg}")
            c.true(f"{name}: raised within 10 s", dt < 10, f"{dt:.2f} s")
            for needle in (mine, theirs, f"rank {me}", "calls differ"):
                c.true(f"{name}: the message names {needle!r}", needle in msg, msg)
            other = 0 if me == 1 else 1
            c.true(f"{name}: the message names the other rank", f"rank {other}" in msg, msg)
            c.eq(f"{name}: .rank", e.rank, me)
            c.eq(f"{name}: .peer", e.peer, other)
        except Exception as e:  # noqa: BLE001
            c.fail(f"{name}: expected MismatchError, got {type(e).__name__}: {e}")
        else:
            c.fail(f"{name}: expected MismatchError, nothing was raised")
        if comm_of is None:
            # The failed communicator says so on its next call, with the same class.
            c.raises(f"{name}: the next call on the failed communicator",
                     lambda: sub.all_reduce(np.ones(3, np.float32)), oxccl.MismatchError,
                     "unusable after an earlier failure", "calls differ")
            comm.barrier()
            sub.abort()

    one = me == 1
    # Another collective.
    case("collective", lambda s: s.broadcast(x, root=0) if one else s.all_reduce(x),
         "broadcast call #0 (float × 1000, root 0)" if one else "all_reduce call #0 (float × 1000, sum)",
         "all_reduce call #0 (float × 1000, sum)" if one else "broadcast call #0 (float × 1000, root 0)")
    # Another count.
    case("count", lambda s: s.all_reduce(x[:999] if one else x),
         "float × 999" if one else "float × 1000", "float × 1000" if one else "float × 999")
    # Another type.
    case("dtype", lambda s: s.all_reduce(np.ones(1000, np.int32) if one else x),
         "int32 × 1000" if one else "float × 1000", "float × 1000" if one else "int32 × 1000")
    # Another operator.
    case("op", lambda s: s.all_reduce(x, op="max" if one else "sum"),
         "max)" if one else "sum)", "sum)" if one else "max)")
    # Another root.
    case("root", lambda s: s.broadcast(x, root=1 if one else 0),
         "root 1" if one else "root 0", "root 0" if one else "root 1")
    # Another order: rank 1 makes its calls in the other order.
    def order(s):
        a, b = np.ones(8, np.int64), np.ones(8, np.int64)
        if one:
            s.reduce(a, None, "sum", 0)
            s.all_reduce(b)
        else:
            s.all_reduce(b)
            s.reduce(a, None, "sum", 0)

    case("order", order, "reduce call #0" if one else "all_reduce call #0",
         "all_reduce call #0" if one else "reduce call #0")
    # A different count in the second call of a group.
    def in_group(s):
        with s.group():
            s.all_reduce(np.ones(4, np.float64))
            s.all_reduce(np.ones(5 if one else 4, np.float64))

    case("in a group", in_group, "all_reduce call #1 (double × 5" if one else "all_reduce call #1 (double × 4",
         "all_reduce call #1 (double × 4" if one else "all_reduce call #1 (double × 5")
    # Another collective as the second call of a group (same type and count): both ranks
    # raise MismatchError naming both second calls, well before the 20 s timeout that keeps a
    # regression from hanging (test_group_kind_mismatch).
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), p, False,
                          timeout=timedelta(seconds=60))
    ct = oxccl.Communicator.from_store(store, me, p, key="oxccl-test/mismatch/group-kind", timeout=20.0)
    t0 = time.monotonic()
    try:
        with ct.group():
            ct.all_reduce(np.ones(4, np.float64))
            if one:
                ct.broadcast(np.ones(4, np.float64), root=0)
            else:
                ct.all_reduce(np.ones(4, np.float64))
        probe("group_kind_mismatch", False, "the group returned without an error")
    except oxccl.Error as e:
        msg = f"{type(e).__name__} after {time.monotonic() - t0:.1f} s: {e}"
        probe("group_kind_mismatch", isinstance(e, oxccl.MismatchError) and "broadcast call #1" in str(e)
              and "all_reduce call #1" in str(e) and time.monotonic() - t0 < 10, msg)
    store.set(f"oxccl-test/mismatch/group-kind-done/{me}", b"1")
    for r in range(p):
        store.get(f"oxccl-test/mismatch/group-kind-done/{r}")
    ct.abort()

    # Through torch.distributed: rank 1 broadcasts, the others all-reduce (a group each).
    def dist_case():
        return dist.new_group(backend="oxccl")

    g = dist_case()
    case("torch.distributed", lambda _: dist.broadcast(torch.ones(1000), src=0, group=g) if one
         else dist.all_reduce(torch.ones(1000), group=g),
         "broadcast call #0" if one else "all_reduce call #0", "all_reduce call #0" if one else "broadcast call #0",
         comm_of=lambda: None)
    c.raises("torch.distributed: the next call on the failed group", lambda: dist.all_reduce(torch.ones(2), group=g),
             oxccl.MismatchError, "unusable after an earlier failure")

    # send/recv of different counts (rank 0 sends, rank 1 receives 2 elements more): large
    # messages, then small ones. Both ranks must raise naming both calls.
    for label, n in (("large", 1 << 20), ("small", 10)):
        sub = comm.split(0)
        t0 = time.monotonic()
        if me == 0:
            both = (f"float × {n})", f"float × {n + 2})")
            got, at = None, "send"
            try:
                sub.send(np.ones(n, np.float32), 1)
                # A small send returns once its data is handed over (an eager send, as in NCCL
                # and MPI), before the receiver compares: the sender's next call raises.
                at = "next call"
                sub.all_reduce(np.ones(3, np.float32))
                msg = "the send and the sender's next call returned without an error"
            except oxccl.Error as e:
                got, msg = e, f"{type(e).__name__} at the {at}: {e}"
                say(f"MISMATCH rank={me} send/recv {label} {msg}")
            ok = got is not None and all(b in str(got) for b in both)
            if label == "large":
                c.true(f"send/recv {label}: the send raises an oxccl.Error naming both calls",
                       ok and at == "send", msg)
            else:  # test_sendrecv_small_mismatch_sender
                probe("sendrecv_small_sender", ok, msg)
        elif me == 1:
            c.raises(f"send/recv {label}: the receiver", lambda: sub.recv(np.zeros(n + 2, np.float32), 0),
                     oxccl.MismatchError, f"rank 1 is in send/recv message #0 (float × {n + 2})",
                     f"rank 0 is in send/recv message #0 (float × {n})")
        c.true(f"send/recv {label}: bounded time", time.monotonic() - t0 < 10)
        comm.barrier()
        sub.abort()

    # The parent communicator and the default group are unharmed.
    y = np.full(5, me + 1, np.int32)
    comm.all_reduce(y)
    c.array("parent communicator after the failed children", y, np.full(5, p * (p + 1) // 2, np.int32))
    t = torch.full((3,), float(me))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    c.tensor("default group after the failed group", t, torch.full((3,), float(p - 1)))
    comm.close()
    dist.destroy_process_group()
    c.finish()


if __name__ == "__main__":
    main(run)

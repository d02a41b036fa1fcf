"""A rank killed (SIGKILL) before a collective: the others raise oxccl.PeerGoneError naming
it, at once, on every communicator it was in; the survivors then shrink the communicator
and go on.

    torchrun --nproc-per-node P killed.py VICTIM

The survivors ignore SIGTERM (torchrun sends it to every rank once one has died) so that
they can finish and report; each prints
`SURVIVOR rank=R <what> <class> peer=<peer> after=<s>: <message>` lines and its CHECKS
line. torchrun itself then reports the killed rank and exits non-zero.
"""

import os
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import oxccl
import oxccl.torch  # noqa: F401
from common import Checks, main, say


def run():
    victim = int(sys.argv[1])
    dist.init_process_group("oxccl")
    comm = oxccl.Communicator()
    me, p = comm.rank, comm.size
    sub = comm.split(0)  # a second communicator the victim is in
    c = Checks()
    if me != victim:
        # A Python handler (no SA_RESTART): its signal may interrupt the shrink's connection
        # setup, which must carry on (signals.py tests that on purpose).
        signal.signal(signal.SIGTERM, lambda *_: say(f"rank {me}: SIGTERM from torchrun ignored"))

    # Everything works while every rank is alive.
    t = torch.full((4,), float(me + 1))
    dist.all_reduce(t)
    c.tensor("all_reduce before the kill", t, torch.full((4,), p * (p + 1) / 2))
    x = np.full(3, me, np.int64)
    comm.all_reduce(x)
    c.array("numpy all_reduce before the kill", x, np.full(3, p * (p - 1) // 2, np.int64))
    comm.barrier()
    if me == victim:
        say(f"rank {me}: killing myself (SIGKILL)")
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # never reached

    def expect_gone(what, fn, needle):
        t0 = time.monotonic()
        try:
            fn()
        except oxccl.PeerGoneError as e:
            dt = time.monotonic() - t0
            say(f"SURVIVOR rank={me} {what} {type(e).__name__} peer={e.peer} after={dt:.2f}: {e}")
            c.true(f"{what}: the message names rank {victim}", needle in str(e), str(e))
            c.true(f"{what}: raised within 10 s", dt < 10, f"{dt:.2f} s")
            c.eq(f"{what}: .rank", e.rank, me)
            return e
        except Exception as e:  # noqa: BLE001
            c.fail(f"{what}: expected PeerGoneError, got {type(e).__name__}: {e}")
        else:
            c.fail(f"{what}: expected PeerGoneError, nothing was raised")

    gone = f"peer rank {victim} (host"
    e = expect_gone("dist.all_reduce", lambda: dist.all_reduce(torch.ones(1000)), gone)
    if e is not None:
        c.eq("dist.all_reduce: .peer", e.peer, victim)
    # The same communicator again: it stays failed, with the same class and the first cause.
    expect_gone("dist.all_reduce again", lambda: dist.all_reduce(torch.ones(8)), gone)
    e = expect_gone("numpy all_reduce", lambda: comm.all_reduce(np.ones(100)), gone)
    if e is not None:
        c.eq("numpy all_reduce: .peer", e.peer, victim)
    w = None

    def async_call():
        nonlocal w
        w = sub.all_gather(np.ones(2), np.zeros(2 * p), async_op=True)
        w.wait(timeout=20)

    e = expect_gone("async all_gather, Work.wait()", async_call, gone)
    if w is not None:
        c.eq("async Work.is_completed() after the failure", w.is_completed(), True)
        c.true("async Work.exception() after the failure", isinstance(w.exception(), oxccl.PeerGoneError),
               repr(w.exception()))
    # A point-to-point call to a survivor on the failed communicator fails too (the
    # communicator is unusable), naming the victim.
    peer = next(r for r in range(p) if r not in (me, victim))
    expect_gone("send to a survivor on the failed communicator", lambda: comm.send(np.ones(4), peer), gone)

    # The survivors make a communicator without the victim and go on.
    t0 = time.monotonic()
    sh = comm.shrink([victim])
    survivors = [r for r in range(p) if r != victim]
    c.eq("shrink: size", sh.size, p - 1)
    c.eq("shrink: rank", sh.rank, survivors.index(me))
    y = np.full(5, me + 1.0)
    sh.all_reduce(y)
    c.array("all_reduce on the shrunk communicator", y, np.full(5, float(sum(r + 1 for r in survivors))))
    z = np.zeros(2 * (p - 1), np.int32)
    sh.all_gather(np.full(2, me, np.int32), z)
    c.array("all_gather on the shrunk communicator", z, np.repeat(np.array(survivors, np.int32), 2))
    c.true("shrink and two calls within 10 s", time.monotonic() - t0 < 10)
    sh.close()
    say(f"SURVIVOR rank={me} done")
    c.finish()


if __name__ == "__main__":
    main(run)

"""A signal with a Python handler, delivered while the library sets up connections (a new
communicator's first calls): the setup must not fail.

    torchrun --nproc-per-node 2 signals.py

Every rank makes up to ITERS communicators (split) and runs an all_reduce on each, first
with no signals (checked), then with a thread sending SIGUSR2 (a Python handler, as
torch's DataLoader installs for SIGCHLD and torchrun's rank for SIGTERM) to the main thread
every 0.5 ms. (A handled signal used to end the setup with "internal error: empty unix socket
answer": EINTR taken for "no message".)
"""

import signal
import threading
import time

import numpy as np

import oxccl
from common import Checks, main

ITERS = 300


def run():
    comm = oxccl.Communicator()
    me, p = comm.rank, comm.size
    c = Checks()
    for i in range(10):  # the loop itself, without signals
        s = comm.split(0)
        x = np.full(3, me + i, np.int64)
        s.all_reduce(x)
        c.array(f"split #{i} all_reduce (no signals)", x, np.full(3, sum(r + i for r in range(p)), np.int64))
        s.close()
    comm.barrier()
    hits = [0]
    signal.signal(signal.SIGUSR2, lambda *_: hits.__setitem__(0, hits[0] + 1))
    main_id = threading.main_thread().ident
    stop = threading.Event()

    def pester():
        while not stop.is_set():
            signal.pthread_kill(main_id, signal.SIGUSR2)
            time.sleep(0.0005)

    t = threading.Thread(target=pester, daemon=True)
    t.start()
    failed = None
    for i in range(ITERS):
        try:
            s = comm.split(0)
            x = np.full(3, me + i, np.int64)
            s.all_reduce(x)
            s.close()
            if not (x == sum(r + i for r in range(p))).all():
                failed = f"split #{i}: wrong result {x}"
                break
        except oxccl.Error as e:
            failed = f"split #{i} (signals handled so far: {hits[0]}): {type(e).__name__}: {e}"
            break
    stop.set()
    t.join()
    c.true(f"{ITERS} communicators set up while signals arrive ({hits[0]} handled)", failed is None, failed)
    c.finish()


if __name__ == "__main__":
    main(run)

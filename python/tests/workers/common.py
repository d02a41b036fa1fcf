"""What every worker shares: a deadline, exact (bitwise) comparisons that say what differed,
the inputs whose reductions are exact in every data type, and the summary line the tests read.

A worker calls `start(name)` first: it arms a deadline (OXCCL_TEST_DEADLINE seconds, set by
conftest below the test's own timeout) after which the process prints every thread's stack
and exits, and makes the process die with torchrun (so a killed launch leaves no rank
behind). `Checks` counts checks; a mismatch is printed at once (stderr) and the worker ends
non-zero at `finish()`. `main(fn)` runs the worker and turns an unexpected exception into
an exit status of 1 at once (torchrun then ends the other ranks instead of leaving them
waiting for a call this rank will never make).
"""

import ctypes
import faulthandler
import os
import signal
import sys
import traceback

RANK = int(os.environ.get("RANK", "0"))


def start():
    faulthandler.dump_traceback_later(float(os.environ.get("OXCCL_TEST_DEADLINE", "200")), exit=True)
    try:  # PR_SET_PDEATHSIG: SIGKILL this rank when torchrun (its parent) dies.
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def say(*parts):
    """One line on stdout, written at once (lines of different ranks never interleave)."""
    sys.stdout.flush()
    os.write(1, (" ".join([f"[rank {RANK}]", *map(str, parts)]) + "\n").encode())


def probe(tag, ok, detail=""):
    """A check of a known library bug, kept out of `Checks` so the worker's own verdict
    stays green: prints `PROBE rank=R <tag> ok|FAIL <detail>`, which an xfail(strict) test
    asserts on (tests/conftest.py: probes)."""
    say(f"PROBE rank={RANK} {tag} {'ok' if ok else 'FAIL'} {detail}".rstrip())


def main(fn):
    start()
    try:
        fn()
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - report it and end this rank now
        sys.stderr.write(f"[rank {RANK}] worker raised:\n{traceback.format_exc()}")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)


class Checks:
    """Counts checks and collects failures; `finish()` prints `CHECKS rank=R passed=N
    failed=F` (the line the tests parse) and exits 1 if any failed."""

    def __init__(self, max_failures=30):
        self.passed = 0
        self.failures = []
        self.max_failures = max_failures

    def fail(self, msg):
        msg = f"rank {RANK}: {msg}"
        self.failures.append(msg)
        sys.stderr.flush()
        os.write(2, f"CHECK FAILED {msg}\n".encode())
        if len(self.failures) >= self.max_failures:
            self.finish()

    def ok(self):
        self.passed += 1

    def true(self, what, cond, detail=""):
        if cond:
            self.ok()
        else:
            self.fail(f"{what}: {detail or 'condition is false'}")

    def eq(self, what, got, want):
        if got == want:
            self.ok()
        else:
            self.fail(f"{what}: expected {want!r}, got {got!r}")

    def tensor(self, what, got, want):
        """Bitwise equality of two torch tensors (same dtype, same number of elements)."""
        if got.dtype != want.dtype or got.numel() != want.numel():
            self.fail(f"{what}: expected {want.dtype} × {want.numel()}, got {got.dtype} × {got.numel()}")
            return
        if got.is_complex():
            import torch

            got, want = torch.view_as_real(got), torch.view_as_real(want)
        g, w = tbits(got), tbits(want)
        diff = (g != w).nonzero()
        if diff.numel() == 0:
            self.ok()
            return
        i = int(diff[0, 0])
        gf, wf = got.reshape(-1), want.reshape(-1)
        self.fail(
            f"{what}: index {i}: expected {tval(wf, i)}, got {tval(gf, i)} "
            f"({diff.shape[0]} of {got.numel()} elements differ; dtype {got.dtype})"
        )

    def array(self, what, got, want):
        """Bitwise equality of two numpy arrays (`want` may be a different view of the same
        element size, e.g. the uint16 bits of bfloat16 values)."""
        import numpy as np

        if got.nbytes != want.nbytes or got.size != want.size:
            self.fail(f"{what}: expected {want.dtype} × {want.size}, got {got.dtype} × {got.size}")
            return
        u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(got.itemsize)
        if u is None:  # complex128, structured, ...: element by element, as rows of bytes
            g = np.ascontiguousarray(got).reshape(-1).view(np.uint8).reshape(got.size, -1)
            w = np.ascontiguousarray(want).reshape(-1).view(np.uint8).reshape(want.size, -1)
            rows = np.nonzero((g != w).any(1))[0]
            if rows.size == 0:
                self.ok()
            else:
                i = int(rows[0])
                self.fail(f"{what}: index {i}: expected {want.reshape(-1)[i]!r}, got {got.reshape(-1)[i]!r} "
                          f"({rows.size} of {got.size} elements differ)")
            return
        g, w = np.ascontiguousarray(got).reshape(-1).view(u), np.ascontiguousarray(want).reshape(-1).view(u)
        diff = np.nonzero(g != w)[0]
        if diff.size == 0:
            self.ok()
            return
        i = int(diff[0])
        self.fail(
            f"{what}: index {i}: expected {want.reshape(-1)[i]!r} (bits {int(w[i]):#x}), got "
            f"{got.reshape(-1)[i]!r} (bits {int(g[i]):#x}) ({diff.size} of {got.size} elements differ)"
        )

    def raises(self, what, fn, cls, *needles):
        """`fn()` must raise `cls` whose message contains every needle; returns the exception."""
        try:
            fn()
        except cls as e:
            msg = str(e)
            missing = [n for n in needles if n not in msg]
            if missing:
                self.fail(f"{what}: {type(e).__name__} raised, but its message lacks {missing}: {msg!r}")
            else:
                self.ok()
            return e
        except BaseException as e:  # noqa: BLE001
            self.fail(f"{what}: expected {cls.__name__}, got {type(e).__name__}: {e}")
            return e
        self.fail(f"{what}: expected {cls.__name__}, nothing was raised")
        return None

    def finish(self):
        ok = not self.failures
        say(f"CHECKS rank={RANK} passed={self.passed} failed={len(self.failures)}")
        sys.stderr.flush()
        os._exit(0 if ok else 1)


def tbits(t):
    """A tensor's bits as a flat signed-integer tensor of the same element size."""
    import torch

    t = t.detach().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    t = t.reshape(-1)
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def tval(flat, i):
    """Element i for a message: the value and, for floats, the bits."""
    import torch

    x = flat[i]
    if flat.dtype.is_floating_point:
        bits = int(tbits(flat)[i]) & ((1 << (8 * flat.element_size())) - 1)
        return f"{float(x.to(torch.float64))!r} (bits {bits:#x})"
    if flat.dtype == torch.bool:
        return repr(bool(x))
    return repr(int(x))

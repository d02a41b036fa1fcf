"""Failures: bad arguments (workers/bad_args.py), ranks whose calls differ
(workers/mismatch.py), a rank killed before a collective (workers/killed.py)."""

import re

import pytest

from conftest import cached_run, check_summary, probes, torchrun


def bad_args():
    return cached_run("bad_args", "bad_args.py", 2, timeout=120)


def mismatch():
    return cached_run("mismatch", "mismatch.py", 2, timeout=150)


def killed(nproc, victim):
    return cached_run(("killed", nproc, victim), "killed.py", nproc, victim, timeout=120)


def test_bad_arguments():
    """Each wrong call raises oxccl.InvalidArgumentError (a ValueError) within 5 s with a
    message naming the argument; correct calls afterwards give exact results."""
    p = bad_args()
    assert p.returncode == 0, f"bad_args.py exited {p.returncode}:\n{p.stdout[-8000:]}"
    check_summary(p, 2, min_checks=250)


def test_mismatched_calls():
    """Rank 1's call differs (collective, count, type, operator, root, order, a count inside
    a group, through torch.distributed): both ranks raise MismatchError naming both calls;
    the failed communicator stays failed; the parent is unharmed."""
    p = mismatch()
    assert p.returncode == 0, f"mismatch.py exited {p.returncode}:\n{p.stdout[-8000:]}"
    check_summary(p, 2, min_checks=70)
    got = re.findall(r"MISMATCH rank=(\d) (.+?) MismatchError: (rank \d: .*)", p.stdout)
    cases = {(int(r), case) for r, case, _ in got}
    for case in ("collective", "count", "dtype", "op", "root", "order", "in a group", "torch.distributed"):
        for r in (0, 1):
            assert (r, case) in cases, f"rank {r} printed no MismatchError for {case!r}:\n{p.stdout[-4000:]}"
    # The exact text for the first case, as the README documents it.
    assert ("MISMATCH rank=0 collective MismatchError: rank 0: all_reduce: calls differ: rank 0 is in all_reduce "
            "call #0 (float × 1000, sum) but rank 1 is in broadcast call #0 (float × 1000, root 0)") in p.stdout
    assert ("MISMATCH rank=1 collective MismatchError: rank 1: broadcast: calls differ: rank 1 is in broadcast "
            "call #0 (float × 1000, root 0) but rank 0 is in all_reduce call #0 (float × 1000, sum)") in p.stdout


def test_group_kind_mismatch():
    """Groups that differ only in their second collective (rank 0: all_reduce, all_reduce;
    rank 1: all_reduce, broadcast, same type and count): both ranks raise MismatchError naming
    both second calls, within 10 s (the communicator's timeout is 20 s)."""
    probes(mismatch(), "group_kind_mismatch", expect_min=2)


def test_sendrecv_small_mismatch_sender():
    """send/recv of different counts, 10 floats sent and 12 received: the send returns once its
    data is handed over (eager, as in NCCL and MPI), and the sender's next call on the
    communicator raises an oxccl.Error naming both messages (the receiver raises
    MismatchError at its receive: test_mismatched_calls)."""
    probes(mismatch(), "sendrecv_small_sender", expect_min=1)


@pytest.mark.parametrize("nproc,victim", [(3, 1), (4, 0)])
def test_rank_killed(nproc, victim):
    """One rank SIGKILLs itself before a collective; every survivor raises PeerGoneError
    naming it (torch.distributed and numpy communicators, sync and async), within 10 s, then
    shrinks the communicator and computes exactly without it."""
    p = killed(nproc, victim)
    out = p.stdout
    assert p.returncode != 0, "torchrun should report the killed rank"
    assert f"rank      : {victim} (local_rank: {victim})" in out and "Signal 9 (SIGKILL)" in out, out[-3000:]
    survivors = [r for r in range(nproc) if r != victim]
    found = {int(r): (int(n), int(f)) for r, n, f in re.findall(r"CHECKS rank=(\d+) passed=(\d+) failed=(\d+)", out)}
    assert sorted(found) == survivors, f"survivors that reported: {sorted(found)}:\n{out[-6000:]}"
    assert all(f == 0 and n >= 20 for n, f in found.values()), f"{found}:\n{out[-6000:]}"
    for r in survivors:
        line = re.search(rf"SURVIVOR rank={r} dist.all_reduce PeerGoneError peer={victim} after=([\d.]+): (.*)", out)
        assert line, f"rank {r} printed no PeerGoneError for dist.all_reduce:\n{out[-6000:]}"
        assert re.fullmatch(rf"rank {r}: all_reduce: peer rank {victim} \(host [^)]+\) closed its connection",
                            line.group(2)), line.group(2)
        assert float(line.group(1)) < 10
        for what in ("numpy all_reduce", "async all_gather, Work.wait()"):
            pat = rf"SURVIVOR rank={r} {re.escape(what)} PeerGoneError peer={victim} .*peer rank {victim} "
            assert re.search(pat, out), f"rank {r}: {what}:\n{out[-6000:]}"
        assert f"SURVIVOR rank={r} done" in out


def test_signal_during_connection_setup():
    """300 communicators set up (split, then a first all_reduce) while the main thread gets a
    signal with a Python handler every 0.5 ms: none fails (EINTR is retried)."""
    p = torchrun("signals.py", 2, timeout=90)
    check_summary(p, 2, min_checks=11)

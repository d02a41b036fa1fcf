"""Runs rank programs (tests/workers/*.py) under torchrun and checks what they report.

Each worker checks its own results exactly and exits non-zero (with the reason on stderr) on
the first mismatch; the tests here start them with 2 and 4 ranks and assert on the exit
status and the lines they print. Every run has a deadline: a hang fails its test, naming the
run, instead of stalling the suite.

Deadlines, twice over: torchrun runs in a session of its own and is killed with everything
in it at `timeout`; each worker also arms its own deadline (OXCCL_TEST_DEADLINE, a little
shorter: it prints every thread's stack and exits) and dies with torchrun (workers/common.py),
since torchrun puts each rank in a session of its own. Runs are never concurrent: the suite
starts one torchrun at a time.

Files: the suite writes only under its run root, `$TMPDIR/oxccl-test-<pid>` (as the Rust
tests do, oxccl_testkit::scope), removed when the session ends, pass or fail. Made before any
test, it becomes `TMPDIR` for this process and every rank it starts (torchrun's log
directories, the flight recorder dumps of ranks that fail on purpose, unique-id files), holds
pytest's `tmp_path` directories, and its `cache` is `OXCCL_CACHE_DIR` unless that is set.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"

_ROOT = Path(tempfile.gettempdir()) / f"oxccl-test-{os.getpid()}"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    _ROOT.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(_ROOT)
    tempfile.tempdir = None  # tempfile reads TMPDIR again
    if not os.environ.get("OXCCL_CACHE_DIR"):
        os.environ["OXCCL_CACHE_DIR"] = str(_ROOT / "cache")
    if config.option.basetemp is None:
        config.option.basetemp = str(_ROOT / "pytest")


def pytest_unconfigure(config):
    shutil.rmtree(_ROOT, ignore_errors=True)


def torchrun(script, nproc, *args, env=None, timeout=240, check=True):
    """Runs `script` (a name under workers/) with `nproc` ranks; returns the completed
    process (stdout and stderr together, as text; `.wall` the seconds it took)."""
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    e["OXCCL_TEST_DEADLINE"] = str(max(5, timeout - 10))
    e["PYTHONUNBUFFERED"] = "1"
    e.update(env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--standalone", "--monitor-interval", "0.2",
           str(WORKERS / script), *map(str, args)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:  # a rank still holds the pipe: give up reading it
            out = ""
        pytest.fail(f"{script} with {nproc} ranks did not end within {timeout} s; output:\n{(out or '')[-6000:]}")
    p = subprocess.CompletedProcess(cmd, proc.returncode, out, None)
    p.wall = time.monotonic() - t0
    if check and p.returncode != 0:
        pytest.fail(f"{script} with {nproc} ranks exited {p.returncode}; output:\n{p.stdout[-8000:]}")
    return p


def check_summary(p, nproc, min_checks):
    """Every rank printed `CHECKS rank=R passed=N failed=0` with N ≥ min_checks."""
    found = {int(r): (int(n), int(f))
             for r, n, f in re.findall(r"CHECKS rank=(\d+) passed=(\d+) failed=(\d+)", p.stdout)}
    assert sorted(found) == list(range(nproc)), f"ranks that reported: {sorted(found)}; output:\n{p.stdout[-6000:]}"
    for r, (n, f) in sorted(found.items()):
        assert f == 0, f"rank {r}: {f} checks failed; output:\n{p.stdout[-6000:]}"
        assert n >= min_checks, (
            f"rank {r} made only {n} checks (expected ≥ {min_checks}); output:\n{p.stdout[-6000:]}")
    return found


def lines(p, tag):
    """The `tag rank=R rest` lines the workers printed, as (rank, rest)."""
    return [(int(r), rest) for r, rest in re.findall(rf"{tag} rank=(\d+) ([^\n]*)", p.stdout)]


def probes(p, tag, expect_min=1):
    """The PROBE lines of `tag` (workers/common.py: probe), asserted all "ok"."""
    got = re.findall(rf"PROBE rank=(\d+) {re.escape(tag)} (ok|FAIL)([^\n]*)", p.stdout)
    assert len(got) >= expect_min, f"expected ≥ {expect_min} {tag} probes, found {len(got)}:\n{p.stdout[-4000:]}"
    bad = [f"rank {r}:{d}" for r, v, d in got if v != "ok"]
    assert not bad, f"{tag}: {len(bad)} of {len(got)} probes failed:\n" + "\n".join(bad[:8])


@pytest.fixture
def run():
    return torchrun


_CACHE = {}


def cached_run(key, script, nproc, *args, **kw):
    """One launch shared by the tests that read different parts of its output."""
    if key not in _CACHE:
        try:
            _CACHE[key] = torchrun(script, nproc, *args, check=False, **kw)
        except pytest.fail.Exception as e:  # a hang: every test of this launch fails with it
            _CACHE[key] = e
    if isinstance(_CACHE[key], BaseException):
        pytest.fail(str(_CACHE[key]))
    return _CACHE[key]

"""Runs rank programs (tests/workers/*.py) under torchrun and checks what they report.

Each worker checks its own results exactly and exits non-zero (with the reason on stderr) on
the first mismatch; the tests here start them with 2 and 4 ranks and assert on the exit
status and the lines they print. Every run has a deadline: a hang fails its test, naming the
run, instead of stalling the suite.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"


def torchrun(script, nproc, *args, env=None, timeout=240, check=True):
    """Runs `script` (a name under workers/) with `nproc` ranks; returns the completed
    process (stdout and stderr together, as text)."""
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    e.update(env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--standalone", "--monitor-interval", "0.2",
           str(WORKERS / script), *map(str, args)]
    try:
        p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as t:
        out = t.output.decode() if isinstance(t.output, bytes) else (t.output or "")
        pytest.fail(f"{script} with {nproc} ranks did not end within {timeout} s; output:\n{out[-6000:]}")
    if check and p.returncode != 0:
        pytest.fail(f"{script} with {nproc} ranks exited {p.returncode}; output:\n{p.stdout[-8000:]}")
    return p


@pytest.fixture
def run():
    return torchrun

"""Asynchronous calls, futures and subgroups through torch.distributed's backend "oxccl"
(workers/async_groups.py), at 2 and 4 ranks."""

import pytest

from conftest import cached_run, check_summary, probes


def launch(nproc):
    return cached_run(("async_groups", nproc), "async_groups.py", nproc, timeout=150)


@pytest.mark.parametrize("nproc", [2, 4])
def test_async_futures_and_subgroups(nproc):
    p = launch(nproc)
    assert p.returncode == 0, f"async_groups.py with {nproc} ranks exited {p.returncode}:\n{p.stdout[-8000:]}"
    check_summary(p, nproc, min_checks=80)


def test_work_is_completed_after_wait():
    """Work.is_completed() is True after wait() (collectives) and after the future completed
    (isend/irecv, whose Work torch would otherwise hold in a wrapper that forwards only wait()
    and get_future()), as Gloo's and NCCL's say."""
    probes(launch(2), "work_is_completed", expect_min=2 * 5)


def test_work_result():
    """Work.result() of asynchronous collectives returns the output tensors, as Gloo's does."""
    probes(launch(2), "work_result", expect_min=2 * 3)

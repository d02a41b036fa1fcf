"""oxccl.Communicator on numpy arrays, without torch.distributed (workers/numpy_comm.py), at 2
and 4 ranks: every collective in and out of place × data type × operator, async calls,
groups, split, stores, unique ids, close/abort, a timeout, shrink."""

import pytest

from conftest import cached_run, check_summary


def launch(nproc, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"filestore{nproc}") / "store"
    return cached_run(("numpy", nproc), "numpy_comm.py", nproc, path, timeout=150)


@pytest.mark.parametrize("nproc", [2, 4])
def test_numpy_communicator(nproc, tmp_path_factory):
    p = launch(nproc, tmp_path_factory)
    assert p.returncode == 0, f"numpy_comm.py with {nproc} ranks exited {p.returncode}:\n{p.stdout[-8000:]}"
    check_summary(p, nproc, min_checks=1500)
    assert p.stdout.count("numpy worker done on rank") == nproc

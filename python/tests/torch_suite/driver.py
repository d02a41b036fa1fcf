"""PyTorch's own distributed test suite (DistributedTest, shipped in the torch wheel) against
the backend BACKEND names, one test per spawn, as torch's test/distributed/
test_distributed_spawn.py runs it against Gloo; "oxccl" joins the suite's plugin, ddp and
subgroup feature lists, as a plugin backend must. For one test at a time, as torch runs them:

    BACKEND=oxccl WORLD_SIZE=2 python driver.py TestDistBackendWithSpawn.test_all_reduce_sum

(`run.py` runs the whole suite with one pair of processes for many tests.)
OXCCL_TORCH_SUITE_LIFT=name[,name...] takes off the skip a backend list puts around those tests.
"""

import os

os.environ.setdefault("WORLD_SIZE", "2")

import torch  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402
from torch.testing._internal.common_utils import run_tests  # noqa: E402

if os.environ.get("BACKEND") == "oxccl":
    import oxccl.torch  # noqa: F401

    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("oxccl")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


# Tests whose body, not only a decorator, picks what to run by the backend's name (the model
# `_test_accumulate_gradients_no_sync` builds exists only `if BACKEND == "mpi" or "gloo"`) and
# then uses the default process group alone: lifted, their body reads the name it names here,
# while every process group stays the backend's own (the group was made before the body).
BODY_READS_BACKEND_AS = {
    "test_accumulate_gradients_no_sync": "gloo",
    "test_accumulate_gradients_no_sync_allreduce_hook": "gloo",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": "gloo",
    "test_accumulate_gradients_no_sync_grad_is_view": "gloo",
}


def unskipped(fn):
    """`fn` without the skip a backend list put on it: unittest's skip wrappers come off, and
    a skip marked on the function itself is left behind on it (run.py --lift-gates)."""
    as_backend = BODY_READS_BACKEND_AS.get(fn.__name__)
    while getattr(fn, "__unittest_skip__", False) and hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__

    def lifted(self):
        if as_backend is None:
            return fn(self)
        from torch.testing._internal.distributed import distributed_test as dt

        was, dt.BACKEND = dt.BACKEND, as_backend
        try:
            return fn(self)
        finally:
            dt.BACKEND = was

    lifted.__name__ = fn.__name__
    return lifted


def lift(cls, name):
    setattr(cls, name, unskipped(getattr(cls, name)))


for _name in filter(None, os.environ.get("OXCCL_TORCH_SUITE_LIFT", "").split(",")):
    lift(TestDistBackendWithSpawn, _name)


if __name__ == "__main__":
    run_tests()

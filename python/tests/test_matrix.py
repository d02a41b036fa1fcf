"""Every collective × data type × operator through torch.distributed's backend "oxccl", at 2
and 4 ranks, exact against references the worker computes itself (workers/matrix.py)."""

import pytest

from conftest import cached_run, check_summary, lines

# Calls of each kind every rank must have checked (13 data types: int8, uint8, int32, uint32,
# int64, uint64, float16, bfloat16, float32, float64, float8_e4m3fn, float8_e5m2, bool).
KINDS = ["all_reduce", "all_reduce_coalesced", "coalescing_manager_all_reduce", "reduce", "reduce_scatter",
         "reduce_scatter_tensor", "broadcast", "all_gather", "all_gather_uneven", "all_gather_into_tensor",
         "all_to_all", "all_to_all_single_even", "all_to_all_single_uneven", "gather", "scatter",
         "send_recv", "isend_irecv", "batch_isend_irecv", "barrier", "premul_factor_forms", "large", "complex",
         "objects"]


def matrix(nproc, fast=True):
    env = {} if fast else {"OXCCL_TORCH_FAST": "0"}
    return cached_run(("matrix", nproc, fast), "matrix.py", nproc, env=env, timeout=200)


# The compiled fast path (oxccl/csrc/fast.cpp: the common single-tensor calls in C++) where it
# can be built, and the Python path alone (OXCCL_TORCH_FAST=0).
@pytest.mark.parametrize("nproc,fast", [(2, True), (4, True), (2, False)], ids=["2", "4", "2-python-path"])
def test_matrix(nproc, fast):
    p = matrix(nproc, fast)
    assert p.returncode == 0, f"matrix.py with {nproc} ranks exited {p.returncode}:\n{p.stdout[-8000:]}"
    check_summary(p, nproc, min_checks=1400)
    counts = {}
    for r, rest in lines(p, "COUNT"):
        k, n = rest.split()
        counts[(r, k)] = int(n)
    for r in range(nproc):
        for k in KINDS:
            assert counts.get((r, k), 0) > 0, f"rank {r} checked no {k} call"
        # 13 broadcasts per root; all_reduce at 3 sizes with 8 operators on the 6 integer
        # types, 6 (PREMUL_SUM included) on the 6 floating types and 2 on bool.
        assert counts[(r, "broadcast")] == 13 * nproc
        assert counts[(r, "all_reduce")] == 3 * (6 * 8 + 6 * 6 + 2), counts[(r, "all_reduce")]


# The plain calls the fast path answers (workers/matrix.py counts the Python methods they
# reach): none reaches Python with the fast path, each reaches it once without.
PLAIN = ["allreduce", "broadcast", "reduce", "all_gather_single", "reduce_scatter_single",
         "all_to_all_single", "barrier"]


@pytest.mark.parametrize("nproc,fast", [(2, True), (4, True), (2, False)], ids=["2", "4", "2-python-path"])
def test_plain_calls_skip_python(nproc, fast):
    p = matrix(nproc, fast)
    assert p.returncode == 0, f"matrix.py with {nproc} ranks exited {p.returncode}:\n{p.stdout[-8000:]}"
    built = {r: rest.strip() == "True" for r, rest in lines(p, "FASTPATH")}
    seen = {}
    for r, rest in lines(p, "PYPATH"):
        k, n = rest.split()
        seen[(r, k)] = int(n)
    for r in range(nproc):
        if fast and not built.get(r):
            pytest.skip("the compiled fast path could not be built here (CI requires it: OXCCL_REQUIRE_ALL)")
        # all_to_all_single is called twice (even, then uneven split sizes).
        want = {k: 0 for k in PLAIN} if fast else {k: 2 if k == "all_to_all_single" else 1 for k in PLAIN}
        got = {k: seen.get((r, k)) for k in PLAIN}
        assert got == want, f"rank {r}: Python methods reached by plain calls {got}, expected {want}"

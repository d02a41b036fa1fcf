"""DDP (no hook, allreduce_hook, fp16_compress_hook) and FSDP2 training over oxccl against
Gloo and against an exact rank-order reference (workers/ddp.py).

2 ranks: oxccl's parameters equal Gloo's and the reference's bit for bit (a sum of two is
the same in any order). 4 ranks, OXCCL_DETERMINISTIC=1: oxccl equals the reference (the left
fold in rank order the deterministic mode documents) bit for bit; Gloo sums in another order,
so oxccl and Gloo are compared within rounding only (the PARITY lines give the difference).
"""

import re

import pytest

from conftest import check_summary, torchrun


@pytest.mark.parametrize("nproc,env", [(2, {}), (4, {"OXCCL_DETERMINISTIC": "1"})])
def test_ddp_fsdp2_parity(nproc, env):
    p = torchrun("ddp.py", nproc, env=env, timeout=200)
    check_summary(p, nproc, min_checks=40 if nproc == 2 else 35)
    parity = dict(re.findall(r"PARITY rank=0 (\S+) bitwise=(True|False)", p.stdout))
    variants = ["ddp/no_hook", "ddp/allreduce_hook", "ddp/fp16_compress_hook", "fsdp2"]
    assert all(v in parity for v in variants), parity
    for v in ["ddp-oxccl-vs-reference/no_hook", "ddp-oxccl-vs-reference/allreduce_hook",
              "ddp-oxccl-vs-reference/fp16_compress_hook", "fsdp2-oxccl-vs-reference"]:
        assert parity.get(v) == "True", f"{v}: {parity}"
    if nproc == 2:
        assert all(parity[v] == "True" for v in variants), parity

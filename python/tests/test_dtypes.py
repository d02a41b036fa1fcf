"""Every numpy and torch element type (workers/dtypes.py): reduced exactly, moved exactly, or
refused by name; the list oxccl.data_types() gives is what reductions take and what their
refusals print. At 2 and 3 ranks (3: logical reductions of bool that differ from 2's)."""

import pytest

from conftest import check_summary, torchrun


@pytest.mark.parametrize("nproc", [2, 3])
def test_every_dtype_is_exact_or_refused_by_name(nproc):
    p = torchrun("dtypes.py", nproc, timeout=150)
    check_summary(p, nproc, min_checks=230)

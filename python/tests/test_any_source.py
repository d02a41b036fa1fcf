"""Receives from any rank (workers/anysource.py): oxccl.Communicator.recv without a peer,
synchronous and asynchronous, and torch.distributed's recv / irecv without src, at 3 ranks
(rank 0 receives and checks; the others send)."""

from conftest import check_summary, torchrun


def test_receive_from_any_rank_names_each_sender():
    p = torchrun("anysource.py", 3, timeout=150)
    found = check_summary(p, 3, min_checks=0)
    assert found[0][0] >= 40, f"rank 0 made {found[0][0]} checks; output:\n{p.stdout[-6000:]}"

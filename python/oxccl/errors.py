"""oxccl's exceptions: one class per kind of failure, each carrying the library's message.

Every exception oxccl raises is an `oxccl.Error`. The subclasses say what went wrong, so a
program can tell a bad call of its own from a lost peer:

- `InvalidArgumentError` (also a `ValueError`): an argument is wrong; the message names it.
- `MismatchError`: this rank's call and a peer's differ (the message names both calls).
- `PeerGoneError`: a peer's process ended or failed (`.peer` is its rank when known).
- `TimeoutError` (also the built-in `TimeoutError`): a call waited longer than the
  communicator's timeout (the message says for which ranks).
- `AbortedError`: the communicator was aborted.
- `RendezvousError`: setting the communicator up failed (launcher variables, store, root).
"""

import builtins


class Error(RuntimeError):
    """An oxccl failure. `rank` is the rank that raised it, `peer` the other rank it names
    (or None)."""

    def __init__(self, message, rank=None, peer=None):
        super().__init__(message)
        self.rank = rank
        self.peer = peer


class InvalidArgumentError(Error, ValueError):
    """A bad argument or a call not allowed in the communicator's state."""


class MismatchError(Error):
    """This rank's call differs from a peer's (collective, type, count, operator, root or
    order)."""


class PeerGoneError(Error):
    """A peer ended or failed while this rank needed it."""


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 - deliberately oxccl.TimeoutError
    """A call waited longer than the communicator's timeout."""


class AbortedError(Error):
    """The communicator was aborted."""


class RendezvousError(Error):
    """The communicator could not be set up (launcher, store or rendezvous root)."""


__all__ = [
    "Error",
    "InvalidArgumentError",
    "MismatchError",
    "PeerGoneError",
    "TimeoutError",
    "AbortedError",
    "RendezvousError",
]

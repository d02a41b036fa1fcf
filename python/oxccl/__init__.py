"""oxccl: collectives and send/recv for Python, on numpy arrays and torch tensors.

    import numpy as np, oxccl
    comm = oxccl.Communicator()          # under torchrun, Slurm or mpirun
    x = np.full(4, comm.rank, np.float32)
    comm.all_reduce(x)                   # in place: every rank holds the sum
    work = comm.all_reduce(x, async_op=True)
    work.wait()

`import oxccl.torch` registers the torch.distributed backend "oxccl".

Buffers are contiguous numpy arrays, torch tensors (CPU, or CUDA on the current stream) or
anything with the buffer protocol; their element type gives the data type (`dtype=` names
one, e.g. "bfloat16" over a uint16 array). Operators: "sum", "prod", "max", "min", "avg",
"band", "bor", "bxor". A buffer of an asynchronous call belongs to the call until its Work
is complete: do not write it (nor read an output) before `wait()`.
"""

from . import errors
from .errors import (
    AbortedError,
    Error,
    InvalidArgumentError,
    MismatchError,
    PeerGoneError,
    RendezvousError,
    TimeoutError,
)
from ._oxccl import Communicator, GroupCall, Work, __version__, data_types, unique_id

__all__ = [
    "Communicator",
    "GroupCall",
    "Work",
    "unique_id",
    "data_types",
    "errors",
    "Error",
    "InvalidArgumentError",
    "MismatchError",
    "PeerGoneError",
    "TimeoutError",
    "AbortedError",
    "RendezvousError",
    "__version__",
]

"""Inputs and independent references for the torch workers.

Reductions take their inputs from small sets whose every partial result is exact in every
data type at up to 4 ranks, whatever the order of the reduction: signed types {-2, -1, 1, 2}
(sums within ±8, products ±1, ±2, ±4, ±8, ±16, averages k/4: all exact in fp8 e5m2, which has
two mantissa bits), unsigned types {1, 2, 3} (sums ≤ 12, products ≤ 81). The reference
reduces every rank's inputs (each rank can make them all: they depend only on rank and salt)
in float64 or int64 and casts once to the data type. Bitwise operators take random bit
patterns, and the movement collectives random bytes (NaNs included): those are compared bit
for bit.
"""

import functools

import torch
import torch.distributed as dist

R = dist.ReduceOp

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2]
INTS = [torch.int8, torch.uint8, torch.int32, torch.uint32, torch.int64, torch.uint64]
DTYPES = INTS + FLOATS
UNSIGNED = {torch.uint8, torch.uint32, torch.uint64, torch.bool}
SIGNED_OF = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

ARITH = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
BITWISE = ["BAND", "BOR", "BXOR"]


def ops_for(dtype):
    """Operator names to check for `dtype` (PREMUL_SUM: floats only, as torch's NCCL)."""
    if dtype == torch.bool:
        return ["MIN", "MAX"]
    if dtype.is_floating_point:
        return ARITH + ["PREMUL_SUM"]
    return ARITH + BITWISE


def torch_op(name, factor=2.0):
    if name == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(factor)
    return getattr(R, name)


def _gen(rank, salt):
    return torch.Generator().manual_seed(1_000_003 * salt + 7919 * rank + 17)


def red_input(rank, n, dtype, op, salt):
    """Rank `rank`'s input: (tensor of `dtype`, the same values as float64/int64 for the
    reference)."""
    g = _gen(rank, salt)
    if op in BITWISE:
        raw = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=g)
        t = raw.view(dtype).clone()
        return t, t.view(SIGNED_OF[dtype.itemsize]).to(torch.int64)
    if dtype == torch.bool:
        v = torch.randint(0, 2, (n,), generator=g).to(torch.int64)
        return v.to(torch.bool), v
    vals = [1, 2, 3] if dtype in UNSIGNED else [-2, -1, 1, 2]
    idx = torch.randint(0, len(vals), (n,), generator=g)
    wide = torch.tensor(vals, dtype=torch.float64 if dtype.is_floating_point else torch.int64)[idx]
    return wide.to(dtype), wide


def reference(op, dtype, wides, p, factor=2.0):
    """The reduction of `wides` (one per rank, float64 or int64) as `dtype`."""
    s = torch.stack(wides)
    if op in BITWISE:
        f = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
        out = functools.reduce(f, list(s))
        return out.to(SIGNED_OF[dtype.itemsize]).view(dtype)
    if op == "SUM":
        out = s.sum(0)
    elif op == "PRODUCT":
        out = s.prod(0)
    elif op == "MIN":
        out = s.min(0).values
    elif op == "MAX":
        out = s.max(0).values
    elif op == "AVG":
        # Floats: the exact quotient. Integers: the library's documented semantics (oxccl-core
        # dtype.rs ReduceOp::Avg, reduce.rs finalize): the sum divided by the rank count,
        # truncated toward zero.
        out = s.sum(0) / p if dtype.is_floating_point else torch.div(s.sum(0), p, rounding_mode="trunc")
    elif op == "PREMUL_SUM":
        out = (s * factor).sum(0)
    else:
        raise ValueError(op)
    return out.to(dtype)


def rand_bits(n, dtype, rank, salt, shape=None):
    """Random bytes (every bit pattern, NaNs included) viewed as `dtype` (bool: 0/1)."""
    g = _gen(rank, salt + 500_000)
    if dtype == torch.bool:
        t = torch.randint(0, 2, (n,), generator=g).to(torch.bool)
    else:
        t = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=g).view(dtype).clone()
    return t.reshape(shape) if shape is not None else t


def filled(n, dtype):
    """A tensor of `dtype` whose bytes are 0xA5 (to see what a call left unwritten)."""
    if dtype == torch.bool:
        return torch.ones(n, dtype=torch.bool)
    return torch.full((n * dtype.itemsize,), 0xA5, dtype=torch.uint8).view(dtype).clone()


def name(dtype):
    return str(dtype).replace("torch.", "")

"""The codes ``mooncake.pg`` hands the native collectives for a tensor's dtype and a reduce
op (``collective/src/reduce.rs`` reads them). Kept apart from ``pg`` so that the table of
codes is one screen, not a part of the process group's file.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed import ReduceOp

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.int8: 0,
    torch.uint8: 1,
    torch.int16: 2,
    torch.uint16: 3,
    torch.int32: 4,
    torch.uint32: 5,
    torch.int64: 6,
    torch.uint64: 7,
    torch.float16: 8,
    torch.float32: 9,
    torch.float64: 10,
    torch.bfloat16: 11,
    torch.bool: 12,
}
for _code, _name in enumerate(
    ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"], 13
):
    if hasattr(torch, _name):
        DTYPE_CODES[getattr(torch, _name)] = _code

_REDUCE: Any = ReduceOp.RedOpType  # torch's stubs do not list its members
OP_CODES: dict[Any, int] = {
    _REDUCE.SUM: 0,
    _REDUCE.AVG: 1,
    _REDUCE.PRODUCT: 2,
    _REDUCE.MIN: 3,
    _REDUCE.MAX: 4,
}


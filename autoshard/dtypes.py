"""Element types: bytes per element, the numpy type used to evaluate them, the MLIR spelling."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class DType:
    name: str
    itemsize: int
    numpy: type  # evaluation type; bf16 and f8 are evaluated in f32 (numpy has neither)
    mlir: str
    is_float: bool


DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("f64", 8, np.float64, "f64", True),
    DType("f32", 4, np.float32, "f32", True),
    DType("bf16", 2, np.float32, "bf16", True),
    DType("f16", 2, np.float16, "f16", True),
    DType("f8", 1, np.float32, "f8E4M3FN", True),
    DType("i64", 8, np.int64, "i64", False),
    DType("i32", 4, np.int32, "i32", False),
    DType("bool", 1, np.bool_, "i1", False),
)}


def dtype(name: str) -> DType:
    return DTYPES[name]

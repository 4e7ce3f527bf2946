"""Deterministic MLIR text: SSA names from readable hints, indented lines, types, constants."""

from __future__ import annotations

import math
import re
import struct
from typing import Sequence

from autoshard.dtypes import DTYPES

_NOT_ID = re.compile(r"[^A-Za-z0-9_$.]")


class Body:
    """Lines of one function body with unique SSA names (unique across nested regions too)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.taken: set[str] = set()
        self.last_suffix: dict[str, int] = {}  # per base, the suffix it last got: every one below is taken
        self.depth = 1

    def name(self, hint: str) -> str:
        """A fresh `%name` from `hint`: `%hint`, else `%hint_1`, `%hint_2`, ..., the first one free.
        Names are never freed, so the search for a base resumes where it last stopped: a module
        with thousands of `%in` stays linear."""
        base = _NOT_ID.sub("_", hint) or "v"
        if not (base[0].isalpha() or base[0] == "_"):
            base = "v" + base
        n = self.last_suffix.get(base, 0)
        candidate = f"{base}_{n}" if n else base
        while candidate in self.taken:
            n += 1
            candidate = f"{base}_{n}"
        self.taken.add(candidate)
        self.last_suffix[base] = n
        return "%" + candidate

    def emit(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    def comment(self, text: str) -> None:
        self.emit("// " + text)


def elem_type(dtype: str) -> str:
    return DTYPES[dtype].mlir


def tensor_type(shape: Sequence[int], dtype: str) -> str:
    dims = "".join(f"{s}x" for s in shape)
    return f"tensor<{dims}{elem_type(dtype)}>"


def int_list(values: Sequence[int]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


# Bit patterns of -inf and +inf; f8E4M3FN has no infinities (its extremes are +-448).
_INF_BITS = {"f64": ("0xFFF0000000000000", "0x7FF0000000000000"), "f32": ("0xFF800000", "0x7F800000"),
             "f16": ("0xFC00", "0x7C00"), "bf16": ("0xFF80", "0x7F80")}


def float_literal(value: float, dtype: str) -> str:
    """An MLIR float literal for `value` in `dtype` (hex bit patterns for infinities)."""
    if math.isinf(value):
        if dtype in _INF_BITS:
            return _INF_BITS[dtype][value > 0]
        return f"{math.copysign(448.0, value):.6e}"
    return f"{value:.17e}" if dtype == "f64" else f"{struct.unpack('f', struct.pack('f', value))[0]:.9e}"

"""The reduction kinds, in one table: what `sum`, `max`, `min` and `product` mean wherever a
value is reduced (a partial sharding's kind, an op's reduction loops, a collective's
`reduction` attribute).

Each row holds the facts its readers need: the neutral element per dtype (what a device with
nothing to reduce contributes, and a reduction's initial value in the IR), the numpy functions
that combine two partial values and fold an array over dims, the payload that is its combiner
(the IR printer lowers that payload to `arith`), whether combining a value with itself gives it
back (then a replicated value is a valid partial one), and the elementwise op kinds through
which a partial value may pass before its reduction.

It is part of the vocabulary (it imports numpy only), below `sharding`, which checks partial
kinds against it, so every package may read it: `ops` (folding reduction loops), `resharding`
(which partial targets can be reached), `spmd` (moving reductions across ops), `mlir`
(combiners and initial values) and `sim` (partial values and collectives).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


def _zero(dtype: np.dtype) -> Any:
    return dtype.type(0)


def _one(dtype: np.dtype) -> Any:
    return dtype.type(1)


def _lowest(dtype: np.dtype) -> Any:
    if dtype == np.bool_:
        return np.bool_(False)
    if np.issubdtype(dtype, np.floating):
        return dtype.type(-np.inf)
    return dtype.type(np.iinfo(dtype).min)


def _highest(dtype: np.dtype) -> Any:
    if dtype == np.bool_:
        return np.bool_(True)
    if np.issubdtype(dtype, np.floating):
        return dtype.type(np.inf)
    return dtype.type(np.iinfo(dtype).max)


@dataclass(frozen=True, slots=True)
class Reduction:
    name: str
    neutral: Callable[[np.dtype], Any]  # dtype -> its neutral element
    pairwise: np.ufunc  # combines two partial values elementwise
    fold: Callable[..., np.ndarray]  # folds an array over `axis` (keepdims=...) as numpy reduces
    combiner: str  # the payload that is this reduction's combiner (`acc = payload(acc, value)`)
    idempotent: bool  # combining a value with itself gives it back
    passes_through: tuple[str, ...]  # elementwise op kinds f with reduce(f(a, b)) == f(reduce(a), reduce(b))

    def identity(self, dtype: Any) -> Any:
        """The neutral element in numpy `dtype` (a numpy scalar)."""
        return self.neutral(np.dtype(dtype))


REDUCTIONS: dict[str, Reduction] = {r.name: r for r in (
    Reduction("sum", _zero, np.add, np.sum, "add", False, ("add", "sub")),
    Reduction("max", _lowest, np.maximum, np.max, "max", True, ("max",)),
    Reduction("min", _highest, np.minimum, np.min, "min", True, ("min",)),
    Reduction("product", _one, np.multiply, np.prod, "mul", False, ()),
)}
REDUCTION_KINDS = tuple(REDUCTIONS)
BY_COMBINER: dict[str, Reduction] = {r.combiner: r for r in REDUCTIONS.values()}

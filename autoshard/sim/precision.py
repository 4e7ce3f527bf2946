"""The precision a simulation computes floats in.

A sharded program adds split sums in another order than the unsharded reference. In the declared
precision those rounding differences are amplified by ill-conditioned ops (an optimiser's
`m / (sqrt(v) + eps)` turns a last-bit difference of a gradient into a visible one), and could not
be told from a wrong plan by any fixed tolerance. Computing every float tensor in float64, on
every device and in the reference alike, shrinks the rounding by nine orders of magnitude while
a wrong plan still errs at the scale of the values: so the simulator proves plans in float64.
Integer and boolean tensors keep their types (and are compared exactly).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from autoshard.dtypes import DTYPES
from autoshard.graph.model import Graph, Op

WIDE = "f64"


def widen_dtype(dtype: str) -> str:
    return WIDE if DTYPES[dtype].is_float else dtype


def widen_op(op: Op) -> Op:
    """The op computing in float64 where it would compute a float: a float its `dtype` attribute
    names (a cast's target, a contraction's or reduction's result) becomes f64."""
    target = op.attrs.get("dtype")
    if target in DTYPES and DTYPES[target].is_float:
        return dataclasses.replace(op, attrs={**op.attrs, "dtype": WIDE})
    return op


def widen_graph(graph: Graph) -> Graph:
    """The graph with every float tensor (and every float an op's `dtype` attribute names) in float64."""
    tensors = {name: dataclasses.replace(t, dtype=widen_dtype(t.dtype)) for name, t in graph.tensors.items()}
    return dataclasses.replace(graph, tensors=tensors, ops=tuple(widen_op(op) for op in graph.ops))


def widen_inputs(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a for name, a in inputs.items()}

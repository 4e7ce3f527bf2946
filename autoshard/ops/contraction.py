"""Contractions: `matmul`, `batch_matmul`, `dot_general` (mul payload, sum over contracting loops).

All three are one loop nest whose maps are projections; numpy evaluates them with `einsum`
built from the maps, so the maps are the single source of truth for what is contracted.
"""

from __future__ import annotations

import string
from typing import Sequence

import numpy as np

from autoshard.affine import AffineExpr, AffineMap
from autoshard.ops.loops import PARALLEL, REDUCTION, LoopNest
from autoshard.ops.table import (Attrs, Context, OpError, OpKind, Shape, accumulated_dtype, in_accumulated_dtype, int_list_attr,
                                 register, shape_error)


def _projection(num_loops: int, loops: Sequence[int]) -> AffineMap:
    return AffineMap(num_loops, tuple(AffineExpr.loop(l) for l in loops))


def einsum_compute(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    letters = string.ascii_letters
    subs = [
        "".join(letters[expr.single_loop()] for expr in m.results)  # type: ignore[index]
        for m in ctx.nest.input_maps + ctx.nest.output_maps
    ]
    spec = ",".join(subs[:-1]) + "->" + subs[-1]
    return [np.einsum(spec, *inputs, optimize=True)]


def _contraction_flops(nest: LoopNest, attrs: Attrs) -> float:
    return 2.0 * nest.points()


def dot_general_nest(lhs: Shape, rhs: Shape, lhs_batch: Sequence[int], rhs_batch: Sequence[int],
                     lhs_contract: Sequence[int], rhs_contract: Sequence[int]) -> LoopNest:
    """Loops: batch dims, lhs free dims, rhs free dims (the output order), then contracting dims."""
    for name, dims, shape in (("lhs_batch_dims", lhs_batch, lhs), ("lhs_contracting_dims", lhs_contract, lhs),
                              ("rhs_batch_dims", rhs_batch, rhs), ("rhs_contracting_dims", rhs_contract, rhs)):
        if any(not 0 <= d < len(shape) for d in dims) or len(set(dims)) != len(dims):
            raise OpError(f"{name} {list(dims)} are not distinct dims of a rank-{len(shape)} operand", name)
    if len(lhs_batch) != len(rhs_batch) or len(lhs_contract) != len(rhs_contract):
        raise OpError("lhs and rhs need as many batch dims and as many contracting dims as each other")
    if set(lhs_batch) & set(lhs_contract) or set(rhs_batch) & set(rhs_contract):
        raise OpError("a dim cannot be both a batch and a contracting dim")
    for a, b in list(zip(lhs_batch, rhs_batch)) + list(zip(lhs_contract, rhs_contract)):
        if lhs[a] != rhs[b]:
            raise OpError(f"lhs dim {a} has size {lhs[a]} but the rhs dim it pairs with ({b}) has size {rhs[b]}")
    lhs_free = [d for d in range(len(lhs)) if d not in lhs_batch and d not in lhs_contract]
    rhs_free = [d for d in range(len(rhs)) if d not in rhs_batch and d not in rhs_contract]
    nb, nl, nr, nc = len(lhs_batch), len(lhs_free), len(rhs_free), len(lhs_contract)
    n = nb + nl + nr + nc
    lhs_loop = {d: i for i, d in enumerate(lhs_batch)} | {d: nb + i for i, d in enumerate(lhs_free)} \
        | {d: nb + nl + nr + i for i, d in enumerate(lhs_contract)}
    rhs_loop = {d: i for i, d in enumerate(rhs_batch)} | {d: nb + nl + i for i, d in enumerate(rhs_free)} \
        | {d: nb + nl + nr + i for i, d in enumerate(rhs_contract)}
    extents = [lhs[d] for d in lhs_batch] + [lhs[d] for d in lhs_free] + [rhs[d] for d in rhs_free] \
        + [lhs[d] for d in lhs_contract]
    iterators = (PARALLEL,) * (nb + nl + nr) + (REDUCTION,) * nc
    return LoopNest(tuple(extents), iterators,
                    (_projection(n, [lhs_loop[d] for d in range(len(lhs))]),
                     _projection(n, [rhs_loop[d] for d in range(len(rhs))])),
                    (_projection(n, range(nb + nl + nr)),))


def _matmul_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    lhs, rhs = shapes
    if len(lhs) < 2 or len(rhs) != 2 or lhs[-1] != rhs[0]:
        raise shape_error("lhs [..., M, K] and rhs [K, N]", shapes)
    return dot_general_nest(lhs, rhs, (), (), (len(lhs) - 1,), (0,))


def _batch_matmul_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    lhs, rhs = shapes
    if len(lhs) < 3 or len(lhs) != len(rhs) or lhs[:-2] != rhs[:-2] or lhs[-1] != rhs[-2]:
        raise shape_error("lhs [B..., M, K] and rhs [B..., K, N] with equal batch dims", shapes)
    batch = tuple(range(len(lhs) - 2))
    return dot_general_nest(lhs, rhs, batch, batch, (len(lhs) - 1,), (len(rhs) - 2,))


def _dot_general_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    lhs, rhs = shapes
    return dot_general_nest(lhs, rhs, int_list_attr(attrs, "lhs_batch_dims", ()), int_list_attr(attrs, "rhs_batch_dims", ()),
                            int_list_attr(attrs, "lhs_contracting_dims"), int_list_attr(attrs, "rhs_contracting_dims"))


register(OpKind("matmul", (2, 2), _matmul_loops, einsum_compute, _contraction_flops, payload="mul",
                doc="[..., M, K] x [K, N] -> [..., M, N]"))
register(OpKind("batch_matmul", (2, 2), _batch_matmul_loops, einsum_compute, _contraction_flops, payload="mul",
                doc="[B..., M, K] x [B..., K, N] -> [B..., M, N]"))
register(OpKind("dot_general", (2, 2), _dot_general_loops, in_accumulated_dtype(einsum_compute), _contraction_flops,
                accumulated_dtype, payload="mul",
                attrs=("lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims", "rhs_contracting_dims", "dtype"),
                doc="XLA dot_general: output dims are batch, lhs free, rhs free; result in attribute dtype "
                    "(default the operands')"))

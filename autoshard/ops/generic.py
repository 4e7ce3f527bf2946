"""`generic`: an op given by its own iterator types, indexing maps and payload (linalg.generic)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoshard.affine import AffineMap
from autoshard.errors import InputError
from autoshard.ops.interpret import interpret
from autoshard.ops.loops import INVALID, PARALLEL, REDUCTION, LoopNest
from autoshard.ops.payloads import PAYLOADS
from autoshard.ops.table import Attrs, Context, OpError, OpKind, Shape, register
from autoshard.reductions import REDUCTIONS

# Accepted iterator spellings: the seeds' `reduction_sum` etc., and plain `reduction` (sum).
ITERATOR_SPELLINGS = {
    "parallel": (PARALLEL, None), "invalid": (INVALID, None), "reduction": (REDUCTION, None),
    **{f"reduction_{kind}": (REDUCTION, kind) for kind in REDUCTIONS},
}


def _parse_maps(attrs: Attrs) -> list[AffineMap]:
    maps = attrs.get("indexing_maps")
    if not isinstance(maps, (list, tuple)) or not maps:
        raise OpError("a generic op needs indexing_maps: one per input, then one for the output", "indexing_maps")
    parsed = []
    for i, text in enumerate(maps):
        try:
            parsed.append(AffineMap.parse(text))
        except InputError as error:
            raise OpError(f"map {i}: {error.problems[0].message}", f"indexing_maps/{i}") from None
    return parsed


def generic_iterators(attrs: Attrs) -> tuple[tuple[str, ...], str | None]:
    raw = attrs.get("iterator_types")
    if not isinstance(raw, (list, tuple)) or not raw:
        raise OpError(f"iterator_types must be a list of {sorted(ITERATOR_SPELLINGS)}", "iterator_types")
    kinds, reduction = [], None
    for i, name in enumerate(raw):
        if name not in ITERATOR_SPELLINGS:
            raise OpError(f"unknown iterator type {name!r}; expected one of {sorted(ITERATOR_SPELLINGS)}", f"iterator_types/{i}")
        kind, red = ITERATOR_SPELLINGS[name]
        if red and reduction and red != reduction:
            raise OpError("all reduction loops of one op must share one reduction kind", f"iterator_types/{i}")
        reduction = red or reduction
        kinds.append(kind)
    return tuple(kinds), reduction


def combiner_form(attrs: Attrs, num_inputs: int, has_reduction: bool) -> bool:
    payload = PAYLOADS[attrs["payload"]]
    return has_reduction and payload.arity == num_inputs + 1


def _generic_loops(operand_shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    """`operand_shapes` are the inputs' then the declared output's: as in linalg, every operand
    (the output too) may fix loop extents."""
    shapes = operand_shapes[:-1]
    iterators, reduction = generic_iterators(attrs)
    maps = _parse_maps(attrs)
    name = attrs.get("payload")
    if name not in PAYLOADS:
        raise OpError(f"unknown payload {name!r}; expected one of {sorted(PAYLOADS)}", "payload")
    payload = PAYLOADS[name]
    if len(maps) != len(shapes) + 1:
        raise OpError(f"expected {len(shapes) + 1} indexing maps (one per input, then the output), got {len(maps)}", "indexing_maps")
    for i, m in enumerate(maps):
        if m.num_loops != len(iterators):
            raise OpError(f"map {i} has {m.num_loops} loops but there are {len(iterators)} iterator types", f"indexing_maps/{i}")
    has_reduction = REDUCTION in iterators
    if combiner_form(attrs, len(shapes), has_reduction):
        if payload.combiner_of is None or len(shapes) != 1:
            raise OpError(f"payload {name!r} cannot fold a reduction; use add, mul, max or min", "payload")
        if reduction and reduction != payload.combiner_of:
            raise OpError(f"payload {name!r} folds with {payload.combiner_of}, but the iterators say {reduction}", "payload")
        reduction = payload.combiner_of
    elif payload.arity != len(shapes):
        raise OpError(f"payload {name!r} takes {payload.arity} operand(s) but the op has {len(shapes)} input(s)", "payload")
    out_map = maps[-1]
    for loop, kind in enumerate(iterators):
        if kind == REDUCTION and any(loop in e.loops for e in out_map.results):
            raise OpError(f"reduction loop d{loop} must not index the output", "indexing_maps")
        if kind == PARALLEL and not any(loop in e.loops for e in out_map.results):
            raise OpError(f"parallel loop d{loop} does not index the output", "indexing_maps")
    extents = infer_extents(maps, operand_shapes, len(iterators))
    for i, (m, shape) in enumerate(zip(maps, operand_shapes)):  # every index a map makes lies in its operand
        for dim, (expr, size) in enumerate(zip(m.results, shape)):
            low, high = expr.bounds(extents)
            if low < 0 or high >= size:
                raise OpError(f"map {i} reads indices {low}..{high} of dim {dim}, which has size {size}",
                              f"indexing_maps/{i}")
    return LoopNest(extents, iterators, tuple(maps[:-1]), (out_map,), reduction or "sum")


def infer_extents(maps: Sequence[AffineMap], shapes: Sequence[Shape], num_loops: int) -> tuple[int, ...]:
    """Each loop's extent, read off an operand dim it indexes alone (`d_i`)."""
    extents: list[int | None] = [None] * num_loops
    for i, (m, shape) in enumerate(zip(maps, shapes)):
        if m.rank != len(shape):
            raise OpError(f"map {i} has {m.rank} results but operand {i} has rank {len(shape)}", f"indexing_maps/{i}")
        for expr, size in zip(m.results, shape):
            loop = expr.single_loop()
            if loop is None:
                continue
            if extents[loop] is not None and extents[loop] != size:
                raise OpError(f"loop d{loop} has extent {extents[loop]} from one operand and {size} from operand {i}", f"indexing_maps/{i}")
            extents[loop] = size
    missing = [f"d{l}" for l, e in enumerate(extents) if e is None]
    if missing:
        raise OpError(f"the extent of {', '.join(missing)} is not fixed by any operand dim indexed by that loop alone", "indexing_maps")
    return tuple(e for e in extents if e is not None)


def _generic_compute(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    nest = ctx.nest
    origins = [tuple(expr.range_over(ctx.block.starts, ctx.block.sizes)[0] for expr in m.results) for m in nest.input_maps]
    origins = [tuple(max(o, 0) for o in origin) for origin in origins]
    form = combiner_form(ctx.attrs, len(inputs), bool(nest.reduction_loops))
    return [interpret(nest, PAYLOADS[ctx.attrs["payload"]], inputs, ctx.block, origins, form)]


def _generic_flops(nest: LoopNest, attrs: Attrs) -> float:
    return PAYLOADS[attrs["payload"]].flops * nest.points() if attrs.get("payload") in PAYLOADS else nest.points()


def _declared_dtype(in_dtypes: Sequence[str], attrs: Attrs) -> tuple[None]:
    # A generic op may accumulate in a wider type than its inputs (as linalg.generic does).
    return (None,)


register(OpKind(
    "generic", (0, None), _generic_loops, _generic_compute, _generic_flops, _declared_dtype, reads_output_shapes=True,
    attrs=("iterator_types", "indexing_maps", "payload"),
    doc="Any loop nest: iterator_types, indexing_maps (inputs then output), a payload from the payload table.",
))

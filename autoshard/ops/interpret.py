"""A direct interpreter of a loop nest with a scalar payload, vectorised with numpy.

It reads every operand through its indexing map at every point of the block, applies the
payload, folds the reduction loops with the reduction kind and writes through the result map.
It is the semantics of `generic` ops, and the oracle the tests hold every payload op against.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoshard.affine import AffineMap
from autoshard.ops.loops import REDUCTION, Block, LoopNest
from autoshard.ops.payloads import Payload
from autoshard.reductions import REDUCTIONS


def _index_grids(map_: AffineMap, block: Block, origin: Sequence[int]) -> tuple[np.ndarray, ...]:
    """Per tensor dim, the index each point of the block reads, relative to `origin`."""
    rank = len(block.sizes)
    grids = []
    for dim, expr in enumerate(map_.results):
        index = np.full((1,) * rank, expr.const - origin[dim], dtype=np.int64)
        for loop, coeff in expr.terms:
            shape = [1] * rank
            shape[loop] = block.sizes[loop]
            index = index + coeff * (block.starts[loop] + np.arange(block.sizes[loop]).reshape(shape))
        grids.append(index)
    return tuple(grids)


def interpret(nest: LoopNest, payload: Payload, inputs: Sequence[np.ndarray], block: Block,
              origins: Sequence[Sequence[int]], combiner_form: bool) -> np.ndarray:
    """Evaluate the single result of a payload loop nest on `block`.

    `origins[i]` is the global index of `inputs[i][0, 0, ...]` (inputs may be cut to the block).
    With `combiner_form` the payload is the reduction combiner and folds the one input.
    """
    full = tuple(block.sizes)
    values = []
    for x, m, origin in zip(inputs, nest.input_maps, origins):
        grids = _index_grids(m, block, origin)
        values.append(np.broadcast_to(x[grids] if grids else x, full) if grids else np.broadcast_to(x, full))
    point = values[0] if combiner_form else payload.fn(*values)
    reductions = tuple(i for i, t in enumerate(nest.iterator_types) if t == REDUCTION)
    if reductions:
        point = REDUCTIONS[nest.reduction_kind].fold(point, axis=reductions, keepdims=True)
    out_map = nest.output_maps[0]
    out_block = Block(block.starts, tuple(1 if i in reductions else s for i, s in enumerate(block.sizes)), block.extents)
    out_origin = tuple(expr.range_over(block.starts, block.sizes)[0] for expr in out_map.results)
    grids = _index_grids(out_map, out_block, out_origin)
    out_shape = tuple(expr.range_over(block.starts, block.sizes)[1] - o + 1 for expr, o in zip(out_map.results, out_origin))
    out = np.zeros(out_shape, dtype=np.result_type(point))
    point = np.broadcast_to(point, out_block.sizes)
    if grids:
        out[tuple(np.broadcast_to(g, out_block.sizes) for g in grids)] = point
    else:
        out[()] = point.reshape(-1)[0]
    return out

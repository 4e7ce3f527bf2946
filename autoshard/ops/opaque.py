"""`opaque`: an op autoshard cannot see into (a framework primitive without a row), kept whole.

Every loop is `invalid`, so the op runs unsplit on every device: its inputs are gathered and its
result is replicated, which is correct whatever the op computes. Its values are unknown here;
it computes zeros, so a simulated run checks only where the values are, not what they are.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoshard.affine import AffineExpr, AffineMap
from autoshard.dtypes import DTYPES
from autoshard.ops.loops import INVALID, LoopNest
from autoshard.ops.table import Attrs, Context, OpError, OpKind, Shape, int_list_attr, register


def _opaque_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    """Loops: the result's dims, then each input's dims in turn, all invalid."""
    out = int_list_attr(attrs, "shape")
    extents = list(out)
    maps = []
    for shape in shapes:
        first = len(extents)
        extents.extend(shape)
        maps.append(tuple(AffineExpr.loop(first + d) for d in range(len(shape))))
    n = len(extents)
    return LoopNest(tuple(extents), (INVALID,) * n, tuple(AffineMap(n, m) for m in maps),
                    (AffineMap(n, tuple(AffineExpr.loop(d) for d in range(len(out)))),))


def _opaque(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    return [np.zeros(ctx.out_shapes[0], DTYPES[ctx.attrs["dtype"]].numpy)]


def _opaque_dtype(in_dtypes: Sequence[str], attrs: Attrs) -> tuple[str, ...]:
    if attrs.get("dtype") not in DTYPES:
        raise OpError(f"attribute 'dtype' must be one of {sorted(DTYPES)}, got {attrs.get('dtype')!r}", "dtype")
    return (attrs["dtype"],)


register(OpKind("opaque", (0, None), _opaque_loops, _opaque, lambda nest, attrs: 0.0, _opaque_dtype,
                attrs=("shape", "dtype", "primitive"),
                doc="an op of attribute shape and dtype that is not split (attribute primitive names what it was)"))

"""The row for `conv_general_dilated`: the op table's channels-last `conv1d`/`conv2d`/`conv3d`
(x [N, spatial.., C], filter [K.., C, F]), with `transpose`s into and out of that layout where
the equation's dimension numbers say another (jax's default NCHW/OIHW). Dilations and grouped
convolutions have no op: such equations are `Unsupported`."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoshard.frontends.jax.rows import Emit, Unsupported
from autoshard.frontends.jax.trace import FlatEqn


def conv_general_dilated(e: Emit, eqn: FlatEqn) -> list[str]:
    params = eqn.params
    lhs, rhs = eqn.inputs
    rank = len(e.shape(lhs)) - 2
    numbers = params["dimension_numbers"]
    if rank not in (1, 2, 3):
        raise Unsupported(f"a convolution over {rank} spatial dims (the op table has 1 to 3)")
    for name in ("lhs_dilation", "rhs_dilation"):
        if any(int(d) != 1 for d in params[name]):
            raise Unsupported(f"{name} {tuple(params[name])} (dilated convolutions have no op)")
    for name in ("feature_group_count", "batch_group_count"):
        if int(params[name]) != 1:
            raise Unsupported(f"{name} = {params[name]} (grouped convolutions have no op)")
    padding = [[int(a), int(b)] for a, b in params["padding"]]
    if any(a < 0 or b < 0 for a, b in padding):
        raise Unsupported(f"negative padding {padding}")
    x = _transposed(e, e.tensor(lhs), (numbers.lhs_spec[0], *numbers.lhs_spec[2:], numbers.lhs_spec[1]))
    w = _transposed(e, e.tensor(rhs), (*numbers.rhs_spec[2:], numbers.rhs_spec[1], numbers.rhs_spec[0]))
    out = e.op(f"conv{rank}d", [x, w], strides=[int(s) for s in params["window_strides"]], padding=padding)
    channels_last = (numbers.out_spec[0], *numbers.out_spec[2:], numbers.out_spec[1])
    out = _transposed(e, out, tuple(int(p) for p in np.argsort(channels_last)))
    target = params.get("preferred_element_type")
    wanted = e.dtype(eqn.outputs[0])
    return [out if target is None or wanted == e.dtype(lhs) else e.op("cast", [out], dtype=wanted)]


def _transposed(e: Emit, tensor: str, perm: Sequence[int]) -> str:
    perm = [int(p) for p in perm]
    return tensor if perm == sorted(perm) else e.op("transpose", [tensor], perm=perm)

"""Compare device contents with the reference value of the tensor they stand for, device by device.

Partial values are reduced over their groups first. Floats are compared within a tolerance
scaled by the tensor's magnitude (sharded sums add in another order than the reference's);
integers and booleans must match exactly; an infinity of the reference (log(0) that a later select
discards, as T5's position buckets compute) must be the same infinity on the device. A reference
holding NaN is refused: a device computing the same NaN would otherwise pass a check that checked
nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from autoshard.dtypes import DTYPES
from autoshard.mesh import Device, Mesh
from autoshard.reductions import REDUCTIONS
from autoshard.sharding import Sharding
from autoshard.sim.collectives import Shards
from autoshard.sim.halo import local_slices
from autoshard.sim.local_op import ProgramError

# Relative tolerance per evaluation type (bf16 and f8 are evaluated in f32).
RELATIVE_TOLERANCE = {np.dtype(np.float64): 1e-9, np.dtype(np.float32): 1e-4, np.dtype(np.float16): 1e-2}


def relative_tolerance(dtype: str) -> float:
    """Error accepted per unit of a tensor's magnitude (0 for integers and booleans)."""
    return RELATIVE_TOLERANCE.get(np.dtype(DTYPES[dtype].numpy), 0.0)


def tolerance(dtype: str, reference: np.ndarray) -> float:
    """Largest absolute error accepted for a tensor of `dtype` whose reference is `reference`."""
    rel = relative_tolerance(dtype)
    if not rel:
        return 0.0
    finite = np.abs(reference[np.isfinite(reference)]) if reference.size else reference
    return rel * max(1.0, float(finite.max()) if finite.size else 1.0)


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The first element (row-major) of a device's shard outside the tolerance."""

    device: Device
    index: tuple[int, ...]  # global index into the tensor
    actual: float
    expected: float


@dataclass(frozen=True, slots=True)
class Comparison:
    max_error: float
    tolerance: float
    mismatch: Mismatch | None  # on the first device (linear order) outside the tolerance


def errors(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Absolute differences from an `expected` without NaN; 0 where both are the same infinity,
    inf where `actual` is NaN or only one of them is infinite."""
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a - e)
    return np.where(np.isinf(e) & (a == e), 0.0, np.where(np.isnan(diff), np.inf, diff))


def reduce_partial(shards: Shards, mesh: Mesh, sharding: Sharding, what: str) -> Shards:
    """Every device's value with the partial groups reduced (each group member holds the total)."""
    if not sharding.partial_axes:
        return shards
    ufunc = REDUCTIONS[sharding.partial_kind].pairwise
    out: Shards = {}
    for group in mesh.device_groups(sharding.partial_axes):
        missing = [list(d) for d in group if d not in shards]
        if missing:
            raise ProgramError(f"{what}: devices {missing} hold no value", device=tuple(missing[0]))
        shapes = {shards[d].shape for d in group}
        if len(shapes) != 1:
            raise ProgramError(f"{what}: devices {[list(d) for d in group]} are partial over "
                               f"{list(sharding.partial_axes)} but hold shapes {sorted(shapes)}", device=group[0])
        total = functools.reduce(ufunc, (shards[d] for d in group))
        out.update({d: total for d in group})
    return out


def compare_shards(shards: Shards, mesh: Mesh, sharding: Sharding, reference: np.ndarray, dtype: str,
                   what: str) -> Comparison:
    """Each device's shard (partial groups reduced) against its slice of `reference`; a halo shard's
    halos too, but not its padding outside the tensor."""
    bad = np.isnan(reference) if reference.dtype.kind in "fc" else None
    if bad is not None and bad.any():
        index = [int(i) for i in np.unravel_index(int(np.argmax(bad)), reference.shape)]
        raise ProgramError(f"{what}: the reference is NaN at {index} ({int(bad.sum())} of {reference.size} "
                           f"elements), so no device can be checked against it; the inputs leave an op outside "
                           f"its domain")
    values = reduce_partial(shards, mesh, sharding, what)
    limit = tolerance(dtype, reference)
    worst, mismatch = 0.0, None
    for device in mesh.devices():
        box = sharding.device_box(mesh, reference.shape, device)
        inside = tuple((max(a, 0), max(min(b, size), a)) for (a, b), size in zip(box, reference.shape))
        slices = tuple(slice(a, b) for a, b in inside)
        expected = reference[slices]
        actual = values.get(device)
        if actual is None:
            raise ProgramError(f"{what}: device {list(device)} holds no value", device=device)
        box_shape = tuple(b - a for a, b in box)
        if actual.shape != box_shape:
            raise ProgramError(f"{what}: device {list(device)} holds shape {list(actual.shape)}; sharding {sharding} "
                               f"of {list(reference.shape)} gives {list(box_shape)}", device=device)
        actual = actual[local_slices(inside, box)]
        err = errors(actual, expected)
        if err.size:
            worst = max(worst, float(err.max()))
        if mismatch is None and err.size and err.max() > limit:
            local = np.unravel_index(int(np.argmax(err > limit)), err.shape)
            index = tuple(int(s.start + i) for s, i in zip(slices, local))
            mismatch = Mismatch(device, index, float(actual[local]), float(expected[local]))
    return Comparison(worst, limit, mismatch)

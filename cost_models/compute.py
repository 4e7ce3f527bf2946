"""GEMM rates by shape, from a profile's measured sweep (`MatmulSweep`).

The sweep's efficiency (achieved over peak) is interpolated multilinearly in log2 of batch, m, n
and k. A batch above the largest measured is folded into m (a batched GEMM's tiles count as
those of one with its batches stacked); outside the grid a GEMM runs at the rate of the nearest
measured shape. Above it that is a floor (a larger GEMM is at least as efficient as a part of
it); below it a GEMM with one small dim is priced by the roofline's memory side, which is what
bounds it (a decode step's m of a few tokens).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from cost_models.profile import MatmulSweep


class SweepRates:
    """One sweep ready to evaluate: per dtype, the efficiency grid as an array."""

    def __init__(self, sweep: MatmulSweep):
        shape = (len(sweep.batches), len(sweep.dims), len(sweep.dims), len(sweep.dims))
        self.grids = {dtype: np.array(values, dtype=np.float64).reshape(shape)
                      for dtype, values in sweep.efficiency.items()}
        self.batches, self.dims = sweep.batches, sweep.dims

    def efficiency(self, dtype: str, batch: int, m: int, n: int, k: int) -> float:
        grid = self.grids[dtype]
        if batch > self.batches[-1]:
            m, batch = m * batch / self.batches[-1], self.batches[-1]
        coordinates = [_position(value, axis)
                       for value, axis in ((batch, self.batches), (m, self.dims), (n, self.dims), (k, self.dims))]
        total = 0.0
        for corner in itertools.product((0, 1), repeat=4):
            weight, index = 1.0, []
            for (low, fraction), side in zip(coordinates, corner):
                weight *= fraction if side else 1.0 - fraction
                index.append(min(low + side, grid.shape[len(index)] - 1))
            if weight:
                total += weight * grid[tuple(index)]
        return total


def _position(value: float, axis: list[int]) -> tuple[int, float]:
    """The grid cell holding `value` (clamped to the grid) and its fraction across, in log2."""
    if len(axis) == 1 or value <= axis[0]:
        return 0, 0.0
    if value >= axis[-1]:
        return len(axis) - 1, 0.0
    logs = [math.log2(a) for a in axis]
    x = math.log2(value)
    low = max(i for i, a in enumerate(logs) if a <= x)
    return low, (x - logs[low]) / (logs[low + 1] - logs[low])

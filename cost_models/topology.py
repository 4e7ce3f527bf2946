"""A profile bound to a logical mesh: collective times per group of mesh axes, compute and memory rates.

`bind(profile, axis_names, axis_sizes, ...)` decides the physical placement of every mesh axis
(see `binding.py`) and returns a `BoundTopology`. Its `collective_seconds(kind, axes, bytes)` is
called by the planner and the solver many thousands of times: the group structure of each
`(kind, axes)` is worked out once and cached, so a call is a dict lookup plus a few float ops.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, Sequence

from cost_models.bandwidth import algbw_bytes_per_s, busbw_bytes_per_s
from cost_models.binding import Segment, Segments, default_segments, mapped_segments, unsplit_count
from cost_models.collectives import COLLECTIVE_KINDS, GroupCost, Protocols, Ramp
from cost_models.compute import SweepRates
from cost_models.errors import BindingError, TopologyError
from cost_models.levels import NetworkLevel, SwitchLevel, TorusDim, TorusLevel
from cost_models.machine import Machine, gpu_machine, tpu_machines
from cost_models.profile import GpuProfile, TpuProfile, load_profile

# Large enough that latency and the bandwidth ramp no longer matter for an axis's rate.
_LARGE_MESSAGE_BYTES = float(2**40)


@dataclass(frozen=True, eq=False)  # identity hash: callers may key caches on a bound topology
class BoundTopology:
    profile: GpuProfile | TpuProfile
    machine: Machine
    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    segments: Segments
    _costs: dict[tuple[str, tuple[str, ...]], GroupCost] = field(default_factory=dict, init=False, repr=False,
                                                                 compare=False)
    _gemm_rates: dict[tuple, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    # -- compute and memory ---------------------------------------------------------------
    @property
    def hbm_bytes(self) -> int:
        return self.profile.hbm_bytes

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.profile.hbm_bytes_per_s

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s per chip for `dtype`; a dtype without a published rate gets the fallback dtype's."""
        peaks = self.profile.peak_flops_per_s
        return peaks.get(dtype, peaks[self.profile.fallback_dtype])

    def matmul_efficiency(self, dtype: str, gemm: tuple[int, int, int, int] | None = None) -> float:
        """Measured best matmul rate over peak (MAMF). A dtype without a measurement gets the fallback
        dtype's; 1.0 (peak) where the profile publishes none. With `gemm` (batch, m, n, k of one
        device's GEMM) and a measured sweep for the dtype (or the fallback dtype), the sweep's rate
        at that shape, never above the best rate: lower bounds price every GEMM at the best."""
        efficiency = self.profile.matmul_efficiency
        best = efficiency.get(dtype, efficiency.get(self.profile.fallback_dtype, 1.0))
        sweep = self._sweep
        if gemm is None or sweep is None:
            return best
        swept = dtype if dtype in sweep.grids else self.profile.fallback_dtype
        if swept not in sweep.grids:
            return best
        key = (swept, *gemm)
        found = self._gemm_rates.get(key)
        if found is None:
            found = self._gemm_rates[key] = min(best, sweep.efficiency(swept, *gemm))
        return found

    @cached_property
    def _sweep(self) -> SweepRates | None:
        return SweepRates(self.profile.matmul_sweep) if self.profile.matmul_sweep else None

    # -- collectives ----------------------------------------------------------------------
    def collective_seconds(self, kind: str, axes: Sequence[str], bytes_per_device: float) -> float:
        """Time of collective `kind` within each group of mesh `axes`; `bytes_per_device` is each
        device's input buffer (all-gather, gather: its shard)."""
        key = (kind, tuple(axes))
        cost = self._costs.get(key)
        if cost is None:
            cost = self._costs[key] = self._group_cost(*key)
        if bytes_per_device < 0:
            raise TopologyError("bytes_per_device", f"must be >= 0, got {bytes_per_device}")
        return cost.seconds(bytes_per_device)

    def algbw_bytes_per_s(self, kind: str, axes: Sequence[str], bytes_per_device: float) -> float:
        seconds = self.collective_seconds(kind, axes, bytes_per_device)
        return algbw_bytes_per_s(kind, self.group_size(axes), bytes_per_device, seconds)

    def busbw_bytes_per_s(self, kind: str, axes: Sequence[str], bytes_per_device: float) -> float:
        seconds = self.collective_seconds(kind, axes, bytes_per_device)
        return busbw_bytes_per_s(kind, self.group_size(axes), bytes_per_device, seconds)

    def group_size(self, axes: Sequence[str]) -> int:
        return math.prod(self.axis_sizes[self._axis_index(a, "axes")] for a in axes)

    # -- per-axis information -------------------------------------------------------------
    def axis_bandwidth_bytes_per_s_oneway(self, axis: str) -> float:
        """Bus bandwidth of a large all-gather over `axis` alone (per device, one way)."""
        if self.axis_sizes[self._axis_index(axis, "axis")] == 1:
            return math.inf
        return self.busbw_bytes_per_s("all_gather", [axis], _LARGE_MESSAGE_BYTES)

    def axis_latency_s(self, axis: str) -> float:
        """Fixed cost of a collective over `axis` alone: an all-gather of nothing."""
        return self.collective_seconds("all_gather", [axis], 0.0)

    def axis_link_class(self, axis: str) -> str:
        """Links an axis runs over, fastest first: `nvlink`, `network`, `ici`, `dcn`, or e.g. `nvlink+network`;
        `none` for an axis of size 1."""
        return self.group_link_class([axis])

    def group_link_class(self, axes: Sequence[str]) -> str:
        """Links a group of mesh axes runs over, fastest first (as `axis_link_class`)."""
        dims = {s.dim for axis in axes for s in self.segments[self.axis_names[self._axis_index(axis, "axes")]]}
        return "+".join(dict.fromkeys(self.machine.dims[d].link for d in sorted(dims, reverse=True))) or "none"

    def describe_axis(self, axis: str) -> str:
        """`tp: gpu(8)` style placement of one axis; strided parts show their stride."""
        parts = []
        for s in self.segments[axis]:
            dim = self.machine.dims[s.dim]
            stride = f"/stride {s.stride}" if s.stride > 1 else ""
            parts.append(f"{dim.name}({s.factor}{stride})")
        return f"{axis}: {' x '.join(parts) or 'no devices (size 1)'} [{self.axis_link_class(axis)}]"

    # -- building group costs -------------------------------------------------------------
    def _axis_index(self, axis: str, where: str) -> int:
        try:
            return self.axis_names.index(axis)
        except ValueError:
            raise TopologyError(where, f"unknown mesh axis {axis!r}; the mesh has {list(self.axis_names)}") from None

    def _group_cost(self, kind: str, axes: tuple[str, ...]) -> GroupCost:
        if kind not in COLLECTIVE_KINDS:
            raise TopologyError("kind", f"unknown collective {kind!r}; known: {', '.join(COLLECTIVE_KINDS)}")
        for axis in axes:
            self._axis_index(axis, "axes")
        if len(set(axes)) != len(axes):
            raise TopologyError("axes", f"mesh axes {list(axes)} name an axis twice")
        merged: dict[int, Segment] = {}
        for axis in axes:
            for s in self.segments[axis]:
                old = merged.get(s.dim)
                merged[s.dim] = s if old is None else Segment(s.dim, old.factor * s.factor, min(old.stride, s.stride))
        inner, outer = self._levels(merged)
        profile = self.profile
        gpu = isinstance(profile, GpuProfile)
        protocols = Protocols()
        if gpu and outer is not None:
            regimes = profile.network.protocol_regimes
            protocols = Protocols(tuple(r.until_bytes for r in regimes[:-1]),
                                  tuple(r.step_latency_s for r in regimes) or (0.0,))
        return GroupCost(kind=kind, n=self.group_size(axes), inner=inner, outer=outer,
                         launch_s=profile.launch_latency_s if gpu else 0.0, ramp=Ramp.of(profile.bandwidth_ramp or []),
                         flat_ring=gpu and isinstance(inner, SwitchLevel), protocols=protocols)

    def _levels(self, merged: dict[int, Segment]) -> tuple[SwitchLevel | TorusLevel | None, NetworkLevel | None]:
        profile, dims = self.profile, self.machine.dims
        torus: list[TorusDim] = []
        inner: SwitchLevel | TorusLevel | None = None
        outer: NetworkLevel | None = None
        for i in sorted(merged):
            s, dim = merged[i], dims[i]
            if dim.link == "nvlink":
                inner = _switch_level(profile, s.factor)
            elif dim.link == "network":
                outer = NetworkLevel(s.factor, profile.network.nic_bytes_per_s_oneway_effective,
                                     profile.network.latency_per_node_s)
            elif dim.link == "dcn":
                outer = NetworkLevel(s.factor, profile.dcn.bytes_per_s_oneway_per_chip, profile.dcn.latency_per_slice_s)
            else:
                ici = profile.ici
                wraps = dim.wraps and s.factor * s.stride == dim.size
                torus.append(TorusDim(s.factor, ici.link_bytes_per_s_oneway_achievable / s.stride, wraps,
                                      ici.hop_latency_s * s.stride))
        if torus:
            inner = TorusLevel.of(tuple(torus), profile.ici.latency_overlaps_transfer)
        return inner, outer


def _interpolate(table: Mapping[int, float], n: int) -> float:
    """Piecewise-linear in group size, clamped to the measured range."""
    points = sorted(table.items())
    if n <= points[0][0]:
        return points[0][1]
    for (n0, v0), (n1, v1) in zip(points, points[1:]):
        if n <= n1:
            return v0 + (v1 - v0) * (n - n0) / (n1 - n0)
    return points[-1][1]


def _switch_level(profile: GpuProfile, n: int) -> SwitchLevel:
    nvlink = profile.nvlink
    nvls = nvlink.nvls if nvlink.nvls is not None and n >= nvlink.nvls.min_gpus else None
    return SwitchLevel(n, _interpolate(nvlink.bytes_per_s_oneway_effective, n),
                       _interpolate(nvlink.bytes_per_s_oneway_effective, 2), nvlink.latency_per_peer_s, nvls,
                       nvlink.alltoall)


def bind(profile: "str | Mapping[str, Any] | GpuProfile | TpuProfile", axis_names: Sequence[str],
         axis_sizes: Sequence[int], *, nodes: int | None = None, slice_shape: Sequence[int] | None = None,
         mapping: Mapping[str, Any] | None = None) -> BoundTopology:
    """Place a mesh on a machine of `profile`.

    `nodes`: GPU nodes or TPU slices; `slice_shape`: the TPU slice (e.g. (4, 4, 4)). Left out, the
    smallest machine holding the mesh is used. `mapping` names the physical dims (`node`, `gpu`;
    `slice`, `x`, `y`, `z`) of each mesh axis; left out, inner mesh axes take the inner dims.
    """
    profile = load_profile(profile)
    names = tuple(axis_names)
    if len(names) != len(axis_sizes) or not names:
        raise BindingError("mesh", f"needs one size per axis name, got {list(names)} and {list(axis_sizes)}")
    for name, size in zip(names, axis_sizes):
        if not isinstance(size, numbers.Integral) or isinstance(size, bool) or size < 1:
            raise BindingError(f"mesh.{name}", f"axis size must be a positive integer, got {size!r}")
    sizes = tuple(int(size) for size in axis_sizes)
    devices = math.prod(sizes)
    if isinstance(profile, GpuProfile):
        if slice_shape is not None:
            raise BindingError("slice_shape", f"{profile.name} is a GPU profile; slice shapes apply to TPUs (use nodes)")
        machines = [gpu_machine(profile, devices, nodes)]
    else:
        machines = tpu_machines(profile, devices, nodes, slice_shape)
    placements: list[tuple[Machine, Segments]] = []
    error: BindingError | None = None
    for machine in machines:
        try:
            segments = (mapped_segments(machine, names, sizes, mapping) if mapping is not None
                        else default_segments(machine, names, sizes))
        except BindingError as failure:
            error = error or failure
            continue
        placements.append((machine, segments))
    if not placements:
        raise error
    machine, segments = min(placements, key=lambda p: unsplit_count(*p))
    return BoundTopology(profile, machine, names, sizes, segments)

"""The physical machine a mesh runs on: its dims, outer to inner, and the links along each.

GPU machines are `node` x `gpu` (NICs between nodes, NVLink inside). TPU machines are
`slice` x the slice's torus dims `x`, `y`[, `z`] (DCN between slices, ICI inside). Dims of size 1
are dropped. Inner dims have the faster links, which is what the default binding relies on.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

from cost_models.errors import BindingError
from cost_models.profile import GpuProfile, IciLevel, TpuProfile

TORUS_DIM_NAMES = ("x", "y", "z")


@dataclass(frozen=True, slots=True)
class PhysicalDim:
    name: str
    size: int
    link: str  # "network", "nvlink", "dcn" or "ici"
    wraps: bool  # torus dims with wraparound links


@dataclass(frozen=True, slots=True)
class Machine:
    dims: tuple[PhysicalDim, ...]  # outer to inner
    nodes: int  # GPU nodes or TPU slices
    slice_shape: tuple[int, ...]  # TPU slices only

    @property
    def num_devices(self) -> int:
        return math.prod(d.size for d in self.dims)

    def describe(self) -> str:
        if self.slice_shape:
            shape = "x".join(map(str, self.slice_shape))
            return f"{self.nodes} slice(s) of {shape}" if self.nodes > 1 else f"slice {shape}"
        gpus = self.num_devices // self.nodes
        return f"{self.nodes} node(s) x {gpus} GPU(s)"


def _dims(*dims: PhysicalDim) -> tuple[PhysicalDim, ...]:
    return tuple(d for d in dims if d.size > 1)


def gpu_machine(profile: GpuProfile, devices: int, nodes: int | None) -> Machine:
    """The nodes a mesh of `devices` GPUs occupies: as few nodes as possible unless `nodes` is given."""
    per_node_max = profile.nvlink.domain_gpus
    if nodes is None:
        if devices <= per_node_max:
            nodes = 1
        elif devices % per_node_max:
            raise BindingError("mesh", f"{devices} devices are not a whole number of {per_node_max}-GPU "
                                       f"{profile.name} nodes; pass nodes to spread them evenly")
        else:
            nodes = devices // per_node_max
    elif nodes < 1:
        raise BindingError("nodes", f"must be a positive integer, got {nodes}")
    elif devices > nodes * per_node_max:
        raise BindingError("mesh", f"the mesh has {devices} devices but {nodes} {profile.name} node(s) hold "
                                   f"{nodes * per_node_max}")
    elif devices % nodes:
        raise BindingError("nodes", f"the mesh's {devices} devices do not split evenly over {nodes} nodes")
    per_node = devices // nodes
    dims = _dims(PhysicalDim("node", nodes, "network", False), PhysicalDim("gpu", per_node, "nvlink", False))
    return Machine(dims, nodes, ())


def slice_wraparound(ici: IciLevel, shape: Sequence[int]) -> tuple[bool, ...]:
    rule = ici.wraparound
    if rule.rule == "all_dims_multiple_of":
        whole = all(size % rule.value == 0 for size in shape)
        return tuple(whole for _ in shape)
    return tuple(size == rule.value for size in shape)


def _fits(ici: IciLevel, shape: Sequence[int]) -> bool:
    return all(s <= m for s, m in zip(sorted(shape), sorted(ici.max_slice_shape)))


def _tpu_machine(profile: TpuProfile, nodes: int, shape: tuple[int, ...]) -> Machine:
    wraps = slice_wraparound(profile.ici, shape)
    torus = [PhysicalDim(name, size, "ici", wrap) for name, size, wrap in zip(TORUS_DIM_NAMES, shape, wraps)]
    return Machine(_dims(PhysicalDim("slice", nodes, "dcn", False), *torus), nodes, shape)


def slice_shapes(ici: IciLevel, chips: int) -> list[tuple[int, ...]]:
    """Every slice shape of `chips` chips within the largest slice, most compact first."""
    if chips > math.prod(ici.max_slice_shape):
        return []
    divisors = [d for d in range(1, chips + 1) if chips % d == 0]
    shapes = [s for s in itertools.product(divisors, repeat=ici.torus_dims) if math.prod(s) == chips and _fits(ici, s)]
    return sorted(shapes, key=lambda s: (max(s), s))


def tpu_machines(profile: TpuProfile, devices: int, nodes: int | None,
                 slice_shape: Sequence[int] | None) -> list[Machine]:
    """Candidate machines for a mesh of `devices` chips: the given slice, or every slice that fits."""
    ici = profile.ici
    if nodes is not None and nodes < 1:
        raise BindingError("nodes", f"must be a positive integer (number of slices), got {nodes}")
    if nodes is not None and slice_shape is None:
        # nodes counts GPU nodes; for a TPU it is the number of slices, of the shape given beside it
        raise BindingError("nodes", f"{profile.name} is a TPU profile: nodes apply to GPU profiles; give the "
                                    "slice shape instead (and the number of slices only with it)")
    if slice_shape is not None:
        shape = tuple(slice_shape)
        if len(shape) != ici.torus_dims or any(not isinstance(s, int) or s < 1 for s in shape):
            raise BindingError("slice_shape", f"{profile.name} slices have {ici.torus_dims} positive dims "
                                              f"(e.g. {'x'.join('4' * ici.torus_dims)}), got {shape}")
        if not _fits(ici, shape):
            largest = "x".join(map(str, ici.max_slice_shape))
            raise BindingError("slice_shape", f"{'x'.join(map(str, shape))} is larger than the largest "
                                              f"{profile.name} slice {largest}")
        chips = math.prod(shape)
        slices = nodes if nodes is not None else 1
        if devices != slices * chips:
            raise BindingError("mesh", f"the mesh has {devices} devices but {slices} slice(s) of "
                                       f"{'x'.join(map(str, shape))} hold {slices * chips}; a mesh covers whole slices")
        return [_tpu_machine(profile, slices, shape)]
    counts = [nodes] if nodes is not None else [k for k in range(1, devices + 1) if devices % k == 0]
    for slices in counts:
        if devices % slices == 0:
            shapes = slice_shapes(ici, devices // slices)
            if shapes:
                return [_tpu_machine(profile, slices, shape) for shape in shapes]
    largest = "x".join(map(str, ici.max_slice_shape))
    where = f"{nodes} slice(s)" if nodes is not None else "any number of slices"
    raise BindingError("mesh", f"{devices} devices do not form {where} of {profile.name} (largest slice {largest})")

"""Sharding options of an op (mesh axes per loop) and the operand/result shardings they imply.

This is the seeds' ShardingInterface on our loop nests: a split parallel loop splits the dims
it indexes; a split reduction loop leaves the results partial over its axes (with the op's
reduction kind); operands not indexed by a split loop are replicated along its axes.
`options_consistent_with` is the reverse direction (getShardingOption).

Which options an op may take, and which storage shardings a stored tensor may take:

Every mesh axis goes to at most one loop (or stays replicated); a loop may take several axes,
in either order. Options are dropped when they cannot be a block sharding (a split of a loop
that must stay whole, a reshape's minor loop, a merged dim the split does not divide) or when
some device would get an empty block, or when a window's halo would differ between devices
(`Window.aligned`). Uneven splits of plain dims are kept: the shards are
padded to ceildiv, and the compute and memory models price the padding.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from autoshard.errors import ShardingError
from autoshard.mesh import Mesh
from autoshard.ops.loops import INVALID, REDUCTION, LoopNest, loop_position
from autoshard.ops.nn import KEY_LOOP
from autoshard.planning.symmetry import consecutive
from autoshard.sharding import Sharding


@dataclass(frozen=True, slots=True)
class ShardingOption:
    """`loop_axes[l]` are the mesh axes loop `l` is split over (first axis major).

    `ring`: an attention realisation (`planning.ring_attention`). The mesh axis, one of those
    splitting the queries, around which the key/value blocks travel: every tensor indexing the
    key loop is held split over it along the keys (each device starts with its own block and
    sees every block in turn), and a result indexing the keys (a gradient's dk, dv) comes back
    to its owner complete, not partial over it. None: no ring.
    """

    loop_axes: tuple[tuple[str, ...], ...]
    ring: str | None = None

    @classmethod
    def replicated(cls, num_loops: int) -> "ShardingOption":
        return cls(((),) * num_loops)

    def used_axes(self) -> tuple[str, ...]:
        return tuple(a for axes in self.loop_axes for a in axes)

    def split_loops(self) -> tuple[int, ...]:
        return tuple(l for l, axes in enumerate(self.loop_axes) if axes)

    def to_json(self) -> list[list[str]]:
        """The loops' axes (a plan document writes `ring` beside them)."""
        return [list(a) for a in self.loop_axes]

    def __str__(self) -> str:
        loops = "[" + ", ".join("[" + ", ".join(a) + "]" for a in self.loop_axes) + "]"
        return loops if self.ring is None else f"{loops} ring {self.ring}"


def check_option(nest: LoopNest, option: ShardingOption, mesh: Mesh, where: str = "") -> None:
    """Raise if the option names unknown axes, reuses one, or splits a loop that must stay whole."""
    if len(option.loop_axes) != nest.num_loops:
        raise ShardingError(f"the option lists {len(option.loop_axes)} loops but the op has {nest.num_loops}", where)
    used = option.used_axes()
    for axis in used:
        if axis not in mesh.axis_names:
            raise ShardingError(f"unknown mesh axis {axis!r}; the mesh has {list(mesh.axis_names)}", where)
        if used.count(axis) > 1:
            raise ShardingError(f"mesh axis {axis!r} is used twice in one option", where)
    splittable = set(nest.splittable_loops())
    for loop in option.split_loops():
        if nest.iterator_types[loop] == INVALID:
            raise ShardingError(f"loop d{loop} is invalid (its split would change the result) and cannot be split", where)
        if loop not in splittable:
            raise ShardingError(f"loop d{loop} cannot be split: some tensor would not be a block sharding", where)
        ways = mesh.group_size(option.loop_axes[loop])
        for window in nest.windows(loop):
            if not window.aligned(ways):
                raise ShardingError(f"loop d{loop} cannot be split {ways} ways: its input windows need a halo that "
                                    f"differs between devices (an input block of ceil({window.size}/{ways}) must be "
                                    f"stride {window.stride} times an output block of ceil({window.outputs}/{ways}), "
                                    f"and no shard may be shorter than the halo {list(window.halo)})", where)


def map_sharding(nest: LoopNest, map_index: int, option: ShardingOption) -> Sharding:
    """The split of the tensor behind map `map_index` (inputs then outputs) under `option`; an input
    read through windows along a split loop carries the halo they reach into."""
    m = nest.maps[map_index]
    split: list[tuple[str, ...]] = [() for _ in range(m.rank)]
    halos = [(0, 0)] * m.rank
    for loop in option.split_loops():
        dim = loop_position(m, loop, nest.extents)
        if dim is None:
            window = nest.window(map_index, loop)
            if window is None:
                raise ShardingError(f"loop d{loop} cannot be split: tensor {map_index} would not be a block sharding")
            dim, halos[window.dim] = window.dim, window.halo
        if dim >= 0:
            split[dim] = split[dim] + option.loop_axes[loop]
    if option.ring is not None and not any(option.ring in axes for axes in split):
        dim = loop_position(m, KEY_LOOP, nest.extents)
        if dim is not None and dim >= 0:  # the device's own block of the keys, the others come round
            split[dim] = split[dim] + (option.ring,)
    return Sharding(tuple(split), halo_sizes=tuple(halos))


def operand_shardings(nest: LoopNest, option: ShardingOption) -> tuple[Sharding, ...]:
    return tuple(map_sharding(nest, i, option) for i in range(len(nest.input_maps)))


def result_shardings(nest: LoopNest, option: ShardingOption) -> tuple[Sharding, ...]:
    # the ring's accumulators travel back to their owner whole: not partial over the ring axis
    partial = tuple(a for l in nest.reduction_loops for a in option.loop_axes[l] if a != option.ring)
    n = len(nest.input_maps)
    return tuple(Sharding(map_sharding(nest, n + i, option).split_axes, partial, nest.reduction_kind)
                 for i in range(len(nest.output_maps)))


def options_consistent_with(nest: LoopNest, mesh: Mesh, known: Mapping[int, Sharding]) -> list[ShardingOption]:
    """Every legal option whose implied shardings equal `known` (map index -> sharding).

    Split dims fix the loops indexing them; partial result axes must come from reduction
    loops, and when several reduction loops could carry them every distribution is returned.
    """
    loop_axes: list[tuple[str, ...] | None] = [None] * nest.num_loops
    partial_axes: tuple[str, ...] | None = None
    for index, sharding in known.items():
        m = nest.maps[index]
        for dim, axes in enumerate(sharding.split_axes):
            if not axes:
                continue
            loops = m.results[dim].loops if dim < m.rank else ()
            major = max(m.results[dim].terms, key=lambda t: t[1])[0] if loops else None
            if major is None or (loop_axes[major] is not None and loop_axes[major] != axes):
                return []
            loop_axes[major] = axes
        if index >= len(nest.input_maps):
            if partial_axes is not None and partial_axes != sharding.partial_axes:
                return []
            partial_axes = sharding.partial_axes
    reductions = nest.reduction_loops
    assignments: Sequence[Sequence[tuple[str, ...]]] = [()]
    if partial_axes:
        if any(loop_axes[l] for l in reductions):
            assignments = [[loop_axes[l] or () for l in reductions]]
        else:
            assignments = _distribute(partial_axes, len(reductions))
    found = []
    for assignment in assignments:
        axes = [a if a is not None else () for a in loop_axes]
        for l, value in zip(reductions, assignment):
            axes[l] = tuple(value)
        option = ShardingOption(tuple(axes))
        try:
            check_option(nest, option, mesh)
        except ShardingError:
            continue
        implied = operand_shardings(nest, option) + result_shardings(nest, option)
        if all(implied[i] == s for i, s in known.items()):
            found.append(option)
    return found


def _distribute(axes: tuple[str, ...], slots: int) -> list[list[tuple[str, ...]]]:
    """Every way to hand the ordered `axes` to `slots` loops, keeping their order in each loop."""
    if slots == 0:
        return []
    out = []
    for owners in itertools.product(range(slots), repeat=len(axes)):
        out.append([tuple(a for a, o in zip(axes, owners) if o == s) for s in range(slots)])
    return out


def local_extents(nest: LoopNest, option: ShardingOption, mesh: Mesh) -> tuple[int, ...]:
    """Largest per-device extent of each loop (ceildiv over its split)."""
    return tuple(-(-e // mesh.group_size(axes)) if axes else e for e, axes in zip(nest.extents, option.loop_axes))

def _axis_assignments(axes: Sequence[str], slots: int, mesh_order: bool = False) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every way to give each axis to one of `slots` slots or none, with every order per slot
    (only the order of `axes` if `mesh_order`).

    Owner 0 means "none", so the first assignment yielded is the replicated one.
    """
    for owners in itertools.product(range(slots + 1), repeat=len(axes)):
        groups = [[a for a, o in zip(axes, owners) if o == s + 1] for s in range(slots)]
        if mesh_order:
            yield tuple(tuple(g) for g in groups)
            continue
        for orders in itertools.product(*(itertools.permutations(g) for g in groups)):
            yield tuple(tuple(o) for o in orders)


def enumerate_options(nest: LoopNest, mesh: Mesh, mesh_order: bool = False,
                      runs: bool = False) -> list[ShardingOption]:
    """All legal options of an op on `mesh`, the fully replicated one first. With `mesh_order`,
    a loop split over several axes takes them in mesh order only (the one order DTensor's
    placements express), and no loop is split that would need halos (DTensor has none). With
    `runs`, each loop takes consecutive mesh axes in mesh order (`autoshard.planning.symmetry`)."""
    splittable = nest.splittable_loops()
    if mesh_order:
        splittable = tuple(l for l in splittable if not any(any(w.halo) for w in nest.windows(l)))
    # Axes of size 1 change nothing: leave them out rather than multiply equivalent options.
    axes = [a for a in mesh.axis_names if mesh.axis_size(a) > 1]
    merged = _merged_loops(nest)
    options = []
    for assignment in _axis_assignments(axes, len(splittable), mesh_order):
        loop_axes: list[tuple[str, ...]] = [() for _ in nest.extents]
        for loop, group in zip(splittable, assignment):
            loop_axes[loop] = group
        if _fits(nest, loop_axes, mesh, merged) and (not runs or consecutive(loop_axes, mesh)):
            options.append(ShardingOption(tuple(loop_axes)))
    return options


# Ops whose reduction DTensor runs split over one mesh axis at most: its embedding keeps one mask
# of the ids a device holds per placement, and a vocabulary split over two mesh dims makes two
# masks that conflict ("MaskBuffer has been materialized with conflicting data")
ONE_AXIS_REDUCTIONS = frozenset({"embedding"})


def dtensor_runs(kind: str, nest: LoopNest, option: ShardingOption) -> bool:
    """Whether DTensor executes `option` of an op of `kind` (the plans `mesh_order` asks for)."""
    return kind not in ONE_AXIS_REDUCTIONS or all(len(option.loop_axes[l]) <= 1
                                                  for l, t in enumerate(nest.iterator_types) if t == REDUCTION)


def _merged_loops(nest: LoopNest) -> set[int]:
    """Loops that are the major term of a reshape sum in some map: their split must divide."""
    merged = set()
    for m in nest.maps:
        for expr in m.results:
            if len(expr.terms) > 1:
                merged.update(expr.loops)
    return merged


def _fits(nest: LoopNest, loop_axes: Sequence[tuple[str, ...]], mesh: Mesh, merged: set[int]) -> bool:
    for loop, axes in enumerate(loop_axes):
        if not axes:
            continue
        ways = mesh.group_size(axes)
        extent = nest.extents[loop]
        if ways > extent or (loop in merged and extent % ways):
            return False
        if not all(window.aligned(ways) for window in nest.windows(loop)):
            return False
        # ceildiv shards leave no device empty only if the last one starts inside the extent
        if -(-extent // ways) * (ways - 1) >= extent:
            return False
    return True


def enumerate_storage(shape: Sequence[int], mesh: Mesh, mesh_order: bool = False,
                      runs: bool = False) -> list[Sharding]:
    """Shardings a graph input or parameter may be stored in, replicated first (a dim split over
    several axes takes them in mesh order only, with `mesh_order`; consecutive axes in mesh
    order only, with `runs`)."""
    axes = [a for a in mesh.axis_names if mesh.axis_size(a) > 1]
    out = []
    for assignment in _axis_assignments(axes, len(shape), mesh_order):
        ok = True
        for size, group in zip(shape, assignment):
            ways = mesh.group_size(group)
            if group and (ways > size or -(-size // ways) * (ways - 1) >= size):
                ok = False
                break
        if ok and (not runs or consecutive(assignment, mesh)):
            out.append(Sharding(assignment))
    return out


"""Which sharding options an op may take, and which storage shardings a stored tensor may take.

Every mesh axis goes to at most one loop (or stays replicated); a loop may take several axes,
in either order. Options are dropped when they cannot be a block sharding (a split of a loop
that must stay whole, a reshape's minor loop, a merged dim the split does not divide) or when
some device would get an empty block. Uneven splits of plain dims are kept: the shards are
padded to ceildiv, and the compute and memory models price the padding.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Sequence

from autoshard.mesh import Mesh
from autoshard.ops.loops import LoopNest
from autoshard.options import ShardingOption
from autoshard.sharding import Sharding


def _axis_assignments(axes: Sequence[str], slots: int) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every way to give each axis to one of `slots` slots or none, with every order per slot.

    Owner 0 means "none", so the first assignment yielded is the replicated one.
    """
    for owners in itertools.product(range(slots + 1), repeat=len(axes)):
        groups = [[a for a, o in zip(axes, owners) if o == s + 1] for s in range(slots)]
        for orders in itertools.product(*(itertools.permutations(g) for g in groups)):
            yield tuple(tuple(o) for o in orders)


def enumerate_options(nest: LoopNest, mesh: Mesh) -> list[ShardingOption]:
    """All legal options of an op on `mesh`, the fully replicated one first."""
    splittable = nest.splittable_loops()
    # Axes of size 1 change nothing: leave them out rather than multiply equivalent options.
    axes = [a for a in mesh.axis_names if mesh.axis_size(a) > 1]
    merged = _merged_loops(nest)
    options = []
    for assignment in _axis_assignments(axes, len(splittable)):
        loop_axes: list[tuple[str, ...]] = [() for _ in nest.extents]
        for loop, group in zip(splittable, assignment):
            loop_axes[loop] = group
        if _fits(nest, loop_axes, mesh, merged):
            options.append(ShardingOption(tuple(loop_axes)))
    return options


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
        # ceildiv shards leave no device empty only if the last one starts inside the extent
        if -(-extent // ways) * (ways - 1) >= extent:
            return False
    return True


def enumerate_storage(shape: Sequence[int], mesh: Mesh) -> list[Sharding]:
    """Shardings a graph input or parameter may be stored in, replicated first."""
    axes = [a for a in mesh.axis_names if mesh.axis_size(a) > 1]
    out = []
    for assignment in _axis_assignments(axes, len(shape)):
        ok = True
        for size, group in zip(shape, assignment):
            ways = mesh.group_size(group)
            if group and (ways > size or -(-size // ways) * (ways - 1) >= size):
                ok = False
                break
        if ok:
            out.append(Sharding(assignment))
    return out


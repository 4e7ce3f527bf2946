"""One representative per class of resharding pairs that differ only by a renaming of
interchangeable mesh axes (`autoshard.planning.symmetry`): swapping such axes in a source and a
target swaps them in every step of every path between the two, and leaves each step's price
unchanged, so both pairs cost the same seconds. (Among paths of equal seconds the search may keep
another one for the representative: the bytes are those of one cheapest path.)

The representative renames each class's axes in the order they first appear in the source's
split dims, then the target's; the axes that split no dim follow, those partial in the source
first, then those partial in the target (axes alike in all of this are alike in the pair, so
their order does not matter)."""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from autoshard.mesh import Mesh
from autoshard.sharding import Sharding


def representative_pair(mesh: Mesh, source: Sharding, target: Sharding,
                        classes: Sequence[Sequence[str]]) -> tuple[Sharding, Sharding]:
    rename: dict[str, str] = {}
    splits = [a for axes in source.split_axes + target.split_axes for a in axes]
    for members in classes:
        order = list(dict.fromkeys(a for a in splits if a in members))
        rest = sorted((a for a in members if a not in order),
                      key=lambda a: (a not in source.partial_axes, a not in target.partial_axes))
        rename.update((old, new) for old, new in zip(order + rest, members) if old != new)
    if not rename:
        return source, target
    renaming = tuple(rename.items())
    return _renamed(mesh, source, renaming), _renamed(mesh, target, renaming)


@lru_cache(maxsize=65536)
def _renamed(mesh: Mesh, sharding: Sharding, renaming: tuple[tuple[str, str], ...]) -> Sharding:
    """Kept: a formulation renames each of its few shardings the same few ways for many pairs."""
    rename = dict(renaming)
    split = tuple(tuple(rename.get(a, a) for a in axes) for axes in sharding.split_axes)
    partial = tuple(sorted((rename.get(a, a) for a in sharding.partial_axes), key=mesh.axis_index))
    return Sharding(split, partial, sharding.partial_kind, sharding.dims_offsets, sharding.halo_sizes)

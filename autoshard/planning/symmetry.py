"""Meshes of many axes: the option space they are offered, and their interchangeable axes.

Options grow as (loops + 1) ** axes times the orders of the axes within each loop: a matmul has
106 options on three axes of size 2, 661 on four and over 5000 on five, and every edge prices
every pair of options; a 4-axis candidate of a 2-layer GPT took 21 minutes to formulate. On a mesh
of more than `FULL_OPTION_AXES` axes (of size > 1) an op is offered only the options in which each
loop is split over consecutive mesh axes in mesh order (`b, c` of `a, b, c, d`; never `c, b` nor
`a, c`), stored tensors likewise per dim. The runs may go to the loops in any order, so every
tensor sharding made of runs is produced and read by every op alike (a producer and its consumers
agree), and so is every plan that gives each role (data, tensor, ...) a run of the mesh, as meshes
are laid out (`dp, fsdp, tp`). A plan that splits one dim over, say, the first and the third axis
is not offered. The count then grows polynomially in the number of axes (the example MLP's matmul: on four axes
162 options, on five 417). The solver's and the search's bounds are bounds over the options
offered: on such meshes they say that no plan among those offered costs less.

Two mesh axes are interchangeable when they have the same size and run over the same links in
the same way (the same physical dims and factors, on a switch or a network, where a group's price
depends on how many devices of each dim it spans and not on their stride): swapping them in any
collective's group leaves its price unchanged, so the resharding prices of a many-axis mesh are
worked out once per renaming of such axes (`autoshard.resharding.relabel`).
"""

from __future__ import annotations

from typing import Any, Sequence

from autoshard.mesh import Mesh

FULL_OPTION_AXES = 3  # meshes with at most this many axes of size > 1 are offered every option


def interchangeable_axes(mesh: Mesh, hw: Any) -> tuple[tuple[str, ...], ...]:
    """Classes (of two or more axes, each in mesh order) of interchangeable axes of a many-axis
    mesh; none on other meshes (their prices are worked out pair by pair, as before).

    `hw` is a topology bound to the mesh; one that does not say where its axes run (a test's
    stand-in) has no interchangeable axes. Axes over a torus (ICI) are never merged: a ring's
    price there depends on the stride of its devices."""
    axes = [a for a in mesh.axis_names if mesh.axis_size(a) > 1]
    segments, machine = getattr(hw, "segments", None), getattr(hw, "machine", None)
    if not many_axes(mesh) or segments is None or machine is None:
        return ()
    classes: dict[tuple, list[str]] = {}
    for axis in axes:
        parts = segments[axis]
        if any(machine.dims[s.dim].link == "ici" for s in parts):
            continue
        key = (mesh.axis_size(axis), tuple(sorted((s.dim, s.factor) for s in parts)))
        classes.setdefault(key, []).append(axis)
    return tuple(tuple(members) for members in classes.values() if len(members) > 1)


def many_axes(mesh: Mesh) -> bool:
    """Whether the mesh is offered only the options of consecutive axes (see above)."""
    return sum(size > 1 for size in mesh.shape) > FULL_OPTION_AXES


def consecutive(groups: Sequence[Sequence[str]], mesh: Mesh) -> bool:
    """Whether every group (a loop's or a dim's axes) is a run of consecutive axes of size > 1 in mesh order."""
    order = [a for a in mesh.axis_names if mesh.axis_size(a) > 1]
    for group in groups:
        if group and tuple(group) != tuple(order[order.index(group[0]):order.index(group[0]) + len(group)]):
            return False
    return True

"""Property tests of the resharding planner, each plan executed by the simulator.

Random meshes (1-3 axes of size 1-4), random shapes (uneven sizes included) and random pairs of
shardings (split axes in any order, partial axes with a kind)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.errors import ShardingError
from autoshard.mesh import Mesh
from autoshard.reductions import REDUCTION_KINDS
from autoshard.resharding import bytes_moved_price, plan_resharding
from autoshard.sharding import Sharding
from autoshard.sim import apply_resharding, assemble, distribute

SETTINGS = settings(derandomize=True, max_examples=120, deadline=None)


@st.composite
def meshes(draw, min_axes: int = 1) -> Mesh:
    sizes = draw(st.lists(st.integers(1, 4), min_size=min_axes, max_size=3))
    return Mesh(tuple(f"a{i}" for i in range(len(sizes))), tuple(sizes))


@st.composite
def shardings(draw, mesh: Mesh, rank: int, allow_partial: bool = True) -> Sharding:
    order = draw(st.permutations(mesh.axis_names))
    roles = ["unused", *range(rank)] + (["partial"] if allow_partial else [])
    split: list[list[str]] = [[] for _ in range(rank)]
    partial = []
    for axis in order:
        role = draw(st.sampled_from(roles))
        if role == "partial":
            partial.append(axis)
        elif role != "unused":
            split[role].append(axis)
    kind = draw(st.sampled_from(REDUCTION_KINDS))
    return Sharding(tuple(tuple(a) for a in split), tuple(partial), kind)


@st.composite
def cases(draw):
    mesh = draw(meshes())
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    return mesh, shape, draw(shardings(mesh, len(shape))), draw(shardings(mesh, len(shape)))


def needs_new_partial(source: Sharding, target: Sharding) -> bool:
    """A sum/product-partial target over axes where the source is not partial of that kind."""
    same_kind = source.partial_kind == target.partial_kind
    extra = [a for a in target.partial_axes if not (same_kind and a in source.partial_axes)]
    return bool(extra) and target.partial_kind in ("sum", "product")


def run(mesh, shape, source, target):
    array = np.arange(math.prod(shape), dtype=np.int64).reshape(shape) % 13 - 6
    plan = plan_resharding(mesh, shape, 8, source, target, bytes_moved_price(mesh))
    out = apply_resharding(distribute(array, mesh, source), mesh, plan)
    np.testing.assert_array_equal(assemble(out, mesh, target, shape), array)
    return plan


def target_shard_bytes(mesh, shape, target) -> float:
    return math.prod(target.max_local_shape(mesh, shape)) * 8


@SETTINGS
@given(cases())
def test_planned_resharding_yields_the_target_layout(case):
    mesh, shape, source, target = case
    if needs_new_partial(source, target):
        with pytest.raises(ShardingError, match="partial"):
            plan_resharding(mesh, shape, 8, source, target, bytes_moved_price(mesh))
        return
    plan = run(mesh, shape, source, target)
    assert plan.seconds >= 0
    if plan.steps:
        assert plan.steps[0].before.split_axes == source.split_axes
        assert plan.steps[-1].after.split_axes == target.split_axes
        assert all(a.after == b.before for a, b in zip(plan.steps, plan.steps[1:]))


@SETTINGS
@given(cases())
def test_planner_is_no_worse_than_reduce_gather_slice(case):
    """The simple plan (all-reduce the partial axes, all-gather every dim that changes, slice) is
    always valid; the planner's choice never costs more."""
    mesh, shape, source, target = case
    if needs_new_partial(source, target):
        return
    price = bytes_moved_price(mesh)
    state, seconds = source, 0.0
    if source.partial_axes:
        seconds += price("all_reduce", source.partial_axes, math.prod(state.max_local_shape(mesh, shape)) * 8)
        state = state.without_partial()
    split = [list(state.dim_axes(d)) for d in range(len(shape))]
    for d in range(len(shape)):
        if split[d] and split[d] != list(target.dim_axes(d)):
            seconds += price("all_gather", tuple(split[d]), math.prod(state.max_local_shape(mesh, shape)) * 8)
            split[d] = []
            state = Sharding(tuple(tuple(a) for a in split))
    plan = plan_resharding(mesh, shape, 8, source, target, price)
    assert plan.seconds <= seconds + 1e-15


@SETTINGS
@given(st.data())
def test_same_sharding_is_empty(data):
    mesh = data.draw(meshes())
    shape = tuple(data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    sharding = data.draw(shardings(mesh, len(shape)))
    plan = plan_resharding(mesh, shape, 4, sharding, sharding, bytes_moved_price(mesh))
    assert plan.steps == () and plan.seconds == 0 and plan.max_bytes_received_per_device == 0


@st.composite
def open_cases(draw):
    """The seed's open class: swap the axes of two dims, swap the axis order within a dim, or
    drop a dim's major axis; any other axes stay where they are."""
    mesh = draw(meshes(min_axes=2))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=2, max_size=3)))
    a, b = draw(st.permutations(mesh.axis_names))[:2]
    rest = [x for x in mesh.axis_names if x not in (a, b)]
    extra_dim = draw(st.sampled_from([None, *range(len(shape))])) if rest else None
    kind = draw(st.sampled_from(["dims", "order", "major"]))
    d0, d1 = draw(st.permutations(range(len(shape))))[:2]

    def make(assign: dict[int, list[str]]) -> Sharding:
        split = [list(assign.get(d, [])) for d in range(len(shape))]
        if extra_dim is not None:
            split[extra_dim].append(rest[0])
        return Sharding(tuple(tuple(x) for x in split))

    if kind == "dims":
        return mesh, shape, make({d0: [a], d1: [b]}), make({d0: [b], d1: [a]})
    if kind == "order":
        return mesh, shape, make({d0: [a, b]}), make({d0: [b, a]})
    return mesh, shape, make({d0: [a, b]}), make({d0: [b]})


@SETTINGS
@given(open_cases())
def test_open_cases_receive_at_most_the_target_shard(case):
    mesh, shape, source, target = case
    plan = run(mesh, shape, source, target)
    assert plan.max_bytes_received_per_device <= target_shard_bytes(mesh, shape, target)

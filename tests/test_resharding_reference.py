"""The shared search structures give exactly what a plain Dijkstra gives.

`resharding_cost` answers from caches kept across searches: state ids and priced moves per
tensor, moves offered once over every axis and dim and filtered per space, one tree per start,
and searches from partial sources that skip states whose tree shows no cheaper path on. Here
every answer, seconds and bytes to the last bit (so ties too), is checked against a Dijkstra
written out plainly: fresh moves for every state, no caches, no pruning."""

from __future__ import annotations

import heapq
import itertools
import random

import pytest

from autoshard.errors import ShardingError
from autoshard.mesh import Mesh
from autoshard.planning.hardware import bind_hardware
from autoshard.resharding import STEP_KINDS, PricedMoves, bytes_moved_price, plan_resharding, resharding_cost
from autoshard.resharding.moves import (Context, canonical_state, goal_after, in_monotone_space, offered_moves,
                                        permute_move, price_move)
from autoshard.resharding.search import _effective_target, many_axes
from autoshard.sharding import Sharding
from autoshard.sim.reshard_check import verify_resharding


def plain_cost(mesh: Mesh, shape: tuple[int, ...], dtype_bytes: float, source: Sharding, target: Sharding,
               price) -> tuple[float, float]:
    """Dijkstra over (seconds, permutes, steps), ties to the first relaxation, moves in the
    planner's order: those offered, the permute into the target, the axis-order swaps."""
    source.check(mesh, shape, "source")
    target.check(mesh, shape, "target")
    start = canonical_state(mesh, source.split_axes, source.partial_axes, source.partial_kind, source.dims_offsets)
    goal = canonical_state(mesh, target.split_axes, target.partial_axes, target.partial_kind, target.dims_offsets)
    if target.partial_axes:
        goal = _effective_target(mesh, source, target)
    axes = set(source.used_axes()) | set(target.used_axes())
    dims = {d for s in (source, target) for d, split in enumerate(s.split_axes) if split}
    ctx = Context(mesh, shape, dtype_bytes, tuple(a for a in mesh.axis_names if a in axes), tuple(sorted(dims)),
                  goal.partial_axes)
    best = {start: (0.0, 0, 0)}
    came = {}
    tie = itertools.count()
    frontier = [(best[start], next(tie), start)]
    while frontier:
        key, _, state = heapq.heappop(frontier)
        if state == goal:
            break
        if key > best[state]:
            continue
        head, swaps = offered_moves.__wrapped__(ctx, state)
        into = goal_after(mesh, state, goal)
        into_goal = [] if into is None else [permute_move(mesh, shape, dtype_bytes, state, into)]
        for move in [*head, *into_goal, *swaps]:
            seconds = price_move(mesh, shape, state, move, price)
            new_key = (key[0] + seconds, key[1] + int(move.kind == "permute"), key[2] + 1)
            if move.after not in best or new_key < best[move.after]:
                best[move.after] = new_key
                came[move.after] = (state, move, seconds)
                heapq.heappush(frontier, (new_key, next(tie), move.after))
    if goal not in best:
        raise ShardingError(f"no resharding reaches {goal}", "target")
    path = []
    state = goal
    while state != start:
        state, move, seconds = came[state]
        path.append((move, seconds))
    path.reverse()
    return (sum(seconds for _, seconds in path),
            float(sum(m.bytes_per_device for m, _ in path if STEP_KINDS[m.kind].moves_data)))


def random_sharding(rng: random.Random, mesh: Mesh, rank: int, partial: bool) -> Sharding:
    """Every axis unused, splitting a random dim (in a random order) or, with `partial`, partial."""
    split: list[list[str]] = [[] for _ in range(rank)]
    partial_axes = []
    for axis in rng.sample(mesh.axis_names, len(mesh.axis_names)):
        role = rng.choice(["unused", "partial", *range(rank)] if partial else ["unused", *range(rank)])
        if role == "partial":
            partial_axes.append(axis)
        elif role != "unused":
            split[role].append(axis)
    return Sharding(tuple(tuple(a) for a in split), tuple(partial_axes), rng.choice(["sum", "max"]))


CASES = [
    # mesh, shape, shardings drawn per side: uneven sizes, a dim shorter than some splits, three axes
    ("a=3,b=2", (6, 5, 4), 12),
    ("a=2,b=2,c=2", (4, 6, 3), 12),
    ("x=4,y=2,z=2", (8, 2, 12), 12),
    # three axes of size > 1 among four: still the full search
    ("a=2,b=1,c=2,d=2", (4, 6), 8),
]

# Meshes of more than three axes of size > 1 search only the monotone paths.
MANY_AXES = [
    ("a=2,b=2,c=2,d=2", (4, 6), 6),
    ("a=2,b=2,c=2,d=2,e=2", (8, 4), 4),
    ("a=3,b=2,c=2,d=2", (6, 5), 5),
]


def plain_answers(mesh: Mesh, shape: tuple[int, ...], count: int, price, seed: str) -> dict:
    """Random pairs with the plain Dijkstra's answer: partial sources, and targets partial over
    an axis the source is partial over too or max-partial over any axis."""
    rng = random.Random(seed)
    sources = [random_sharding(rng, mesh, len(shape), partial=True) for _ in range(count)]
    targets = [random_sharding(rng, mesh, len(shape), partial=False) for _ in range(count)]
    targets += [Sharding(t.split_axes, s.partial_axes[:1], s.partial_kind) for s, t in zip(sources, targets[:8])
                if not set(s.partial_axes[:1]) & set(t.used_axes())]
    targets += [Sharding(t.split_axes, (axis,), "max") for t in targets[:8] for axis in mesh.axis_names[:1]
                if axis not in t.used_axes()]
    expected = {}
    for source, target in itertools.product(sources, targets):
        try:
            expected[source, target] = plain_cost(mesh, shape, 2, source, target, price)
        except ShardingError:
            continue
    return expected


def pricing_of(mesh: Mesh, pricing: str):
    return bytes_moved_price(mesh) if pricing == "ring" else bind_hardware("dgx-h100", mesh).collective_seconds


@pytest.mark.parametrize("mesh_text,shape,count", CASES)
@pytest.mark.parametrize("pricing", ["ring", "dgx"])
def test_shared_search_equals_a_plain_dijkstra(mesh_text, shape, count, pricing):
    mesh = Mesh.parse(mesh_text)
    price = pricing_of(mesh, pricing)
    expected = plain_answers(mesh, shape, count, price, f"{mesh_text}{shape}{pricing}")
    # Asked source by source (as a formulation asks) and target by target: the caches fill in other orders.
    targets = list(dict.fromkeys(target for _, target in expected))
    for pairs in (list(expected), sorted(expected, key=lambda pair: targets.index(pair[1]))):
        moves = PricedMoves(price)
        for source, target in pairs:
            assert resharding_cost(mesh, shape, 2, source, target, moves) == expected[source, target], (source, target)
    for source, target in itertools.islice(expected, 0, None, 7):
        plan = plan_resharding(mesh, shape, 2, source, target, price)
        assert (plan.seconds, float(sum(s.bytes_per_device for s in plan.steps if s.kind != "all_slice"))) == \
            expected[source, target], (source, target)


@pytest.mark.parametrize("profile", ["dgx-a100", "dgx-b200", "dgx-h100", "dgx-h200", "gb200-nvl72", "tpu-v4", "tpu-v5e",
                                     "tpu-v5p", "tpu-v6e"])
def test_no_price_falls_below_its_price_for_nothing(profile):
    """The searches stop early on the least a step or a permute costs, taken from the prices for
    0 bytes: that holds only while a price never falls as the bytes grow."""
    mesh = Mesh.parse("a=2,b=4,c=2")
    price = bind_hardware(profile, mesh).collective_seconds
    sizes = [0.0] + [2.0 ** k for k in range(0, 36)] + [3 * 2.0 ** k for k in range(0, 34, 3)]
    for kind in ("send_recv", "all_to_all", "all_gather", "all_reduce", "reduce_scatter"):
        for group in (("a",), ("b",), ("c",), ("a", "b"), ("b", "c"), ("c", "a"), ("a", "b", "c")):
            seconds = [price(kind, group, b) for b in sorted(sizes)]
            assert all(x <= y for x, y in zip(seconds, seconds[1:])), (kind, group)


@pytest.mark.parametrize("mesh_text,shape,count", MANY_AXES)
@pytest.mark.parametrize("pricing", ["ring", "dgx"])
def test_many_axes_price_the_best_monotone_path_above_the_plain_dijkstra(mesh_text, shape, count, pricing):
    """On meshes of more than three axes of size > 1 a price is that of a path of the full search
    (never below the plain Dijkstra's), `plan_resharding` builds that very path, every state on it
    is monotone (each axis where the source or the target has it, or unused), and it runs in the
    simulator to the target."""
    mesh = Mesh.parse(mesh_text)
    assert many_axes(mesh)
    price = pricing_of(mesh, pricing)
    expected = plain_answers(mesh, shape, count, price, f"{mesh_text}{shape}{pricing}")
    moves = PricedMoves(price)
    for (source, target), (seconds, _) in expected.items():
        restricted = resharding_cost(mesh, shape, 2, source, target, moves)
        assert restricted[0] >= seconds * (1 - 1e-9), (source, target)
    for source, target in itertools.islice(expected, 0, None, 5):
        plan = plan_resharding(mesh, shape, 2, source, target, price)
        assert (plan.seconds, float(sum(s.bytes_per_device for s in plan.steps if s.kind != "all_slice"))) == \
            resharding_cost(mesh, shape, 2, source, target, moves), (source, target)
        assert all(in_monotone_space(step.after.split_axes, source, target) for step in plan.steps), (source, target)
        assert verify_resharding(mesh, plan, "f32", seed=3).passed, (source, target)


MONOTONE_OPTIMA = [
    # one collective: the plain Dijkstra's cheapest path is monotone, so the prices agree
    (Sharding((("a", "b"), ("c",))), Sharding((("a",), ("c",)))),  # all_gather
    (Sharding((("a",), ("c",))), Sharding(((), ("c", "a")))),  # all_to_all
    (Sharding((("a",), ())), Sharding((("a",), ("d", "b")))),  # all_slice
    (Sharding((("a",), ()), ("c",)), Sharding((("a",), ("c",)))),  # reduce_scatter
    (Sharding((("a",), ("b",)), ("c", "d")), Sharding((("a",), ("b",)))),  # all_reduce
    (Sharding((("a", "b"), ())), Sharding((("b", "a"), ()))),  # an axis-order swap
]


@pytest.mark.parametrize("mesh_text", ["a=2,b=2,c=2,d=2", "a=2,b=2,c=2,d=2,e=2"])
@pytest.mark.parametrize("pricing", ["ring", "dgx"])
@pytest.mark.parametrize("source,target", MONOTONE_OPTIMA)
def test_many_axes_price_a_monotone_optimum_exactly(mesh_text, pricing, source, target):
    mesh = Mesh.parse(mesh_text)
    price = pricing_of(mesh, pricing)
    shape = (8, 16)
    assert resharding_cost(mesh, shape, 2, source, target, PricedMoves(price)) == \
        plain_cost(mesh, shape, 2, source, target, price)

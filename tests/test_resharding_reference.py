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
from autoshard.resharding.moves import Context, canonical_state, goal_after, offered_moves, permute_move, price_move
from autoshard.resharding.search import _effective_target
from autoshard.sharding import Sharding


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
    # many axes, where the searches stop early on the least any step or permute costs (dgx)
    ("a=2,b=2,c=2,d=2", (4, 6), 6),
    ("a=2,b=2,c=2,d=2,e=2", (8, 4), 4),
]


@pytest.mark.parametrize("mesh_text,shape,count", CASES)
@pytest.mark.parametrize("pricing", ["ring", "dgx"])
def test_shared_search_equals_a_plain_dijkstra(mesh_text, shape, count, pricing):
    mesh = Mesh.parse(mesh_text)
    price = bytes_moved_price(mesh) if pricing == "ring" else bind_hardware("dgx-h100", mesh).collective_seconds
    rng = random.Random(f"{mesh_text}{shape}{pricing}")
    sources = [random_sharding(rng, mesh, len(shape), partial=True) for _ in range(count)]
    targets = [random_sharding(rng, mesh, len(shape), partial=False) for _ in range(count)]
    # Targets partial over an axis the source is partial over too, and max-partial over any axis
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
    # Asked source by source (as a formulation asks) and target by target: the caches fill in other orders.
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

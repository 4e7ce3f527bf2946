"""Plan the collectives that turn one sharding of a tensor into another, cheapest first.

States are shardings, edges the moves of `autoshard.resharding.moves`. Dijkstra over the
states, priced by the caller's `price(kind, mesh_axes, bytes_per_device)`, returns the cheapest
sequence (ties: fewer permutes, then fewer steps). Intermediate shardings use only the mesh
axes and dims that the source or the target uses. Halos live only at the ends (`_with_halos`):
the search runs between the halo-free shardings, a haloed source first drops its halos locally
and a haloed target's halos come last from one update_halo (one update_halo alone when the
split does not change). `PricedMoves` keeps the priced moves of every
state across searches (`_Tensor`, one per tensor, filtered per space of axes and dims);
`_PathTree` keeps one Dijkstra tree per start for every goal, which also lets `resharding_cost`'s
searches from partial sources skip states that lead nowhere cheaper. Both stop early on the least
a step can cost (`_Tensor.floors`, the prices for 0 bytes): a tree settles states only while one
may still lead to the goal cheaper than the best found, and prices the permute into the goal
only from states far enough below it; a search drops states whose every path on ends past it.

On meshes of more than three axes of size > 1 (`many_axes`) the states grow exponentially with
the axes, and both `plan_resharding` and `resharding_cost` search only the monotone paths
(`_monotone_path`: each mesh axis moves at most once, from its place in the source to its place
in the target), a few states per pair: prices there are upper bounds of the full search's.
"""

from __future__ import annotations

import heapq
import itertools
import math
from functools import lru_cache
from typing import Callable, NamedTuple, Sequence

from autoshard.errors import ShardingError
from autoshard.mesh import Mesh
from autoshard.reductions import REDUCTIONS
from autoshard.resharding.geometry import dim_offsets, received_elements
from autoshard.resharding.moves import (Context, Move, build_step, canonical_state, goal_after, halo_move,
                                        monotone_dim_moves, monotone_moves, monotone_runs, offered_moves,
                                        ordered_subsets, price_move, priced_permute)
from autoshard.resharding.relabel import representative_pair
from autoshard.resharding.steps import STEP_KINDS, CollectiveStep, Price, Resharding
from autoshard.sharding import Sharding

def _effective_target(mesh: Mesh, source: Sharding, target: Sharding) -> Sharding:
    """The target with partial axes the source lacks removed: a replicated value is a valid
    max/min-partial one; a sum/product-partial value cannot be made by resharding."""
    keep = [a for a in target.partial_axes if a in source.partial_axes and source.partial_kind == target.partial_kind]
    extra = [a for a in target.partial_axes if a not in keep]
    if extra and not REDUCTIONS[target.partial_kind].idempotent:
        raise ShardingError(f"target is {target.partial_kind}-partial over {extra} but the source ({source}) is not "
                            f"{target.partial_kind}-partial there; resharding can only reduce partial values", "target/partial")
    return canonical_state(mesh, target.split_axes, keep, target.partial_kind, target.dims_offsets)


class _Edge(NamedTuple):
    after: int  # state id in its _Tensor
    seconds: float
    permutes: int
    move: Move


_UNKNOWN = object()  # a goal edge not worked out yet (None: worked out, not offered)


class _Tensor:
    """The states of one tensor (mesh, shape, itemsize) as small ints shared by all its spaces
    (ints hash and compare far faster than shardings), with each move priced once: a permute,
    the permute into a goal and the moves offered over every mesh axis and dim depend on the
    states alone, not on the space (a space keeps those of its axes and dims)."""

    def __init__(self, mesh: Mesh, shape: tuple[int, ...], dtype_bytes: float, price: Price):
        self.mesh, self.shape, self.dtype_bytes, self.price = mesh, shape, dtype_bytes, price
        self.states: list[Sharding] = []
        self.ids: dict[Sharding, int] = {}
        self.into: list[dict[int, _Edge | None]] = []  # per goal: the permute into it, by the state it leaves
        self._permutes: dict[tuple[int, int], _Edge] = {}
        self._offered: dict[tuple[int, tuple[str, ...]], tuple[tuple[tuple[_Edge, int], ...], tuple[_Edge, ...]]] = {}
        self._floors: tuple[float, float, float] | None = None
        self.monotone: dict[tuple[int, int], list[tuple[Sharding, Move, float]]] = {}  # (start, goal) -> path
        self._monotone_edges: dict[tuple, tuple[_Edge, ...]] = {}
        # A pair's search asks, per state, whether each dim still leaves the start (by start) and
        # which runs of the goal it may append (by goal): a row of pairs shares one side of each
        self._leaving: dict[tuple[int, int], tuple[bool, ...]] = {}
        self._runs: dict[tuple[int, int], tuple[tuple[tuple[str, ...], ...], ...]] = {}
        self._monotone_out: dict[tuple, tuple[_Edge, ...]] = {}
        self._dims: dict[int, tuple[tuple[str, ...], ...]] = {}
        self.lefts: dict[tuple[int, int], float] = {}  # least_left, by (state, goal)

    def id(self, state: Sharding) -> int:
        found = self.ids.get(state)
        if found is None:
            found = self.ids[state] = len(self.states)
            self.states.append(state)
            self.into.append({})
        return found

    def monotone_edges(self, state: int, goal_partial: tuple[str, ...], start: int,
                       goal: int) -> tuple[tuple[_Edge, ...], bool]:
        """`monotone_moves` and each dim's `monotone_dim_moves` towards the dims' axes in `start`
        and `goal`, priced and kept apart (pairs whose ends differ share most of them), and
        whether every dim's axes are still a prefix of the start's (the direct exchange into the
        goal is offered from there)."""
        leaving = self._leaving.get((state, start))
        if leaving is None:
            source = self.dims(start)
            leaving = self._leaving[state, start] = tuple(source[d][:len(axes)] == axes
                                                          for d, axes in enumerate(self.dims(state)))
        runs = self._runs.get((state, goal))
        if runs is None:
            towards = self.dims(goal)
            runs = self._runs[state, goal] = tuple(monotone_runs(axes, towards[d])
                                                   for d, axes in enumerate(self.dims(state)))
        key = (state, goal_partial, leaving, runs)
        edges = self._monotone_out.get(key)
        if edges is None:
            edges = self._kept((state, goal_partial), lambda ctx: monotone_moves(ctx, self.states[state]))
            for d, dim_runs in enumerate(runs):
                if dim_runs or leaving[d]:
                    edges += self._kept((state, goal_partial, d, leaving, dim_runs),
                                        lambda ctx: monotone_dim_moves(ctx, self.states[state], d, leaving, dim_runs))
            self._monotone_out[key] = edges
        return edges, all(leaving)

    def _kept(self, key: tuple, make: Callable[[Context], tuple[Move, ...]]) -> tuple[_Edge, ...]:
        found = self._monotone_edges.get(key)
        if found is None:
            ctx = Context(self.mesh, self.shape, self.dtype_bytes, self.mesh.axis_names, tuple(range(len(self.shape))),
                          key[1])
            found = self._monotone_edges[key] = tuple(self.edge(key[0], m) for m in make(ctx))
        return found

    def dims(self, state: int) -> tuple[tuple[str, ...], ...]:
        """The axes of each dim of `state`."""
        found = self._dims.get(state)
        if found is None:
            found = self._dims[state] = tuple(self.states[state].dim_axes(d) for d in range(len(self.shape)))
        return found

    def goal_edge(self, state: int, goal: int) -> _Edge | None:
        """The permute from `state` into `goal`'s split, if offered."""
        into = self.into[goal]
        edge = into.get(state, _UNKNOWN)
        if edge is _UNKNOWN:
            after = goal_after(self.mesh, self.states[state], self.states[goal])
            edge = into[state] = None if after is None else self.permute(state, self.id(after))
        return edge

    def permute(self, state: int, after: int) -> _Edge:
        key = (state, after)
        found = self._permutes.get(key)
        if found is None:
            move, seconds = priced_permute(self.mesh, self.shape, self.dtype_bytes, self.states[state], self.states[after],
                                           self.price)
            found = self._permutes[key] = _Edge(after, seconds, 1, move)
        return found

    def edge(self, state: int, move: Move) -> _Edge:
        if move.kind == "permute":
            return self.permute(state, self.id(move.after))
        return _Edge(self.id(move.after), self.price(move.kind, move.mesh_axes, move.bytes_per_device), 0, move)

    def offered(self, state: int, goal_partial: tuple[str, ...]) -> tuple[tuple[tuple[_Edge, int], ...], tuple[_Edge, ...]]:
        """`offered_moves` over every mesh axis and dim, priced: the moves before the goal
        permute, each with the mesh axes and dims it uses (`uses`), and the axis-order swaps,
        which use only the state's own axes and dims."""
        key = (state, goal_partial)
        found = self._offered.get(key)
        if found is None:
            ctx = Context(self.mesh, self.shape, self.dtype_bytes, self.mesh.axis_names, tuple(range(len(self.shape))),
                          goal_partial)
            head, swaps = offered_moves(ctx, self.states[state])
            found = self._offered[key] = (tuple((self.edge(state, m), self.uses(m.mesh_axes, _move_dims(m))) for m in head),
                                          tuple(self.edge(state, m) for m in swaps))
        return found

    def floors(self) -> tuple[float, float, float]:
        """The least seconds of a permute, of a reduction and of any step that moves data, over
        every group of mesh axes: each step's price is at least its price for 0 bytes (prices
        never fall as the bytes grow), so a path that must take such a step costs at least that."""
        if self._floors is None:
            groups = list(ordered_subsets(self.mesh.axis_names))

            def least(*kinds: str) -> float:
                return min(self.price(kind, group, 0.0) for kind in kinds for group in groups)

            permute, reduce = least(STEP_KINDS["permute"].price_kind, "all_to_all"), least("all_reduce", "reduce_scatter")
            self._floors = (permute, reduce, min(permute, reduce, least("all_gather")))
        return self._floors

    def least_left(self, state: int, goal: int) -> float:
        """A lower bound of the seconds of any path from `state` to `goal`: a partial axis the goal
        does not keep needs a reduction; a dim whose split is not a prefix of the goal's (with
        the same offsets) needs a step that moves data, as all_slice only appends axes."""
        if state == goal:
            return 0.0
        found = self.lefts.get((state, goal))
        if found is None:
            found = self.lefts[state, goal] = self._least_left(state, goal)
        return found

    def _least_left(self, state: int, goal: int) -> float:
        before, after = self.states[state], self.states[goal]
        _, reduce, moving = self.floors()
        left = reduce if not set(before.partial_axes) <= set(after.partial_axes) else 0.0
        for d in range(len(self.shape)):
            axes = before.dim_axes(d)
            if dim_offsets(before, d) != dim_offsets(after, d) or after.dim_axes(d)[:len(axes)] != axes:
                return left + moving
        return left

    def uses(self, axes: Sequence[str], dims: Sequence[int]) -> int:
        """Mesh axes and dims as bits: axis `i` is bit `i`, dim `d` bit `mesh rank + d`."""
        bits = 0
        for a in axes:
            bits |= 1 << self.mesh.axis_index(a)
        for d in dims:
            bits |= 1 << (len(self.mesh.axis_names) + d)
        return bits


def _move_dims(move: Move) -> list[int]:
    """The tensor dims a move names (split, gathered, sliced, ...)."""
    named = dict(move.dims)
    return [named[a] for a in STEP_KINDS[move.kind].dim_attrs]


class _Space:
    """The states of one context with their goal-independent priced moves, filled in as
    searches reach them, and the Dijkstra trees kept per start."""

    def __init__(self, ctx: Context, tensor: _Tensor):
        self.ctx, self.tensor = ctx, tensor
        self.out: dict[int, tuple[tuple[_Edge, ...], tuple[_Edge, ...]]] = {}
        self.trees: dict[int, _PathTree] = {}
        self._outside = ~tensor.uses(ctx.axes, ctx.dims)
        self._path_costs: dict[tuple[int, int], tuple[float, float]] = {}

    def base_edges(self, state: int) -> tuple[tuple[_Edge, ...], tuple[_Edge, ...]]:
        """The moves out of `state` but the permute into the goal, which Dijkstra relaxes
        between the two groups: `offered_moves(ctx, state)`, taken from those over every axis
        and dim (the same moves in the same order: each loop of offered_moves runs over a
        subsequence of the same axes and dims)."""
        out = self.out.get(state)
        if out is None:
            head, swaps = self.tensor.offered(state, self.ctx.goal_partial)
            outside = self._outside
            out = self.out[state] = (tuple(edge for edge, uses in head if not uses & outside), swaps)
        return out

    def path_cost(self, first: int, last: int) -> tuple[float, float]:
        """Seconds and bytes of `_cheapest_path`, kept: sources or targets that differ in what
        the states forget (the order of partial axes, a target's partial axes the source
        lacks) ask for the same path."""
        key = (first, last)
        found = self._path_costs.get(key)
        if found is None:
            path = _cheapest_path(self, first, last, skip_by_trees=True)
            found = self._path_costs[key] = _totals(path)
        return found

    def tree(self, start: int) -> "_PathTree":
        found = self.trees.get(start)
        if found is None:
            found = self.trees[start] = _PathTree(self, start)
        return found


class PricedMoves:
    """The moves out of each state with their prices under one `price`, kept across searches:
    a graph's identical layers ask about the same states for many sources and targets. Pass
    one to `plan_resharding` / `resharding_cost` for every resharding priced by `price`."""

    def __init__(self, price: Price, classes: Sequence[Sequence[str]] = ()):
        self._price, self._prices = price, {}
        # interchangeable mesh axes under `price`: `resharding_cost` prices one pair per renaming
        self.classes = tuple(tuple(c) for c in classes)
        self._tensors: dict[tuple, _Tensor] = {}
        self._spaces: dict[tuple, _Space] = {}

    def price(self, kind: str, mesh_axes: tuple[str, ...], bytes_per_device: float) -> float:
        """`price`, called once per distinct collective (the same buffers recur across states)."""
        key = (kind, mesh_axes, bytes_per_device)
        found = self._prices.get(key)
        if found is None:
            found = self._prices[key] = self._price(kind, mesh_axes, bytes_per_device)
        return found

    def space(self, mesh: Mesh, shape: tuple[int, ...], dtype_bytes: float, axes: frozenset[str], dims: frozenset[int],
              goal_partial: tuple[str, ...]) -> _Space:
        """The space of searches that may use `axes` and `dims`, towards goals partial over `goal_partial`."""
        key = (mesh, shape, dtype_bytes, axes, dims, goal_partial)
        found = self._spaces.get(key)
        if found is None:
            ctx = Context(mesh, shape, dtype_bytes, tuple(a for a in mesh.axis_names if a in axes), tuple(sorted(dims)), goal_partial)
            found = self._spaces[key] = _Space(ctx, self.tensor(mesh, shape, dtype_bytes))
        return found

    def tensor(self, mesh: Mesh, shape: tuple[int, ...], dtype_bytes: float) -> _Tensor:
        key = (mesh, shape, dtype_bytes)
        found = self._tensors.get(key)
        if found is None:
            found = self._tensors[key] = _Tensor(mesh, shape, dtype_bytes, self.price)
        return found


class _PathTree:
    """Dijkstra from one state over the goal-independent moves, run only as far as some goal
    needs and kept for the next goal.

    From a start with no partial axes no state is partial, so the permute into the goal leads
    to the goal itself and ends the search: a search towards any goal pops the same states in
    the same order as this tree until it pops the goal, and differs only in the candidates the
    permutes add for the goal. `cost` replays exactly that, so every goal of the space reads
    its answer off one tree (the same path as `_search`, ties included)."""

    def __init__(self, space: _Space, start: int):
        self.space = space
        self.order: list[int] = []  # settled states, in the order Dijkstra pops them
        self.rank: dict[int, int] = {}
        self.best: dict[int, tuple[float, int, int]] = {start: (0.0, 0, 0)}
        self.came: dict[int, tuple[int, int]] = {}  # state -> (predecessor, index of the move in its edges)
        self.bytes: dict[int, float] = {start: 0}  # summed along the path as resharding_cost sums them
        self._tie = itertools.count()
        self._frontier = [((0.0, 0, 0), next(self._tie), start)]
        self._costs: dict[int, tuple[float, float]] = {}

    def _pop(self) -> None:
        """Settle the next state of the frontier (or drop a stale entry of it)."""
        best, came = self.best, self.came
        key, _, state = heapq.heappop(self._frontier)
        if key > best[state]:
            return
        self.rank[state] = len(self.order)
        self.order.append(state)
        head, swaps = self.space.base_edges(state)
        if state in came:
            self.bytes[state] = self._path_bytes(state)
        at = key[0]
        for index, (after, seconds, permutes, _) in enumerate(head + swaps):
            known = best.get(after)
            if known is not None and at + seconds > known[0]:
                continue
            new_key = (at + seconds, key[1] + permutes, key[2] + 1)
            if known is None or new_key < known:
                best[after] = new_key
                came[after] = (state, index)
                heapq.heappush(self._frontier, (new_key, next(self._tie), after))

    def _path_bytes(self, state: int) -> float:
        """The bytes of the tree's path to `state`, whose predecessor is settled."""
        before, index = self.came[state]
        move = self._edge(before, index).move
        return self.bytes[before] + (move.bytes_per_device if STEP_KINDS[move.kind].moves_data else 0)

    def cost(self, goal: int) -> tuple[float, float]:
        """Seconds and bytes of the path `_search` finds to `goal`."""
        found = self._costs.get(goal)
        if found is None:
            found = self._costs[goal] = self._cost(goal)
        return found

    def _cost(self, goal: int) -> tuple[float, float]:
        """The least of the tree's own path to `goal` and of every settled state's path with the
        permute into `goal` after it. States are settled only while one may still lead somewhere
        cheaper (the tree's frontier is below the best so far), and the permutes are priced only
        from states that many seconds below the best less the least any permute costs."""
        tensor = self.space.tensor
        best, order, frontier, into = self.best, self.order, self._frontier, tensor.into[goal]
        floor = tensor.floors()[0]
        key = position = None  # the best permute into the goal so far, and where Dijkstra relaxes it
        bytes_ = 0.0
        scanning, i = True, 0
        while True:
            least = _least(key, best.get(goal))
            if scanning and i < len(order):
                state = order[i]
                at = best[state]
                if least is not None and not (at < least and at[0] + floor <= least[0]):
                    scanning = False  # the states after it are reached no sooner
                    continue
                i += 1
                edge = into.get(state, _UNKNOWN)
                if edge is _UNKNOWN:
                    edge = tensor.goal_edge(state, goal)
                if edge is None or (key is not None and at[0] + edge.seconds > key[0]):
                    continue
                new_key = (at[0] + edge.seconds, at[1] + 1, at[2] + 1)
                if key is None or new_key < key:
                    key, position = new_key, (self.rank[state], 1)
                    bytes_ = self.bytes[state] + edge.move.bytes_per_device
            elif frontier and (least is None or frontier[0][0] < least):
                self._pop()
            else:
                break
        reached = best.get(goal)
        if reached is not None and goal in self.came:
            # Relaxations happen in pop order, then in edge order with the goal permute between
            # head and swaps; the first one reaching the least key is kept.
            before, index = self.came[goal]
            at = (self.rank[before], 0 if index < len(self.space.base_edges(before)[0]) else 2)
            if key is None or reached < key or (reached == key and at < position):
                key, bytes_ = reached, self._path_bytes(goal)
        elif reached is not None:  # the goal is the start
            key, bytes_ = reached, 0.0
        if key is None:
            raise ShardingError(f"no resharding reaches {tensor.states[goal]}", "target")
        return key[0], float(bytes_)

    def _edge(self, state: int, index: int) -> _Edge:
        head, swaps = self.space.base_edges(state)
        return head[index] if index < len(head) else swaps[index - len(head)]


def _least(a: tuple[float, int, int] | None, b: tuple[float, int, int] | None) -> tuple[float, int, int] | None:
    return b if a is None else a if b is None else min(a, b)


@lru_cache(maxsize=65536)
def _endpoint(mesh: Mesh, shape: tuple[int, ...], sharding: Sharding, where: str) -> tuple[Sharding, frozenset[str], frozenset[int]]:
    """A checked source or target as a canonical state, with the mesh axes and dims it uses."""
    sharding.check(mesh, shape, where)
    state = canonical_state(mesh, sharding.split_axes, sharding.partial_axes, sharding.partial_kind, sharding.dims_offsets)
    return state, frozenset(sharding.used_axes()), frozenset(d for d, axes in enumerate(sharding.split_axes) if axes)


def _space(mesh: Mesh, shape: tuple[int, ...], dtype_bytes: float, source: Sharding, target: Sharding,
           moves: PricedMoves) -> tuple[_Space, int, int]:
    """The space a search from `source` to `target` runs in, and its start and goal."""
    start, source_axes, source_dims = _endpoint(mesh, shape, source, "source")
    goal, target_axes, target_dims = _endpoint(mesh, shape, target, "target")
    if target.partial_axes:
        goal = _effective_target(mesh, source, target)
    space = moves.space(mesh, shape, dtype_bytes, source_axes | target_axes, source_dims | target_dims, goal.partial_axes)
    return space, space.tensor.id(start), space.tensor.id(goal)


# Above the relative error of summing a path's seconds in another order (far fewer than
# 10**6 steps of 2**-53 each).
_ROUNDING = 1e-9


def many_axes(mesh: Mesh) -> bool:
    """More than three mesh axes of size > 1: the full search's states grow exponentially with
    the axes (thousands per tensor on five), so `plan_resharding` and `resharding_cost` search
    the monotone paths instead (`_monotone_path`), both the same way: a formulation's prices are
    then those of the best monotone path, an upper bound of the full search, and equal the
    plans its report and partitioned program build."""
    return sum(size > 1 for size in mesh.shape) > 3


def _search(mesh: Mesh, shape: tuple[int, ...], dtype_bytes: float, source: Sharding, target: Sharding,
            moves: PricedMoves) -> list[tuple[Sharding, Move, float]]:
    """Dijkstra from `source` to `target` (ties: fewer permutes, then fewer steps): the cheapest
    path as (state before, move, seconds) steps; on `many_axes` meshes the cheapest monotone one."""
    if many_axes(mesh):
        return _monotone_path(mesh, shape, dtype_bytes, source, target, moves)
    return _cheapest_path(*_space(mesh, shape, dtype_bytes, source, target, moves))


def _monotone_path(mesh: Mesh, shape: tuple[int, ...], dtype_bytes: float, source: Sharding, target: Sharding,
                   moves: PricedMoves) -> list[tuple[Sharding, Move, float]]:
    """The cheapest monotone path from `source` to `target`: A* (ties as `_cheapest_path`, the
    rest bounded by `_Tensor.least_left`) over the states where every dim's axes are a prefix of the source's or of the goal's
    (`in_monotone_space`: each mesh axis where the source has it, where the goal has it, or
    unused, so a few states per pair, not the exponentially many of the full space). Each axis
    moves at most once, out of its source place and into its goal place: reductions of partial
    axes the goal does not keep, gathers of a dim still a prefix of the source's, and the
    reduce_scatters, all_slices and all_to_alls that append the goal's next axes
    (`monotone_moves`, `monotone_dim_moves`), and the direct exchange into the goal from every
    state reached by reductions and gathers alone. Every path is one of the full search, so the
    price is an upper bound of `_cheapest_path`'s, equal where a cheapest path is monotone (one
    all_gather, all_to_all or reduce_scatter, a gather then a slice, a direct exchange, ...)."""
    start, _, _ = _endpoint(mesh, shape, source, "source")
    goal, _, _ = _endpoint(mesh, shape, target, "target")
    if target.partial_axes:
        goal = _effective_target(mesh, source, target)
    tensor = moves.tensor(mesh, shape, dtype_bytes)
    first, last = tensor.id(start), tensor.id(goal)
    found = tensor.monotone.get((first, last))
    if found is not None:
        return found
    floor = tensor.floors()[0]
    goal_partial, lefts, least_left = goal.partial_axes, tensor.lefts, tensor.least_left
    best: dict[int, tuple[float, int, int]] = {first: (0.0, 0, 0)}
    came: dict[int, tuple[int, Move, float]] = {}
    bound = math.inf
    tie = itertools.count()
    # A*: states come up in the order of their seconds plus `least_left`, a lower bound of the
    # rest that no step lowers by more than it costs, so a state's first settling is its best.
    frontier = [(least_left(first, last), best[first], next(tie), first)]
    while frontier:
        _, key, _, state = heapq.heappop(frontier)
        if state == last:
            break
        if key > best[state]:
            continue
        edges, leaving = tensor.monotone_edges(state, goal_partial, first, last)
        # The exchange into the goal, from states whose axes have only left their source places,
        # unless even its least price ends past the best path found.
        if key[0] + floor <= bound and leaving:
            into = tensor.goal_edge(state, last)
            if into is not None:
                edges += (into,)
        at, permuted, steps = key[0], key[1], key[2] + 1
        for after, seconds, permutes, move in edges:
            reached = at + seconds
            if reached > bound:
                continue
            known = best.get(after)
            new_key = (reached, permuted + permutes, steps)
            if known is None or new_key < known:
                left = 0.0 if after == last else lefts.get((after, last))
                if left is None:
                    left = least_left(after, last)
                if reached + left > bound:
                    continue
                best[after] = new_key
                came[after] = (state, move, seconds)
                heapq.heappush(frontier, (reached + left, new_key, next(tie), after))
                if after == last:
                    bound = reached
    if last not in best:
        raise ShardingError(f"no resharding reaches {goal}", "target")
    found = tensor.monotone[first, last] = _walk_back(tensor, came, first, last)
    return found


def _cheapest_path(space: _Space, first: int, last: int, skip_by_trees: bool = False) -> list[tuple[Sharding, Move, float]]:
    """`_search` between two states of `space`. `skip_by_trees` skips the moves out of states
    that are not partial when their tree shows no cheaper path on: the same path, found with
    fewer moves when many searches share the space's trees, more work for a single search."""
    tensor = space.tensor
    into = tensor.into[last]
    best: dict[int, tuple[float, int, int]] = {first: (0.0, 0, 0)}
    came: dict[int, tuple[int, Move, float]] = {}
    # At least the seconds of the best path to the goal: a state reached later than that is
    # popped after the goal, if ever, and changes nothing, so it is not recorded.
    bound = math.inf
    skip_by_trees = skip_by_trees and not tensor.states[last].partial_axes
    tie = itertools.count()
    frontier = [(best[first], next(tie), first)]
    while frontier:
        key, _, state = heapq.heappop(frontier)
        if state == last:
            break
        if key > best[state]:
            continue
        at, permuted, steps = key[0], key[1], key[2] + 1
        tree = space.trees.get(state) if skip_by_trees and state != first else None
        if tree is not None and not tensor.states[state].partial_axes:
            # Every path on from a state that is not partial stays so: its tree (kept from the
            # searches from it as a source; one per state reached would make every search
            # settle the whole space) knows the least seconds left to the goal. A state whose
            # every path ends past the bound is on no cheapest path (ties included) and its
            # moves change nothing.
            left = tree.cost(last)[0]
            if (at + left) * (1 - _ROUNDING) > bound:
                continue
            bound = min(bound, (at + left) * (1 + _ROUNDING))
        head, swaps = space.base_edges(state)
        edge = into.get(state, _UNKNOWN)
        if edge is _UNKNOWN:
            edge = tensor.goal_edge(state, last)
        # The order Dijkstra relaxes a state's moves in: the permute into the goal between the groups.
        for edges in (head, () if edge is None else (edge,), swaps):
            for after, seconds, permutes, move in edges:
                reached = at + seconds
                if reached > bound:
                    continue
                if bound < math.inf and (reached + tensor.least_left(after, last)) * (1 - _ROUNDING) > bound:
                    continue  # every path on from it ends past the bound
                known = best.get(after)
                if known is not None and reached > known[0]:
                    continue  # decided by the seconds alone, without building the key
                new_key = (reached, permuted + permutes, steps)
                if known is None or new_key < known:
                    best[after] = new_key
                    came[after] = (state, move, seconds)
                    heapq.heappush(frontier, (new_key, next(tie), after))
                    if after == last:
                        bound = reached

    return _walk_back(tensor, came, first, last)


def _walk_back(tensor: _Tensor, came: dict[int, tuple[int, Move, float]], first: int, last: int
               ) -> list[tuple[Sharding, Move, float]]:
    """The path a search found from `first` to `last`, each step's state before it, move and seconds."""
    path = []
    state = last
    while state != first:
        before, move, seconds = came[state]
        path.append((tensor.states[before], move, seconds))
        state = before
    return path[::-1]


def _with_halos(mesh: Mesh, shape: tuple[int, ...], dtype_bytes: float, source: Sharding, target: Sharding,
                moves: PricedMoves) -> list[tuple[Sharding, Move, float]]:
    """The path between halo-free shardings with the halo steps around it."""
    source.check(mesh, shape, "source")
    target.check(mesh, shape, "target")
    core = _search(mesh, shape, dtype_bytes, source.without_halo(), target.without_halo(), moves)
    state = canonical_state(mesh, source.split_axes, source.partial_axes, source.partial_kind, source.dims_offsets)
    state = state.with_halo(source.halo_sizes)
    path = []

    def halo_step(after: Sharding) -> None:
        move = halo_move(mesh, shape, dtype_bytes, state, after)
        path.append((state, move, price_move(mesh, shape, state, move, moves.price)))

    if core and state.has_halo:
        halo_step(state.without_halo())
        state = state.without_halo()
    for before, move, seconds in core:
        path.append((before, move, seconds))
        state = move.after
    if state.halo_sizes != target.halo_sizes:
        halo_step(state.with_halo(target.halo_sizes))
    return path


def _totals(path: list[tuple[Sharding, Move, float]]) -> tuple[float, float]:
    """A path's seconds and the bytes per device its steps that move data are priced on."""
    return (sum(seconds for _, _, seconds in path),
            float(sum(m.bytes_per_device for _, m, _ in path if STEP_KINDS[m.kind].moves_data)))


def resharding_cost(mesh: Mesh, shape: Sequence[int], dtype_bytes: float, source: Sharding, target: Sharding,
                    moves: PricedMoves) -> tuple[float, float]:
    """`plan_resharding(...)`'s seconds and the bytes per device its steps are priced on (steps
    that move nothing, all_slice, left out), without building the steps. On `many_axes` meshes,
    those of the best monotone path, as `plan_resharding`'s."""
    shape = tuple(shape)
    if moves.classes:
        source, target = representative_pair(mesh, source, target, moves.classes)
    if source.has_halo or target.has_halo:
        path = _with_halos(mesh, shape, dtype_bytes, source, target, moves)
        return _totals(path)
    if many_axes(mesh):
        return _totals(_monotone_path(mesh, shape, dtype_bytes, source, target, moves))
    space, first, last = _space(mesh, shape, dtype_bytes, source, target, moves)
    if not source.partial_axes:
        return space.tree(first).cost(last)
    return space.path_cost(first, last)


def halo_step(mesh: Mesh, shape: Sequence[int], dtype_bytes: float, before: Sharding, after: Sharding,
              price: Price) -> CollectiveStep:
    """The one update_halo from `before` to `after`, which differ only in their halos."""
    if before.without_halo() != after.without_halo():
        raise ValueError(f"an update_halo keeps the split: {before} and {after} differ beyond their halos")
    shape = tuple(shape)
    move = halo_move(mesh, shape, dtype_bytes, before, after)
    return build_step(mesh, shape, before, move, price_move(mesh, shape, before, move, price))


def plan_resharding(mesh: Mesh, shape: Sequence[int], dtype_bytes: float, source: Sharding, target: Sharding,
                    price: Price, moves: PricedMoves | None = None) -> Resharding:
    """The cheapest sequence of collectives under `price` that turns `source` into `target`
    (`moves`, if given, must have been made with the same `price`); on `many_axes` meshes the
    cheapest monotone one (`_monotone_path`), an upper bound of the cheapest."""
    shape = tuple(shape)
    moves = moves if moves is not None else PricedMoves(price)
    if source.has_halo or target.has_halo:
        path = _with_halos(mesh, shape, dtype_bytes, source, target, moves)
    else:
        path = _search(mesh, shape, dtype_bytes, source, target, moves)
    steps = tuple(build_step(mesh, shape, before, move, seconds) for before, move, seconds in path)
    totals = {d: 0.0 for d in mesh.devices()}
    for step in steps:
        for d, elements in received_elements(mesh, shape, step).items():
            totals[d] += elements
    return Resharding(shape, dtype_bytes, source, target, steps, float(max(totals.values()) * dtype_bytes))

"""The moves offered from a state: single collectives whose exact effect turns one sharding
into another, each offered only where it is exact for the tensor's sizes (pieces cut by the
reference's ceildiv rule, uneven shards included):

- `all_reduce` / `reduce_scatter` drop partial axes (the latter appends them to a dim);
- `all_gather` drops a suffix of a dim's axes; `all_slice` appends free axes to a dim;
- `all_to_all` moves a suffix of one dim's axes to the end of another dim's;
- `permute` is a direct point-to-point exchange into the target (or an axis-order swap): each
  device receives only the part of its new shard it does not already hold, from a device that
  holds it (see README.md);
- `update_halo` changes only the halos (`halo_move`): into a halo sharding, each device receives
  the halo cells it lacks from its neighbours; out of one, it drops them locally.

On meshes of many axes the search takes only the monotone moves of a (source, goal) pair
(`monotone_moves`, `monotone_dim_moves`): those of the above that keep every dim's axes a prefix
of the source's or of the goal's, each axis moving at most once (`in_monotone_space`).

Also how a move is priced and how it becomes a `CollectiveStep`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, Callable, Iterator, Sequence

from autoshard.mesh import Mesh
from autoshard.resharding.geometry import (device_transfers, dim_offsets, exchange_axes, exchange_extent, fan_in,
                                           halo_received_elements, missing_elements, pieces)
from autoshard.resharding.steps import STEP_KINDS, CollectiveStep, Price, StepDims
from autoshard.sharding import Sharding, ceildiv


@lru_cache(maxsize=4096)
def _gather_exact(size: int, major: int, minor: int) -> bool:
    """Concatenating `minor` consecutive shards of a `major*minor` split gives the `major` split."""
    fine = pieces(size, major * minor)
    return all((fine[p * minor][0], fine[p * minor + minor - 1][1]) == bounds for p, bounds in enumerate(pieces(size, major)))


@lru_cache(maxsize=4096)
def _slice_exact(size: int, major: int, minor: int) -> bool:
    """Cutting each shard of the `major` split into `minor` pieces gives the `major*minor` split."""
    fine = pieces(size, major * minor)
    return all((a + s, a + e) == fine[p * minor + j]
               for p, (a, b) in enumerate(pieces(size, major)) for j, (s, e) in enumerate(pieces(b - a, minor)))


def canonical_state(mesh: Mesh, split: Sequence[Sequence[str]], partial: Sequence[str], kind: str,
                    offsets: Sequence[Sequence[int]]) -> Sharding:
    """A canonical sharding: partial axes in mesh order, kind `sum` when nothing is partial."""
    partial = tuple(sorted(partial, key=mesh.axis_index))
    return Sharding(tuple(tuple(a) for a in split), partial, kind if partial else "sum", tuple(tuple(o) for o in offsets))


@dataclass(frozen=True, slots=True)
class Context:
    """What the moves out of a state depend on. The goal enters only through the partial axes it
    keeps (never reduced) and through the permute straight into it (`goal_after`), so one
    context serves every goal with those partial axes."""

    mesh: Mesh
    shape: tuple[int, ...]
    dtype_bytes: float
    axes: tuple[str, ...]
    dims: tuple[int, ...]
    goal_partial: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Move:
    kind: str
    mesh_axes: tuple[str, ...]
    dims: tuple[tuple[str, Any], ...]
    after: Sharding
    bytes_per_device: float


def ordered_subsets(axes: Sequence[str]) -> Iterator[tuple[str, ...]]:
    for k in range(1, len(axes) + 1):
        yield from itertools.permutations(axes, k)


MakeMove = Callable[[str, Sequence[str], dict[str, Any], list, Sequence[str], list], Move]


def _mover(ctx: Context, state: Sharding) -> MakeMove:
    """Builds the moves out of `state`: the collective, its axes and attributes and the state's
    new split, partial axes and offsets, priced on the state's buffer."""
    local = _max_local_shape(ctx.mesh, ctx.shape, state)

    def make(kind_: str, axes: Sequence[str], dims: dict[str, Any], new_split: list, new_partial: Sequence[str],
             new_offsets: list) -> Move:
        after = canonical_state(ctx.mesh, new_split, new_partial, state.partial_kind, new_offsets)
        buffer = list(local)
        row = STEP_KINDS[kind_]
        if row.padded:
            # Equal chunks per peer: the buffer is padded to a multiple of the group along the cut dim.
            cut = dims[row.cut]
            group = ctx.mesh.group_size(axes)
            buffer[cut] = ceildiv(buffer[cut], group) * group
        return Move(kind_, tuple(axes), tuple(dims.items()), after, math.prod(buffer) * ctx.dtype_bytes)

    return make


@lru_cache(maxsize=65536)
def _max_local_shape(mesh: Mesh, shape: tuple[int, ...], state: Sharding) -> tuple[int, ...]:
    """Kept: a monotone search builds the moves out of one state for many pairs."""
    return state.max_local_shape(mesh, shape)


def with_dim(seq: list, d: int, value: Any) -> list:
    return seq[:d] + [value] + seq[d + 1:]


@lru_cache(maxsize=65536)
def offered_moves(ctx: Context, state: Sharding) -> tuple[tuple[Move, ...], tuple[Move, ...]]:
    """The moves out of `state` but the permute into the goal: those offered before it and the
    axis-order permutes offered after it."""
    mesh, shape, rank = ctx.mesh, ctx.shape, len(ctx.shape)
    split = [state.dim_axes(d) for d in range(rank)]
    offsets = [dim_offsets(state, d) for d in range(rank)]
    partial, kind = state.partial_axes, state.partial_kind
    count = mesh.group_size
    moves: list[Move] = []
    make = _mover(ctx, state)

    def add(kind_: str, axes: Sequence[str], dims: dict[str, Any], new_split: list, new_partial: Sequence[str],
            new_offsets: list) -> None:
        moves.append(make(kind_, axes, dims, new_split, new_partial, new_offsets))

    drop = [a for a in partial if a not in ctx.goal_partial]
    for k in range(1, len(drop) + 1):
        for axes in itertools.combinations(drop, k):
            rest = [a for a in partial if a not in axes]
            add("all_reduce", axes, {"reduction": kind}, split, rest, offsets)
            for order in itertools.permutations(axes):
                for d in ctx.dims:
                    if not offsets[d] and _slice_exact(shape[d], count(split[d]), count(order)):
                        add("reduce_scatter", order, {"reduction": kind, "scatter_axis": d},
                            with_dim(split, d, split[d] + order), rest, offsets)

    for d in ctx.dims:
        for k in range(1, len(split[d]) + 1):
            major, minor = split[d][:-k], split[d][-k:]
            if not (major == () or (not offsets[d] and _gather_exact(shape[d], count(major), count(minor)))):
                continue
            gathered = with_dim(split, d, major)
            cleared = with_dim(offsets, d, ())
            add("all_gather", minor, {"gather_axis": d}, gathered, partial, cleared)
            for d2 in ctx.dims:
                if d2 != d and not offsets[d2] and _slice_exact(shape[d2], count(split[d2]), count(minor)):
                    add("all_to_all", minor, {"split_axis": d2, "concat_axis": d},
                        with_dim(gathered, d2, split[d2] + minor), partial, cleared)

    used = set(state.used_axes())
    free = [a for a in ctx.axes if a not in used]
    for d in ctx.dims:
        if offsets[d]:
            continue
        for order in ordered_subsets(free):
            if _slice_exact(shape[d], count(split[d]), count(order)):
                add("all_slice", order, {"slice_axis": d}, with_dim(split, d, split[d] + order), partial, offsets)

    swaps = []
    for d in ctx.dims:
        if len(split[d]) > 1 and not offsets[d]:
            swaps += [permute_move(mesh, shape, ctx.dtype_bytes, state,
                                   canonical_state(mesh, with_dim(split, d, order), partial, kind, offsets))
                      for order in itertools.permutations(split[d]) if order != split[d]]
    return tuple(moves), tuple(swaps)


def in_monotone_space(split: Sequence[Sequence[str]], source: Sharding, goal: Sharding) -> bool:
    """Every dim's axes are a prefix of the source's axes of that dim or of the goal's: each mesh
    axis is where the source has it, where the goal has it, or unused (at most 3 roles per axis)."""
    for d, axes in enumerate(split):
        n = len(axes)
        if tuple(axes) != source.dim_axes(d)[:n] and tuple(axes) != goal.dim_axes(d)[:n]:
            return False
    return True


@lru_cache(maxsize=65536)
def monotone_runs(axes: tuple[str, ...], goal: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """The runs of axes whose appending to a dim split over `axes` keeps it a prefix of the goal's
    split of that dim (`goal`)."""
    n = len(axes)
    return tuple(goal[n:n + k] for k in range(1, len(goal) - n + 1)) if goal[:n] == axes else ()


def monotone_moves(ctx: Context, state: Sharding) -> tuple[Move, ...]:
    """The all_reduces out of `state`, of the partial axes the goal does not keep."""
    split = [state.dim_axes(d) for d in range(len(ctx.shape))]
    offsets = [dim_offsets(state, d) for d in range(len(ctx.shape))]
    partial, make = state.partial_axes, _mover(ctx, state)
    drop = [a for a in partial if a not in ctx.goal_partial]
    return tuple(make("all_reduce", axes, {"reduction": state.partial_kind}, split,
                      [a for a in partial if a not in axes], offsets)
                 for k in range(1, len(drop) + 1) for axes in itertools.combinations(drop, k))


def monotone_dim_moves(ctx: Context, state: Sharding, d: int, leaving: tuple[bool, ...],
                       runs: tuple[tuple[str, ...], ...]) -> tuple[Move, ...]:
    """The moves out of `state` on dim `d` in a monotone space, where an axis only ever leaves its
    place in the source and enters its place in the goal: the gathers of a suffix of the dim's
    axes while they are a prefix of the source's (`leaving[d]`), and the reduce_scatter of partial
    axes, all_slice of unused ones or all_to_all from a dim still leaving that appends one of
    `runs` (`monotone_runs`); exact cuts only, as `offered_moves`."""
    shape, rank = ctx.shape, len(ctx.shape)
    split = [state.dim_axes(e) for e in range(rank)]
    offsets = [dim_offsets(state, e) for e in range(rank)]
    partial, kind = state.partial_axes, state.partial_kind
    count = ctx.mesh.group_size
    make = _mover(ctx, state)
    moves: list[Move] = []

    def gatherable(e: int, k: int) -> bool:
        major, minor = split[e][:-k], split[e][-k:]
        return major == () or (not offsets[e] and _gather_exact(shape[e], count(major), count(minor)))

    if leaving[d]:
        moves += [make("all_gather", split[d][-k:], {"gather_axis": d}, with_dim(split, d, split[d][:-k]), partial,
                       with_dim(offsets, d, ()))
                  for k in range(1, len(split[d]) + 1) if gatherable(d, k)]
    if offsets[d]:
        return tuple(moves)
    used = set(state.used_axes())
    drop = {a for a in partial if a not in ctx.goal_partial}
    for run in runs:
        if not _slice_exact(shape[d], count(split[d]), count(run)):
            continue
        appended = with_dim(split, d, split[d] + run)
        if set(run) <= drop:
            moves.append(make("reduce_scatter", run, {"reduction": kind, "scatter_axis": d}, appended,
                              [a for a in partial if a not in run], offsets))
        elif not set(run) & used:
            moves.append(make("all_slice", run, {"slice_axis": d}, appended, partial, offsets))
        for e in range(rank):
            if e != d and leaving[e] and split[e][-len(run):] == run and gatherable(e, len(run)):
                moves.append(make("all_to_all", run, {"split_axis": d, "concat_axis": e},
                                  with_dim(with_dim(split, e, split[e][:-len(run)]), d, split[d] + run), partial,
                                  with_dim(offsets, e, ())))
    return tuple(moves)


def goal_after(mesh: Mesh, state: Sharding, goal: Sharding) -> Sharding | None:
    """Where the permute into the goal's split leads from `state` (keeping its partial axes, to be
    reduced later), or None when it is not offered: the state lacks a partial axis the goal
    keeps, or the goal splits a dim over an axis the state is partial over."""
    partial = state.partial_axes
    if not partial and not goal.partial_axes:  # the common case, without building the state
        return goal if goal != state else None
    if not set(goal.partial_axes) <= set(partial) or any(a in partial for axes in goal.split_axes for a in axes):
        return None
    after = canonical_state(mesh, goal.split_axes, partial, state.partial_kind, goal.dims_offsets)
    return after if after != state else None


def permute_move(mesh: Mesh, shape: tuple[int, ...], dtype_bytes: float, state: Sharding, after: Sharding) -> Move:
    moved = int(missing_elements(mesh, shape, state, after).max()) * dtype_bytes
    return Move("permute", exchange_axes(mesh, len(shape), state, after), (), after, moved)


def priced_permute(mesh: Mesh, shape: tuple[int, ...], dtype_bytes: float, state: Sharding, after: Sharding,
                   price: Price) -> tuple[Move, float]:
    """`permute_move` and its `price_move`, from one pass over the devices."""
    missing, peers = exchange_extent(mesh, shape, state, after)
    move = Move("permute", exchange_axes(mesh, len(shape), state, after), (), after, missing * dtype_bytes)
    return move, _permute_price(mesh, move, peers, price)


def halo_move(mesh: Mesh, shape: tuple[int, ...], dtype_bytes: float, state: Sharding, after: Sharding) -> Move:
    """The update_halo from `state` to `after` (the same split, other halos), exchanging along the
    axes of the dims that have a halo on either side; priced on the most any device receives."""
    haloed = [d for d in range(len(shape)) if state.halo(d) != (0, 0) or after.halo(d) != (0, 0)]
    axes = tuple(a for a in mesh.axis_names if any(a in after.dim_axes(d) for d in haloed))
    dims = (("source_halo_sizes", tuple(state.flat_halo_sizes())), ("destination_halo_sizes", tuple(after.flat_halo_sizes())))
    received = int(halo_received_elements(mesh, shape, state, after).max())
    return Move("update_halo", axes, dims, after, received * dtype_bytes)


def build_step(mesh: Mesh, shape: tuple[int, ...], before: Sharding, move: Move, seconds: float) -> CollectiveStep:
    later = {"transfers": partial(device_transfers, mesh, shape, before, move.after, move.mesh_axes)} \
        if move.kind == "permute" else None
    return CollectiveStep(move.kind, move.mesh_axes, StepDims(move.dims, later), before.max_local_shape(mesh, shape),
                          move.after.max_local_shape(mesh, shape), move.bytes_per_device, seconds, before, move.after)


def price_move(mesh: Mesh, shape: tuple[int, ...], state: Sharding, move: Move, price: Price) -> float:
    """A collective's own price; a permute in which every device receives from at most one
    other device is point-to-point traffic (send_recv of the most any device receives), while
    one that gathers from several peers is an all-to-all exchange and is priced as one, so that
    it pays the same fixed costs as the collectives it replaces."""
    if move.kind == "update_halo":
        # Dropping halos is local; anything else is point-to-point traffic with the neighbours.
        return price(STEP_KINDS["update_halo"].price_kind, move.mesh_axes, move.bytes_per_device) if move.bytes_per_device else 0.0
    if move.kind != "permute":
        return price(move.kind, move.mesh_axes, move.bytes_per_device)
    return _permute_price(mesh, move, fan_in(mesh, shape, state, move.after), price)


def _permute_price(mesh: Mesh, move: Move, peers: int, price: Price) -> float:
    """A permute's price when the most peers any device receives from is `peers`."""
    if peers <= 1:
        return price(STEP_KINDS["permute"].price_kind, move.mesh_axes, move.bytes_per_device)
    group = mesh.group_size(move.mesh_axes)
    return price("all_to_all", move.mesh_axes, move.bytes_per_device * group / (group - 1))

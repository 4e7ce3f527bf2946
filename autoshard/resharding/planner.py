"""Plan the collectives that turn one sharding of a tensor into another, cheapest first.

States are shardings; moves are single collectives whose exact effect (pieces cut by the
reference's ceildiv rule, uneven shards included) turns one sharding into another:

- `all_reduce` / `reduce_scatter` drop partial axes (the latter appends them to a dim);
- `all_gather` drops a suffix of a dim's axes; `all_slice` appends free axes to a dim;
- `all_to_all` moves a suffix of one dim's axes to the end of another dim's;
- `permute` is a direct point-to-point exchange into the target (or an axis-order swap): each
  device receives only the part of its new shard it does not already hold, from a device that
  holds it (see README.md).

A move is offered only where it is exact for this tensor's sizes. Dijkstra over the states,
priced by the caller's `price(kind, mesh_axes, bytes_per_device)`, returns the cheapest sequence
(ties: fewer permutes, then fewer steps). Intermediate shardings use only the mesh axes and dims
that the source or the target uses.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from autoshard.errors import ShardingError
from autoshard.mesh import Device, Mesh
from autoshard.sharding import Sharding, ceildiv

Price = Callable[[str, tuple[str, ...], float], float]
Box = tuple[tuple[int, int], ...]

STEP_KINDS = ("all_gather", "all_slice", "all_to_all", "all_reduce", "reduce_scatter", "permute")
_IDEMPOTENT_KINDS = ("max", "min")



class Transfer(NamedTuple):
    """`target`'s new local `target_box` is `source`'s old local `source_box` (per-dim (start, stop))."""

    source: Device
    target: Device
    source_box: Box
    target_box: Box

    def to_json(self) -> dict[str, Any]:
        return {"source": list(self.source), "target": list(self.target),
                "source_box": [list(b) for b in self.source_box], "target_box": [list(b) for b in self.target_box]}


@dataclass(frozen=True, slots=True)
class CollectiveStep:
    """One collective of a resharding. `dims` holds the tensor dims and attributes involved:
    all_gather `gather_axis`; all_slice `slice_axis`; all_to_all `split_axis`, `concat_axis`;
    all_reduce `reduction`; reduce_scatter `reduction`, `scatter_axis`; permute `transfers`
    (every device's new buffer, self copies included). Local shapes are the largest shard (the
    buffer every device allocates); `bytes_per_device` is what `price` was given: the input
    buffer (for all_to_all and reduce_scatter padded to equal chunks per peer along the cut dim),
    or for permute the most any device receives."""

    kind: str
    mesh_axes: tuple[str, ...]
    dims: Mapping[str, Any] = field(hash=False)
    in_local_shape: tuple[int, ...]
    out_local_shape: tuple[int, ...]
    bytes_per_device: float
    seconds: float
    before: Sharding
    after: Sharding

    @property
    def pairs(self) -> tuple[tuple[Device, Device], ...]:
        """(source, target) device pairs that exchange data in a permute (self copies left out)."""
        return tuple((t.source, t.target) for t in self.dims.get("transfers", ()) if t.source != t.target)

    def to_json(self) -> dict[str, Any]:
        dims = {k: [t.to_json() for t in v] if k == "transfers" else v for k, v in self.dims.items()}
        return {"kind": self.kind, "mesh_axes": list(self.mesh_axes), "dims": dims,
                "in_local_shape": list(self.in_local_shape), "out_local_shape": list(self.out_local_shape),
                "bytes_per_device": self.bytes_per_device, "seconds": self.seconds,
                "before": self.before.to_json(), "after": self.after.to_json()}


@dataclass(frozen=True, slots=True)
class Resharding:
    """The steps from `source` to `target`, and what they cost."""

    shape: tuple[int, ...]
    dtype_bytes: float
    source: Sharding
    target: Sharding
    steps: tuple[CollectiveStep, ...]
    max_bytes_received_per_device: float

    @property
    def seconds(self) -> float:
        return sum(step.seconds for step in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype_bytes": self.dtype_bytes, "source": self.source.to_json(),
                "target": self.target.to_json(), "steps": [s.to_json() for s in self.steps],
                "seconds": self.seconds, "max_bytes_received_per_device": self.max_bytes_received_per_device}


@dataclass(frozen=True, slots=True)
class BytesMovedPrice:
    """Ring-style bytes each device receives, over a flat link of `bytes_per_s_oneway`: a price for tests
    and for comparing plans without a hardware profile."""

    mesh: Mesh
    bytes_per_s_oneway: float = 1e9

    def __call__(self, kind: str, mesh_axes: tuple[str, ...], bytes_per_device: float) -> float:
        g = self.mesh.group_size(mesh_axes)
        factor = {"all_gather": g - 1, "all_slice": 0.0, "all_to_all": (g - 1) / g, "reduce_scatter": (g - 1) / g,
                  "all_reduce": 2 * (g - 1) / g, "send_recv": 1.0}[kind]
        return factor * bytes_per_device / self.bytes_per_s_oneway


def bytes_moved_price(mesh: Mesh, bytes_per_s_oneway: float = 1e9) -> BytesMovedPrice:
    return BytesMovedPrice(mesh, bytes_per_s_oneway)


# --- exactness of local cuts --------------------------------------------------------------

def _pieces(length: int, count: int) -> list[tuple[int, int]]:
    """The reference's cut of `length` into `count` ceildiv pieces (as Sharding.dim_bounds)."""
    step = ceildiv(length, count)
    return [(min(k * step, length), min((k + 1) * step, length)) for k in range(count)]


@lru_cache(maxsize=4096)
def _gather_exact(size: int, major: int, minor: int) -> bool:
    """Concatenating `minor` consecutive shards of a `major*minor` split gives the `major` split."""
    fine = _pieces(size, major * minor)
    return all((fine[p * minor][0], fine[p * minor + minor - 1][1]) == bounds for p, bounds in enumerate(_pieces(size, major)))


@lru_cache(maxsize=4096)
def _slice_exact(size: int, major: int, minor: int) -> bool:
    """Cutting each shard of the `major` split into `minor` pieces gives the `major*minor` split."""
    fine = _pieces(size, major * minor)
    return all((a + s, a + e) == fine[p * minor + j]
               for p, (a, b) in enumerate(_pieces(size, major)) for j, (s, e) in enumerate(_pieces(b - a, minor)))


# --- states and moves ---------------------------------------------------------------------

def _state(mesh: Mesh, split: Sequence[Sequence[str]], partial: Sequence[str], kind: str,
           offsets: Sequence[Sequence[int]]) -> Sharding:
    """A canonical sharding: partial axes in mesh order, kind `sum` when nothing is partial."""
    partial = tuple(sorted(partial, key=mesh.axis_index))
    return Sharding(tuple(tuple(a) for a in split), partial, kind if partial else "sum", tuple(tuple(o) for o in offsets))


def _effective_target(mesh: Mesh, source: Sharding, target: Sharding) -> Sharding:
    """The target with partial axes the source lacks removed: a replicated value is a valid
    max/min-partial one; a sum/product-partial value cannot be made by resharding."""
    keep = [a for a in target.partial_axes if a in source.partial_axes and source.partial_kind == target.partial_kind]
    extra = [a for a in target.partial_axes if a not in keep]
    if extra and target.partial_kind not in _IDEMPOTENT_KINDS:
        raise ShardingError(f"target is {target.partial_kind}-partial over {extra} but the source ({source}) is not "
                            f"{target.partial_kind}-partial there; resharding can only reduce partial values", "target/partial")
    return _state(mesh, target.split_axes, keep, target.partial_kind, target.dims_offsets)


@dataclass(frozen=True, slots=True)
class _Context:
    """What the moves out of a state depend on. The goal enters only through the partial axes it
    keeps (never reduced) and through the permute straight into it (`_goal_permute`), so one
    context serves every goal with those partial axes."""

    mesh: Mesh
    shape: tuple[int, ...]
    dtype_bytes: float
    axes: tuple[str, ...]
    dims: tuple[int, ...]
    goal_partial: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Move:
    kind: str
    mesh_axes: tuple[str, ...]
    dims: tuple[tuple[str, Any], ...]
    after: Sharding
    bytes_per_device: float


def _ordered_subsets(axes: Sequence[str]) -> Iterator[tuple[str, ...]]:
    for k in range(1, len(axes) + 1):
        yield from itertools.permutations(axes, k)


@lru_cache(maxsize=4096)
def _boxes(mesh: Mesh, shape: tuple[int, ...], sharding: Sharding) -> np.ndarray:
    """`[device linear index, dim] -> (start, stop)`: Sharding.device_slices for all devices at once."""
    coords = np.indices(mesh.shape).reshape(len(mesh.shape), -1)
    out = np.empty((coords.shape[1], len(shape), 2), np.int64)
    for d, size in enumerate(shape):
        shard = np.zeros(coords.shape[1], np.int64)
        for axis in sharding.dim_axes(d):
            shard = shard * mesh.axis_size(axis) + coords[mesh.axis_index(axis)]
        out[:, d] = np.array(sharding.dim_bounds(mesh, size, d))[shard]
    return out


def _box(boxes: np.ndarray, index: int) -> Box:
    return tuple((int(a), int(b)) for a, b in boxes[index])


def _volume(box: Box) -> int:
    return math.prod(b - a for a, b in box)


@lru_cache(maxsize=1024)
def _shard_of_device(mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """Per device (linear index): the index of its shard of a dim split over `axes`."""
    coords = np.indices(mesh.shape).reshape(len(mesh.shape), -1)
    shard = np.zeros(coords.shape[1], np.int64)
    for axis in axes:
        shard = shard * mesh.axis_size(axis) + coords[mesh.axis_index(axis)]
    return shard


@lru_cache(maxsize=65536)
def _dim_overlap(size: int, before: tuple[int, tuple[int, ...]], after: tuple[int, tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Along one dim cut into `count` shards or at explicit `offsets` as `before` and as `after`
    (each `(count, offsets)`): `[old shard, new shard]` overlap lengths, each new shard's length,
    and how many old shards each new shard meets."""
    old, new = (np.array(list(zip(offsets, offsets[1:])) if offsets else _pieces(size, count)).reshape(-1, 2)
                for count, offsets in (before, after))
    overlap = np.clip(np.minimum(old[:, None, 1], new[None, :, 1]) - np.maximum(old[:, None, 0], new[None, :, 0]), 0, None)
    return overlap, new[:, 1] - new[:, 0], (overlap > 0).sum(axis=0)


@lru_cache(maxsize=65536)
def _dim_exchange(mesh: Mesh, size: int, old_axes: tuple[str, ...], old_offsets: tuple[int, ...],
                  new_axes: tuple[str, ...], new_offsets: tuple[int, ...]) -> np.ndarray:
    """Along one dim, per device (rows): its new range's length, the part its old range holds,
    and how many old ranges its new range meets."""
    overlap, length, met = _dim_overlap(size, (mesh.group_size(old_axes), old_offsets), (mesh.group_size(new_axes), new_offsets))
    old_shard, new_shard = _shard_of_device(mesh, old_axes), _shard_of_device(mesh, new_axes)
    return np.stack([length[new_shard], overlap[old_shard, new_shard], met[new_shard]])


@lru_cache(maxsize=4096)
def _overlaps(mesh: Mesh, shape: tuple[int, ...], before: Sharding, after: Sharding) -> np.ndarray:
    """Per device (rows): elements of its new shard, of those its old shard holds, and the old
    shards its new shard meets. Dims are independent: each device's shard is a box, one range
    per dim picked by the device's coordinates on that dim's axes."""
    whole = 1  # the dims split in neither, whole on every device
    product = None
    for d, size in enumerate(shape):
        old_axes, new_axes, old_offsets, new_offsets = before.dim_axes(d), after.dim_axes(d), _dim_offsets(before, d), _dim_offsets(after, d)
        if not (old_axes or new_axes or old_offsets or new_offsets):
            whole *= size
            continue
        rows = _dim_exchange(mesh, size, old_axes, old_offsets, new_axes, new_offsets)
        product = rows if product is None else product * rows
    if product is None:
        product = np.ones((3, mesh.num_devices), np.int64)
    return product * np.array([[whole], [whole], [int(whole > 0)]], np.int64)


def _missing(mesh: Mesh, shape: tuple[int, ...], before: Sharding, after: Sharding) -> np.ndarray:
    """Per device: elements of its new shard that its old shard does not hold."""
    new_volume, held, _ = _overlaps(mesh, shape, before, after)
    return new_volume - held


def _exchange_axes(mesh: Mesh, rank: int, before: Sharding, after: Sharding) -> tuple[str, ...]:
    """Axes a direct exchange may cross: those of dims whose split changes, and axes whose role
    (split, partial, unused) changes. On every other axis sender and receiver agree."""
    changed = set()
    for d in range(rank):
        if before.dim_axes(d) != after.dim_axes(d) or _dim_offsets(before, d) != _dim_offsets(after, d):
            changed.update(before.dim_axes(d), after.dim_axes(d))
    changed.update(set(before.partial_axes) ^ set(after.partial_axes))
    return tuple(a for a in mesh.axis_names if a in changed)


def _dim_offsets(sharding: Sharding, dim: int) -> tuple[int, ...]:
    return sharding.dims_offsets[dim] if dim < len(sharding.dims_offsets) else ()


@lru_cache(maxsize=65536)
def _moves(ctx: _Context, state: Sharding) -> tuple[tuple[_Move, ...], tuple[_Move, ...]]:
    """The moves out of `state` but the permute into the goal: those offered before it and the
    axis-order permutes offered after it."""
    mesh, shape, rank = ctx.mesh, ctx.shape, len(ctx.shape)
    split = [state.dim_axes(d) for d in range(rank)]
    offsets = [_dim_offsets(state, d) for d in range(rank)]
    partial, kind = state.partial_axes, state.partial_kind
    local = state.max_local_shape(mesh, shape)
    count = mesh.group_size
    moves: list[_Move] = []

    def add(kind_: str, axes: Sequence[str], dims: dict[str, Any], new_split: list, new_partial: Sequence[str],
            new_offsets: list) -> None:
        after = _state(mesh, new_split, new_partial, kind, new_offsets)
        buffer = list(local)
        cut = dims.get("split_axis", dims.get("scatter_axis"))
        if cut is not None:
            # Equal chunks per peer: the buffer is padded to a multiple of the group along the cut dim.
            buffer[cut] = ceildiv(buffer[cut], count(axes)) * count(axes)
        moves.append(_Move(kind_, tuple(axes), tuple(dims.items()), after, math.prod(buffer) * ctx.dtype_bytes))

    def with_dim(seq: list, d: int, value: Any) -> list:
        return seq[:d] + [value] + seq[d + 1:]

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
        for order in _ordered_subsets(free):
            if _slice_exact(shape[d], count(split[d]), count(order)):
                add("all_slice", order, {"slice_axis": d}, with_dim(split, d, split[d] + order), partial, offsets)

    swaps = []
    for d in ctx.dims:
        if len(split[d]) > 1 and not offsets[d]:
            swaps += [_permute(mesh, shape, ctx.dtype_bytes, state, _state(mesh, with_dim(split, d, order), partial, kind, offsets))
                      for order in itertools.permutations(split[d]) if order != split[d]]
    return tuple(moves), tuple(swaps)


def _goal_after(mesh: Mesh, state: Sharding, goal: Sharding) -> Sharding | None:
    """Where the permute into the goal's split leads from `state` (keeping its partial axes, to be
    reduced later), or None when it is not offered: the state lacks a partial axis the goal
    keeps, or the goal splits a dim over an axis the state is partial over."""
    partial = state.partial_axes
    if not partial and not goal.partial_axes:  # the common case, without building the state
        return goal if goal != state else None
    if not set(goal.partial_axes) <= set(partial) or any(a in partial for axes in goal.split_axes for a in axes):
        return None
    after = _state(mesh, goal.split_axes, partial, state.partial_kind, goal.dims_offsets)
    return after if after != state else None


def _permute(mesh: Mesh, shape: tuple[int, ...], dtype_bytes: float, state: Sharding, after: Sharding) -> _Move:
    moved = int(_missing(mesh, shape, state, after).max()) * dtype_bytes
    return _Move("permute", _exchange_axes(mesh, len(shape), state, after), (), after, moved)


# --- the direct exchange ------------------------------------------------------------------

def _fan_in(mesh: Mesh, shape: tuple[int, ...], before: Sharding, after: Sharding) -> int:
    """The most peers any device receives a tile from in the direct exchange: its new shard
    cut along the old shards' bounds gives one tile per overlapping old shard, all but its own
    from another device."""
    _, held, tiles = _overlaps(mesh, shape, before, after)
    return int((tiles - (held > 0)).max())


@lru_cache(maxsize=256)
def _transfers(mesh: Mesh, shape: tuple[int, ...], before: Sharding, after: Sharding,
               axes: tuple[str, ...]) -> tuple[Transfer, ...]:
    """Every device's new shard, cut along the old shards' bounds; each tile comes from the
    device itself when it holds it, else from the least-loaded holder that agrees with the
    receiver outside `axes` (and on every partial axis)."""
    old = {d: _box(_boxes(mesh, shape, before), i) for i, d in enumerate(mesh.devices())}
    new = {d: _box(_boxes(mesh, shape, after), i) for i, d in enumerate(mesh.devices())}
    fixed = [i for i, name in enumerate(mesh.axis_names) if name not in axes or name in before.partial_axes]
    holders: dict[tuple[Box, tuple[int, ...]], list[Device]] = {}
    for device in mesh.devices():
        holders.setdefault((old[device], tuple(device[i] for i in fixed)), []).append(device)
    bounds = [before.dim_bounds(mesh, size, d) for d, size in enumerate(shape)]
    sent: dict[Device, int] = {}
    transfers = []
    for target in mesh.devices():
        box = new[target]
        cuts = [[(s, e) for s, e in dim_bounds if max(s, a) < min(e, b)] for dim_bounds, (a, b) in zip(bounds, box)]
        for shard in itertools.product(*cuts):
            tile = tuple((max(s, a), min(e, b)) for (s, e), (a, b) in zip(shard, box))
            if old[target] == shard:
                source = target
            else:
                candidates = holders[(shard, tuple(target[i] for i in fixed))]
                source = min(candidates, key=lambda d: (sent.get(d, 0), sum(x != y for x, y in zip(d, target)),
                                                        mesh.linear_index(d)))
                sent[source] = sent.get(source, 0) + _volume(tile)
            transfers.append(Transfer(source, target, tuple((a - s, b - s) for (a, b), (s, _) in zip(tile, shard)),
                                      tuple((a - s, b - s) for (a, b), (s, _) in zip(tile, box))))
    return tuple(transfers)


# --- planning -----------------------------------------------------------------------------

def _received_elements(mesh: Mesh, shape: tuple[int, ...], step: CollectiveStep) -> dict[Device, float]:
    """Elements each device receives in `step`: the part of its new shard it did not hold, or
    for reductions the ring volume."""
    if step.kind in ("all_reduce", "reduce_scatter"):
        g = mesh.group_size(step.mesh_axes)
        factor = (2 if step.kind == "all_reduce" else 1) * (g - 1) / g
        boxes = _boxes(mesh, shape, step.before)
        return dict(zip(mesh.devices(), factor * (boxes[..., 1] - boxes[..., 0]).prod(axis=1)))
    return dict(zip(mesh.devices(), _missing(mesh, shape, step.before, step.after).astype(float)))


def _build_step(mesh: Mesh, shape: tuple[int, ...], before: Sharding, move: _Move, seconds: float) -> CollectiveStep:
    dims = dict(move.dims)
    if move.kind == "permute":
        dims["transfers"] = _transfers(mesh, shape, before, move.after, move.mesh_axes)
    return CollectiveStep(move.kind, move.mesh_axes, MappingProxyType(dims), before.max_local_shape(mesh, shape),
                          move.after.max_local_shape(mesh, shape), move.bytes_per_device, seconds, before, move.after)


def _price_move(mesh: Mesh, shape: tuple[int, ...], state: Sharding, move: _Move, price: Price) -> float:
    """A collective's own price; a permute in which every device receives from at most one
    other device is point-to-point traffic (send_recv of the most any device receives), while
    one that gathers from several peers is an all-to-all exchange and is priced as one, so that
    it pays the same fixed costs as the collectives it replaces."""
    if move.kind != "permute":
        return price(move.kind, move.mesh_axes, move.bytes_per_device)
    if _fan_in(mesh, shape, state, move.after) <= 1:
        return price("send_recv", move.mesh_axes, move.bytes_per_device)
    group = mesh.group_size(move.mesh_axes)
    return price("all_to_all", move.mesh_axes, move.bytes_per_device * group / (group - 1))


class _Edge(NamedTuple):
    after: int  # state id in its _Space
    seconds: float
    permutes: int
    move: _Move


class _Space:
    """The states of one context as small ints, with their priced moves, filled in as searches
    reach them (ints hash and compare far faster than shardings)."""

    def __init__(self, ctx: _Context, moves: "PricedMoves"):
        self.ctx, self.moves = ctx, moves
        self.states: list[Sharding] = []
        self.ids: dict[Sharding, int] = {}
        self.out: list[tuple[tuple[_Edge, ...], tuple[_Edge, ...]] | None] = []
        self.into_goal: dict[tuple[int, int], _Edge | None] = {}
        self.trees: dict[int, _PathTree] = {}

    def id(self, state: Sharding) -> int:
        found = self.ids.get(state)
        if found is None:
            found = self.ids[state] = len(self.states)
            self.states.append(state)
            self.out.append(None)
        return found

    def edges(self, state: int, goal: int) -> tuple[_Edge, ...]:
        """Every move out of `state` towards `goal`, in the order Dijkstra relaxes them: the
        goal-independent ones with the permute into the goal between `head` and `swaps`."""
        head, swaps = self.base_edges(state)
        edge = self.goal_edge(state, goal)
        return head + swaps if edge is None else head + (edge,) + swaps

    def base_edges(self, state: int) -> tuple[tuple[_Edge, ...], tuple[_Edge, ...]]:
        out = self.out[state]
        if out is None:
            head, swaps = _moves(self.ctx, self.states[state])
            out = self.out[state] = (tuple(self._edge(state, m) for m in head), tuple(self._edge(state, m) for m in swaps))
        return out

    def goal_edge(self, state: int, goal: int) -> _Edge | None:
        """The permute from `state` into `goal`'s split, if offered."""
        key = (state, goal)
        if key not in self.into_goal:
            after = _goal_after(self.ctx.mesh, self.states[state], self.states[goal])
            self.into_goal[key] = None if after is None else self._edge(state, self.moves.permute(self.ctx, self.states[state], after))
        return self.into_goal[key]

    def tree(self, start: int) -> "_PathTree":
        found = self.trees.get(start)
        if found is None:
            found = self.trees[start] = _PathTree(self, start)
        return found

    def _edge(self, state: int, move: _Move) -> _Edge:
        seconds = self.moves.seconds(self.ctx, self.states[state], move)
        return _Edge(self.id(move.after), seconds, int(move.kind == "permute"), move)


class PricedMoves:
    """The moves out of each state with their prices under one `price`, kept across searches:
    a graph's identical layers ask about the same states for many sources and targets. Pass
    one to `plan_resharding` / `resharding_cost` for every resharding priced by `price`."""

    def __init__(self, price: Price):
        self._price, self._prices = price, {}
        self._spaces: dict[tuple, _Space] = {}
        self._permutes: dict[tuple, tuple[_Move, float]] = {}  # permutes priced once for every context

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
            ctx = _Context(mesh, shape, dtype_bytes, tuple(a for a in mesh.axis_names if a in axes), tuple(sorted(dims)), goal_partial)
            found = self._spaces[key] = _Space(ctx, self)
        return found

    def permute(self, ctx: _Context, state: Sharding, after: Sharding) -> _Move:
        return self._priced_permute(ctx, state, after)[0]

    def seconds(self, ctx: _Context, state: Sharding, move: _Move) -> float:
        if move.kind == "permute":
            return self._priced_permute(ctx, state, move.after)[1]
        return self.price(move.kind, move.mesh_axes, move.bytes_per_device)

    def _priced_permute(self, ctx: _Context, state: Sharding, after: Sharding) -> tuple[_Move, float]:
        key = (ctx.mesh, ctx.shape, ctx.dtype_bytes, state, after)
        found = self._permutes.get(key)
        if found is None:
            move = _permute(ctx.mesh, ctx.shape, ctx.dtype_bytes, state, after)
            found = self._permutes[key] = (move, _price_move(ctx.mesh, ctx.shape, state, move, self.price))
        return found


_UNKNOWN = object()  # a goal edge not worked out yet (None: worked out, not offered)


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

    def settle(self, goal: int) -> None:
        """Pop states until `goal` is settled or none is left."""
        best, came, frontier = self.best, self.came, self._frontier
        while goal not in self.rank and frontier:
            key, _, state = heapq.heappop(frontier)
            if key > best[state]:
                continue
            self.rank[state] = len(self.order)
            self.order.append(state)
            head, swaps = self.space.base_edges(state)
            if state in came:
                before, index = came[state]
                move = self._edge(before, index).move
                self.bytes[state] = self.bytes[before] + (move.bytes_per_device if move.kind != "all_slice" else 0)
            at = key[0]
            for index, (after, seconds, permutes, _) in enumerate(head + swaps):
                known = best.get(after)
                if known is not None and at + seconds > known[0]:
                    continue
                new_key = (at + seconds, key[1] + permutes, key[2] + 1)
                if known is None or new_key < known:
                    best[after] = new_key
                    came[after] = (state, index)
                    heapq.heappush(frontier, (new_key, next(self._tie), after))

    def cost(self, goal: int) -> tuple[float, float]:
        """Seconds and bytes of the path `_search` finds to `goal`."""
        self.settle(goal)
        key = position = None
        bytes_ = 0.0
        if goal in self.rank:
            key, bytes_ = self.best[goal], self.bytes[goal]
            if goal in self.came:
                # Relaxations happen in pop order, then in edge order with the goal permute
                # between head and swaps; the first one reaching the least key is kept.
                before, index = self.came[goal]
                position = (self.rank[before], 0 if index < len(self.space.base_edges(before)[0]) else 2)
        best, into_goal, goal_edge = self.best, self.space.into_goal, self.space.goal_edge
        for state in self.order:
            at = best[state]
            if key is not None and not at < key:
                break
            edge = into_goal.get((state, goal), _UNKNOWN)
            if edge is _UNKNOWN:
                edge = goal_edge(state, goal)
            if edge is None or (key is not None and at[0] + edge.seconds > key[0]):
                continue
            new_key = (at[0] + edge.seconds, at[1] + 1, at[2] + 1)
            if key is None or new_key < key or (new_key == key and (self.rank[state], 1) < position):
                key, position = new_key, (self.rank[state], 1)
                bytes_ = self.bytes[state] + edge.move.bytes_per_device
        if key is None:
            raise ShardingError(f"no resharding reaches {self.space.states[goal]}", "target")
        return key[0], float(bytes_)

    def _edge(self, state: int, index: int) -> _Edge:
        head, swaps = self.space.base_edges(state)
        return head[index] if index < len(head) else swaps[index - len(head)]


@lru_cache(maxsize=65536)
def _endpoint(mesh: Mesh, shape: tuple[int, ...], sharding: Sharding, where: str) -> tuple[Sharding, frozenset[str], frozenset[int]]:
    """A checked source or target as a canonical state, with the mesh axes and dims it uses."""
    sharding.check(mesh, shape, where)
    state = _state(mesh, sharding.split_axes, sharding.partial_axes, sharding.partial_kind, sharding.dims_offsets)
    return state, frozenset(sharding.used_axes()), frozenset(d for d, axes in enumerate(sharding.split_axes) if axes)


def _space(mesh: Mesh, shape: tuple[int, ...], dtype_bytes: float, source: Sharding, target: Sharding,
           moves: PricedMoves) -> tuple[_Space, int, int]:
    """The space a search from `source` to `target` runs in, and its start and goal."""
    start, source_axes, source_dims = _endpoint(mesh, shape, source, "source")
    goal, target_axes, target_dims = _endpoint(mesh, shape, target, "target")
    if target.partial_axes:
        goal = _effective_target(mesh, source, target)
    space = moves.space(mesh, shape, dtype_bytes, source_axes | target_axes, source_dims | target_dims, goal.partial_axes)
    return space, space.id(start), space.id(goal)


def _search(mesh: Mesh, shape: tuple[int, ...], dtype_bytes: float, source: Sharding, target: Sharding,
            moves: PricedMoves) -> list[tuple[Sharding, _Move, float]]:
    """Dijkstra from `source` to `target` (ties: fewer permutes, then fewer steps): the cheapest
    path as (state before, move, seconds) steps."""
    space, first, last = _space(mesh, shape, dtype_bytes, source, target, moves)
    best: dict[int, tuple[float, int, int]] = {first: (0.0, 0, 0)}
    came: dict[int, tuple[int, _Move, float]] = {}
    # Seconds of the best path to the goal so far: a state reached later than that is popped
    # after the goal, if ever, and changes nothing, so it is not recorded.
    bound = math.inf
    tie = itertools.count()
    frontier = [(best[first], next(tie), first)]
    while frontier:
        key, _, state = heapq.heappop(frontier)
        if state == last:
            break
        if key > best[state]:
            continue
        at = key[0]
        for after, seconds, permutes, move in space.edges(state, last):
            reached = at + seconds
            if reached > bound:
                continue
            known = best.get(after)
            if known is not None and reached > known[0]:
                continue  # decided by the seconds alone, without building the key
            new_key = (reached, key[1] + permutes, key[2] + 1)
            if known is None or new_key < known:
                best[after] = new_key
                came[after] = (state, move, seconds)
                heapq.heappush(frontier, (new_key, next(tie), after))
                if after == last:
                    bound = reached

    path = []
    state = last
    while state != first:
        before, move, seconds = came[state]
        path.append((space.states[before], move, seconds))
        state = before
    return path[::-1]


def resharding_cost(mesh: Mesh, shape: Sequence[int], dtype_bytes: float, source: Sharding, target: Sharding,
                    moves: PricedMoves) -> tuple[float, float]:
    """`plan_resharding(...)`'s seconds and the bytes per device its steps are priced on (all_slice,
    which moves nothing, left out), without building the steps."""
    shape = tuple(shape)
    if not source.partial_axes:
        space, first, last = _space(mesh, shape, dtype_bytes, source, target, moves)
        return space.tree(first).cost(last)
    path = _search(mesh, shape, dtype_bytes, source, target, moves)
    return sum(seconds for _, _, seconds in path), float(sum(m.bytes_per_device for _, m, _ in path if m.kind != "all_slice"))


def plan_resharding(mesh: Mesh, shape: Sequence[int], dtype_bytes: float, source: Sharding, target: Sharding,
                    price: Price, moves: PricedMoves | None = None) -> Resharding:
    """The cheapest sequence of collectives under `price` that turns `source` into `target`
    (`moves`, if given, must have been made with the same `price`)."""
    shape = tuple(shape)
    path = _search(mesh, shape, dtype_bytes, source, target, moves if moves is not None else PricedMoves(price))
    steps = tuple(_build_step(mesh, shape, before, move, seconds) for before, move, seconds in path)
    totals = {d: 0.0 for d in mesh.devices()}
    for step in steps:
        for d, elements in _received_elements(mesh, shape, step).items():
            totals[d] += elements
    return Resharding(shape, dtype_bytes, source, target, steps, float(max(totals.values()) * dtype_bytes))

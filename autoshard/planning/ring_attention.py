"""Ring attention: the realisation of context parallelism that passes key/value blocks around a
mesh axis (issue 34's second realisation, beside gathering K/V whole and splitting the keys).

An attention op whose option splits the queries over a mesh axis may take it as a ring
(`ShardingOption.ring`): each device holds its query block and its own block of the keys and
values along that axis; in n steps (n the axis size) it computes its queries against the block
it holds while passing that block to the next device (a `shift` by one, rotating) and receiving
the previous device's, accumulating the online-softmax state (row maximum, exponent sums,
weighted values) on the device. No K/V is gathered whole and nothing is all-reduced; the price is
n - 1 point-to-point transfers of a K/V block, overlapped with the blocks' compute
(`planning.costs.ring_attention_seconds`). Attention's gradients take the same ring: a pass for
the row statistics, a pass for the gradient, dk's and dv's accumulators travelling with their
blocks and taken home after the last step (so a ring gradient's dk, dv are whole over the ring
axis, `ShardingOption.ring`).

This module says which options are rings and which steps each device computes; the simulator
(`sim.ring_attention`), the partitioned IR (`mlir.lower_ring`) and the DTensor run
(`frontends.torch.ring_attention`) realise them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from autoshard.errors import ShardingError
from autoshard.graph.model import Graph, Op
from autoshard.mesh import Mesh
from autoshard.ops.nn import BALANCED, KEY_LOOP, QUERY_LOOP, block_causal_pairs
from autoshard.planning.options import ShardingOption

def takes_ring(op: Op) -> bool:
    """Attention and its gradients (which walk the same ring: `sim.ring_attention`)."""
    return op.kind == "attention" or (op.kind == "grad" and op.attrs.get("of") == "attention")


def check_ring(op: Op, option: ShardingOption, mesh: Mesh, where: str) -> None:
    """Raise naming `where` + `/ring` if the option's ring does not fit the op."""
    if option.ring is None:
        return
    at = f"{where}/ring"
    if not takes_ring(op):
        raise ShardingError(f"op {op.name!r} ({op.kind}) cannot take a ring; only attention and its gradients do", at)
    if option.ring not in mesh.axis_names:
        raise ShardingError(f"unknown ring axis {option.ring!r}; the mesh has {list(mesh.axis_names)}", at)
    if option.ring not in option.loop_axes[QUERY_LOOP]:
        raise ShardingError(f"the ring axis {option.ring!r} must split the queries (loop d{QUERY_LOOP}), which are "
                            f"split over {list(option.loop_axes[QUERY_LOOP])}", at)
    if option.loop_axes[KEY_LOOP]:
        raise ShardingError(f"a ring walks the whole key loop d{KEY_LOOP}, which the option splits over "
                            f"{list(option.loop_axes[KEY_LOOP])}", at)
    keys, n = op.nest.extents[KEY_LOOP], mesh.axis_size(option.ring)
    if keys % n:
        raise ShardingError(f"the {keys} keys do not divide into {n} equal blocks around ring axis {option.ring!r}", at)


def ring_options(op: Op, options: Sequence[ShardingOption], mesh: Mesh) -> list[ShardingOption]:
    """The ring variants of an op's options: one per mesh axis splitting the queries, with the
    keys whole and dividing into the axis' blocks."""
    if not takes_ring(op):
        return []
    found = []
    for option in options:
        if option.ring is not None or option.loop_axes[KEY_LOOP]:
            continue
        for axis in option.loop_axes[QUERY_LOOP]:
            if op.nest.extents[KEY_LOOP] % mesh.axis_size(axis) == 0:
                found.append(replace(option, ring=axis))
    return found


def ring_pairs(op: Op, option: ShardingOption, mesh: Mesh) -> list[list[int]]:
    """(query, key) pairs each query block computes at each of the ring's n steps, per batch and
    head: at step j the device at ring coordinate c holds key block (c - j) mod n. Under the
    causal mask a block above the diagonal costs nothing (a kernel skips it), so the steps differ."""
    s, t = op.nest.extents[QUERY_LOOP], op.nest.extents[KEY_LOOP]
    axes = option.loop_axes[QUERY_LOOP]
    parts, n = mesh.group_size(axes), mesh.axis_size(option.ring)
    rows, cols = -(-s // parts), t // n
    minor = mesh.group_size(axes[axes.index(option.ring) + 1:])  # the ring coordinate's stride in the query index
    # a gradient's attributes hold its forward's
    attrs = op.attrs.get("forward", {}) if op.kind == "grad" else op.attrs
    causal, balanced = attrs.get("causal", False), attrs.get(BALANCED)
    found = []
    for index in range(parts):
        first, count = index * rows, min(rows, s - index * rows)
        keys = [((index // minor) % n - j) % n for j in range(n)]
        found.append([block_causal_pairs(first, count, key * cols, cols, s, t, balanced) if causal else count * cols
                      for key in keys])
    return found


def ring_step_pairs(op: Op, option: ShardingOption, mesh: Mesh) -> list[int]:
    """The busiest device's pairs at each step (the ring waits for it)."""
    return [max(step) for step in zip(*ring_pairs(op, option, mesh))]


def kv_fraction(graph: Graph, op: Op) -> float:
    """The share of the keys' bytes a ring transfer moves: where the keys are grouped-query heads
    repeated to the query heads by views (reshape, broadcast_in_dim), a kernel passes the kv
    heads and repeats them on arrival, so the transfer is the repeat's source over its result."""
    name = op.inputs[1]
    whole = smallest = graph.tensors[name].bytes
    while name in graph.producers and graph.producers[name].kind in ("reshape", "broadcast_in_dim"):
        name = graph.producers[name].inputs[0]
        smallest = min(smallest, graph.tensors[name].bytes)
    return smallest / whole

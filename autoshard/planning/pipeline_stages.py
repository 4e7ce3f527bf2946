"""Where a pipeline cuts a training step: each op's place in layer order, and the cut points that
balance the parts.

Every op gets a position, the index of a layer in layer order. An op of a layer (forward,
backward or optimizer: `Op.layer`) takes its layer's. An op outside the layers takes its place
by data flow, so no value flows against the pipeline:
- forward: the last position it reads from (a value made on an earlier stage is sent on); one
  that reads no op's value (the embedding reads the tokens and its table) goes with its first
  reader;
- backward (gradients flow from the last stage to the first): the first position it reads from
  (the embedding's gradient follows the first layer's backward); one that reads no op's value
  goes with its last reader (the loss's label weights go with the loss's gradient);
- optimizer: the first position it reads from, a parameter or its moments where the optimizer
  reads no op's value (a stored value sits with the ops that read it in the forward and
  backward).
So the embedding and its gradient and update land with the first layer, the final norm, the head
and the loss with the last.

The cut (`balanced_cuts`) is a dynamic programme over cut points: parts of contiguous
positions, the largest part's seconds as small as can be, then the parts as even as can be. A
part's seconds are the sums of its positions' (`position_seconds`), so no range is planned on
its own.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from autoshard.errors import InputError
from autoshard.graph.model import Graph


def layer_order(graph: Graph) -> tuple[int, ...]:
    """The layers the graph's ops declare, ascending; an error naming `pipeline` when none does."""
    layers = tuple(sorted({op.layer for op in graph.ops if op.layer is not None}))
    if not layers:
        raise InputError(f"graph {graph.name!r} declares no layers (no op has a `layer`), so it has nothing to cut "
                         f"into pipeline stages", "pipeline")
    return layers


def op_positions(graph: Graph) -> dict[str, int]:
    """Op name -> its position in layer order (an index into `layer_order(graph)`)."""
    layers = layer_order(graph)
    index = {layer: i for i, layer in enumerate(layers)}
    phases = graph.phases
    position: dict[str, int] = {op.name: index[op.layer] for op in graph.ops if op.layer is not None}
    stored_at = _stored_positions(graph, phases, position)
    pending = []
    for op in graph.order:
        if op.name in position:
            continue
        phase = phases[op.name]
        sources = [position[graph.producers[t].name] for t in op.inputs
                   if t in graph.producers and graph.producers[t].name in position]
        if phase == "optimizer":
            sources += [stored_at[t] for t in op.inputs if t in stored_at]
        if sources:
            position[op.name] = max(sources) if phase == "forward" else min(sources)
        else:
            pending.append(op)
    for op in reversed(pending):  # reads no op's value: goes with its readers
        readers = [position[reader.name] for t in op.outputs for reader in graph.consumers[t]
                   if reader.name in position]
        forward = phases[op.name] != "backward"
        if readers:
            position[op.name] = min(readers) if forward else max(readers)
        else:  # read by nothing placed: the first layer (forward, optimizer) or the last (backward)
            position[op.name] = 0 if forward else len(layers) - 1
    return position


def _stored_positions(graph: Graph, phases: Mapping[str, str], position: Mapping[str, int]) -> dict[str, int]:
    """A stored value (no op makes it) -> the first position of a layer op that reads it outside
    the optimizer, for an optimizer op outside the layers that reads only stored values."""
    found: dict[str, int] = {}
    for op in graph.ops:
        if op.name in position and phases[op.name] != "optimizer":
            for t in op.inputs:
                if t not in graph.producers:
                    found[t] = min(found.get(t, position[op.name]), position[op.name])
    return found


def position_seconds(positions: Mapping[str, int], op_seconds: Mapping[str, float], count: int) -> list[float]:
    """Per position, the seconds of its ops."""
    totals = [0.0] * count
    for name, seconds in op_seconds.items():
        totals[positions[name]] += seconds
    return totals


def balanced_cuts(seconds: Sequence[float], parts: int) -> tuple[tuple[int, int], ...]:
    """`parts` contiguous, non-empty ranges `[start, end)` of the positions whose largest sum of
    `seconds` is least (the bottleneck of a pipeline's steady state) and, among those, the most
    even (least sum of squares); among equally even cuts, each part starts as early as it can, so
    later stages (which hold fewer microbatches in flight) take the extra layers. Two dynamic
    programmes over the cut points, O(parts * positions**2) each."""
    count = len(seconds)
    if not 1 <= parts <= count:
        raise InputError(f"cannot cut {count} layers into {parts} parts of at least one layer each", "pipeline")
    prefix = [0.0]
    for value in seconds:
        prefix.append(prefix[-1] + value)
    largest = _cut(prefix, parts, lambda before, part: max(before, part))[0][count]
    ceiling = largest * (1 + 1e-12)
    _, start = _cut(prefix, parts, lambda before, part: before + part * part if part <= ceiling else float("inf"))
    ranges, end = [], count
    for k in range(parts - 1, -1, -1):
        ranges.append((start[k][end], end))
        end = start[k][end]
    return tuple(reversed(ranges))


def _cut(prefix: Sequence[float], parts: int, add: Callable[[float, float], float]
         ) -> tuple[list[float], list[list[int]]]:
    """`best[j]`: the least cost of cutting positions `[0, j)` into `parts` parts, the cost of a
    cut built part by part as `add(cost before, seconds of the part)`; `start[k][j]`: where the
    last of `k + 1` parts ending at `j` starts in the best such cut."""
    count = len(prefix) - 1
    best = [add(0.0, prefix[j]) if j else float("inf") for j in range(count + 1)]
    start = [[0] * (count + 1)]
    for k in range(1, parts):
        row, starts = [float("inf")] * (count + 1), [0] * (count + 1)
        for j in range(k + 1, count + 1):
            for i in range(k, j):
                cost = add(best[i], prefix[j] - prefix[i])
                if cost < row[j]:
                    row[j], starts[j] = cost, i
        best = row
        start.append(starts)
    return best, start

"""What each op of a training step is in a pipeline schedule, and what it costs per run.

An op is one of (Qi et al., "Zero Bubble (Almost) Pipeline Parallelism", ICLR 2024):
- `F`: the forward;
- `B`: the input-gradient backward: a backward op some of whose results reach a value other than
  a parameter's gradient (the gradient sent to the stage before, through the layers below);
- `W`: the weight-gradient backward: a backward op whose results reach only parameters'
  gradients (`grad_of`) and the optimizer without passing through another layer's backward, so
  no layer before it waits for it (on the first layer, whose input gradient no layer reads, the
  whole backward is `W`);
- `tail`: the optimizer, once per step after the last microbatch.
The kinds come from data flow (`Graph.phases` and the ops' readers), never from names.
"""

from __future__ import annotations

from typing import Any, Mapping

from autoshard.graph.model import Graph
from autoshard.planning.report import Report

_OF_PHASE = {"forward": "F", "optimizer": "tail"}


def work_kinds(graph: Graph, positions: Mapping[str, int]) -> dict[str, str]:
    """Op name -> `F`, `B`, `W` or `tail`. `positions` (`pipeline_stages.op_positions`) tells the
    layers apart: a backward op is `W` when its results reach only parameters' gradients without
    passing through the backward of another layer (which its input gradient would)."""
    phases = graph.phases
    gradients = set(graph.gradients.values())
    kinds = {op.name: _OF_PHASE.get(phases[op.name], "B") for op in graph.ops}
    for op in reversed(graph.order):  # readers first
        if phases[op.name] == "backward" and all(_weight_only(graph, t, positions[op.name], gradients, kinds, positions)
                                                 for t in op.outputs):
            kinds[op.name] = "W"
    return kinds


def _weight_only(graph: Graph, tensor: str, position: int, gradients: set[str], kinds: Mapping[str, str],
                 positions: Mapping[str, int]) -> bool:
    """Whether `tensor` reaches only parameters' gradients, through `W` ops at `position` or the optimizer."""
    if tensor in gradients:
        return True
    readers = graph.consumers[tensor]
    return bool(readers) and tensor not in graph.outputs and all(
        kinds[r.name] == "tail" or (kinds[r.name] == "W" and positions[r.name] == position) for r in readers)


def seconds_per_run(report: Report, graph: Graph) -> dict[str, dict[str, float]]:
    """Op name -> `{"compute": ..., "communication": ..., "hideable": ...}` seconds of one run of the
    op: its compute, the reshardings into it (a graph output's, charged to the op making it) and
    their share that can run behind compute (`overlap`), divided by the times the op runs per
    step (`runs`: the microbatches, or once for the optimizer)."""
    out = {entry["op"]: {"compute": entry["compute_s"] / _runs(entry),
                         "communication": entry["communication_s"] / _runs(entry),
                         "hideable": report.hideable_s_per_op.get(entry["op"], 0.0) / _runs(entry)}
           for entry in report.ops}
    for entry in report.reshardings:
        if entry["consumer"] == "output" and entry["tensor"] in graph.producers:
            out[graph.producers[entry["tensor"]].name]["communication"] += entry["seconds"] / _runs(entry)
    return out


def _runs(entry: Mapping[str, Any]) -> int:
    return entry.get("runs", 1)

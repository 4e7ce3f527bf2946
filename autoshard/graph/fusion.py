"""Values a compiled training step never writes to memory: the intermediates of a chain of
pointwise ops, which one kernel computes from the chain's inputs to its outputs (XLA's loop
fusion, torch.compile's, Megatron-LM's fused bias-GeLU, bias-dropout-add and Adam kernels).

A value is fused when a pointwise op makes it, only pointwise ops of the same phase read it
(whole: each reads it at its own shape), and nothing else needs it: not an output, a gradient,
state written in place, nor a value the backward reads from the forward (that one is stored
between the passes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoshard.affine import AffineMap

if TYPE_CHECKING:
    from autoshard.graph.model import Graph, Op


def pointwise(op: "Op") -> bool:
    """One result, each of its points computed from its inputs at that point (or broadcast): no
    reduction, no window, nothing read from elsewhere in the result."""
    nest = op.nest
    return (len(op.outputs) == 1 and not nest.reduction_loops and not op.op_kind.view
            and nest.output_maps[0] == AffineMap.identity(nest.num_loops))


def fused_values(graph: "Graph") -> frozenset[str]:
    phases = graph.phases
    kept = set(graph.outputs) | set(graph.updated_by.values()) | set(graph.gradients.values())
    chained = {op.name for op in graph.ops if pointwise(op)}
    fused = set()
    for op in graph.ops:
        if op.name not in chained:
            continue
        value = op.outputs[0]
        readers = graph.consumers[value]
        if (value not in kept and readers
                and all(r.name in chained and graph.tensors[r.outputs[0]].shape == graph.tensors[value].shape
                        and phases[r.name] == phases[op.name] for r in readers)):
            fused.add(value)
    return frozenset(fused)

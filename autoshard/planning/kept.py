"""What a training step keeps from forward to backward: the activation bytes a layer's backward
reads that were held since its forward, per device under a plan."""

from __future__ import annotations

from autoshard.errors import InputError
from autoshard.graph.model import live_ranges
from autoshard.planning.costs import tensor_bytes
from autoshard.planning.plan import Plan


def kept_activation_bytes(plan: Plan, layer: int) -> int:
    """Bytes per device of the values layer `layer`'s backward reads that were there before the
    backward began (activations, masks and other step inputs; not parameters, gradients or
    scalars), each counted at its sharding as produced or stored. Every one is held across the
    turn from forward to backward, as the live ranges say."""
    graph = plan.graph
    order = list(graph.order)
    ranges = live_ranges(graph, order)
    phases = graph.phases
    first_backward = next((i for i, op in enumerate(order) if phases[op.name] == "backward"), None)
    if first_backward is None:
        raise InputError(f"graph {graph.name!r} has no backward: only a training step keeps activations for one",
                         "graph")
    kept: set[str] = set()
    for op in order:
        if phases[op.name] != "backward" or op.layer != layer:
            continue
        for name in op.inputs:
            tensor, producer = graph.tensors[name], graph.producers.get(name)
            if tensor.role == "parameter" or not tensor.shape or (producer and phases[producer.name] != "forward"):
                continue
            assert ranges[name][0] < first_backward <= ranges[name][1], name
            kept.add(name)
    return sum(tensor_bytes(graph.tensors[t].shape, graph.tensors[t].itemsize, plan.produced(t), plan.mesh)
               for t in kept)

"""Which instructions of a microbatched step's program run once per step rather than once per
microbatch: an op of the optimizer's phase (`Graph.phases`), a collective whose output only such
instructions read (a gradient's reduction across data replicas is made once, on the accumulated
gradient), or that delivers a per-step value. The simulator runs the rest per microbatch, and
so does a pipeline's stage.
"""

from __future__ import annotations

from autoshard.spmd.program import Communicate, LocalOp, SpmdProgram


def per_step_instructions(program: SpmdProgram) -> set[int]:
    """Positions in `program.body` of the instructions run once per step, however many microbatches."""
    readers: dict[int, list[int]] = {}
    for position, item in enumerate(program.body):
        for value in item.inputs:
            readers.setdefault(value.id, []).append(position)
    made_by = {value.id: position for position, item in enumerate(program.body) for value in item.outputs}
    phases = program.graph.phases
    once = {position for position, item in enumerate(program.body)
            if isinstance(item, LocalOp) and phases[item.op.name] == "optimizer"}
    collectives = [position for position, item in enumerate(program.body) if isinstance(item, Communicate)]
    changed = True
    while changed:  # a collective chain between two per-step ops, or from one to a result
        changed = False
        for position in collectives:
            item = program.body[position]
            users = readers.get(item.output.id, [])
            if position not in once and (made_by.get(item.input.id) in once or (users and all(u in once for u in users))):
                once.add(position)
                changed = True
    return once


def varying_values(program: SpmdProgram) -> set[int]:
    """Ids of the values that differ from one microbatch to the next: those computed from an
    argument with a batch dim. Only these are summed over the microbatches; any other value the
    per-step part reads (a stored parameter gathered for the forward and for its update) is
    the same in every microbatch, so summing it would count it once per microbatch."""
    graph = program.graph
    varying = {v.id for v in program.arguments if graph.tensors[v.tensor].batch_dim is not None}
    for item in program.body:
        if any(v.id in varying for v in item.inputs):
            varying.update(v.id for v in item.outputs)
    return varying

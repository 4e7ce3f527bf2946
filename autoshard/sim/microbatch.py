"""Run a microbatched step as it runs: the forward and backward part of the program once per
microbatch on its slice of the batch, the gradients accumulated across microbatches, and the
optimizer part once on the accumulated gradients.

The program is the partitioned step on one microbatch. An instruction belongs to the per-step
part when it is an op that runs once per step, or a collective whose output only such
instructions read (a gradient's reduction across data replicas is made once, on the
accumulated gradient), or that delivers a per-step value; the rest runs per microbatch. Each
microbatch's values are checked against the reference evaluator on that microbatch; the
accumulated gradients and everything after them against the reference on the whole batch.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from autoshard.errors import InputError
from autoshard.graph.evaluate import evaluate_graph, random_inputs
from autoshard.graph.model import Graph
from autoshard.graph.summary import size
from autoshard.planning.microbatches import Microbatching
from autoshard.sim.collectives import Shards
from autoshard.sim.local_op import Placed
from autoshard.sim.precision import widen_graph, widen_inputs
from autoshard.sim.program import (DEFAULT_MAX_BYTES, Diverged, Execution, instruction_name, results_problem,
                                   simulation_bytes)
from autoshard.sim.verdict import Divergence, Verdict
from autoshard.spmd.per_step import per_step_instructions, varying_values
from autoshard.spmd.program import SpmdProgram


def simulate_microbatched(program: SpmdProgram, microbatching: Microbatching,
                          inputs: Mapping[str, np.ndarray] | None = None, *, seed: int = 0,
                          max_bytes: float = DEFAULT_MAX_BYTES, widen: bool = True) -> Verdict:
    """Run `program` (of `microbatching.graph`) for the step on the whole batch; `inputs` are
    the whole step's (default: its random inputs of `seed`)."""
    count, graph = microbatching.count, microbatching.whole
    needed = simulation_bytes(program, widen) * 2  # a microbatch's values and the whole batch's reference
    if needed > max_bytes:
        raise InputError(f"simulating {count} microbatches of graph {graph.name!r} on {program.mesh.num_devices} devices "
                         f"needs about {size(needed)}, over the limit of {size(max_bytes)}", "max_bytes")
    inputs = dict(inputs if inputs is not None else random_inputs(graph, seed))
    if widen:
        inputs = widen_inputs(inputs)
    once = per_step_instructions(program)
    per_microbatch = [item for position, item in enumerate(program.body) if position not in once]
    per_step = [item for position, item in enumerate(program.body) if position in once]
    made_per_step = {v.id for item in per_step for v in item.outputs}
    late = [item for item in per_microbatch if any(v.id in made_per_step for v in item.inputs)]
    if late:
        return Verdict(False, 0.0, Divergence(instruction_name(late[0]), late[0].outputs[0].tensor, None, None, None,
                                              None, "runs once per microbatch but reads a value made once per step"), 0)
    stored = {a.id for a in program.arguments}
    varying = varying_values(program)
    accumulated = {v.id: v for item in per_step for v in item.inputs
                   if v.id not in made_per_step and v.id not in stored and v.id in varying}
    micro_graph = widen_graph(microbatching.graph) if widen else microbatching.graph
    execution = Execution(program, widen)
    sums: dict[int, Shards] = {}
    env: dict[int, Placed] = {}
    try:
        for index in range(count):
            sliced = {name: batch_slice(graph, name, array, index, count) for name, array in inputs.items()}
            env = execution.arguments(sliced)
            execution.run(per_microbatch, env, evaluate_graph(micro_graph, sliced))
            for value_id in accumulated:
                shards = env[value_id].shards
                sums[value_id] = {d: sums[value_id][d] + a for d, a in shards.items()} if value_id in sums else dict(shards)
        # the per-step part reads the stored values as the last microbatch left them (only the
        # per-step part overwrites them) and the gradients summed over the microbatches
        reference = evaluate_graph(widen_graph(graph) if widen else graph, inputs)
        for value_id, value in accumulated.items():
            execution.record(f"accumulated over {count} microbatches", value, sums[value_id], env, reference)
        execution.run(per_step, env, reference)
    except Diverged as failure:
        return execution.verdict(failure.divergence)
    return execution.verdict(results_problem(program, env))


def batch_slice(graph: Graph, name: str, array: np.ndarray, index: int, count: int) -> np.ndarray:
    """Microbatch `index` of `count` of input `name`: its slice of the batch dim (whole if it has none)."""
    dim = graph.tensors[name].batch_dim
    if dim is None:
        return array
    size_of = array.shape[dim] // count
    return np.take(array, range(index * size_of, (index + 1) * size_of), axis=dim)

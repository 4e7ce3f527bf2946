"""Execute a partitioned SPMD program on every device in numpy and hold it against the reference.

The program is run as the IR emitter prints it: arguments laid out per their shardings,
`Communicate` steps through the mesh collectives, `LocalOp`s on each device's block. After every
body item its output is compared, device by device, with the reference evaluator's value of that
tensor on the unsharded graph (same inputs), so a failure names the first op (in program order)
and the first device where the values part. A program that cannot run at all (a device lacks a
range an op reads, a shard of the wrong shape) fails at that op and device too.

Floats are computed in float64 by default, on the devices and in the reference (see
`autoshard.sim.precision`); `widen=False` keeps the declared dtypes and their tolerances.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import numpy as np

from autoshard.dtypes import DTYPES
from autoshard.errors import InputError
from autoshard.graph.evaluate import evaluate_graph, random_inputs
from autoshard.graph.model import Graph
from autoshard.graph.summary import size
from autoshard.mesh import Mesh
from autoshard.planning.plan import Plan
from autoshard.resharding import Price
from autoshard.sim.collectives import Shards, UndefinedValueError
from autoshard.sim.compare import compare_shards, relative_tolerance
from autoshard.sim.layout import distribute
from autoshard.sim.local_op import Placed, ProgramError, run_local_op
from autoshard.sim.precision import widen_dtype, widen_graph, widen_inputs, widen_op
from autoshard.sim.reshard_exec import apply_step
from autoshard.sim.verdict import Divergence, Verdict
from autoshard.spmd.program import (Communicate, Instruction, LocalOp, SpmdProgram, Value, instruction_name,
                                    partition)

DEFAULT_MAX_BYTES = 2 * 2 ** 30  # numpy on one host: every device's shards live at once


class Diverged(Exception):
    def __init__(self, divergence: Divergence):
        self.divergence = divergence


def _itemsize(dtype: str, widen: bool) -> int:
    return np.dtype(DTYPES[widen_dtype(dtype) if widen else dtype].numpy).itemsize


def simulation_bytes(program: SpmdProgram, widen: bool = True) -> int:
    """Memory a simulation holds at most: every value on every device, plus the reference's tensors."""
    return values_bytes(program.mesh, program.values(), widen) + reference_bytes(program, widen)


def values_bytes(mesh: Mesh, values: Iterable[Value], widen: bool = True) -> int:
    """Bytes of `values` over all devices' shards."""
    return sum(held_elements(mesh, v) * _itemsize(v.dtype, widen) for v in values)


def reference_bytes(program: SpmdProgram, widen: bool = True) -> int:
    """Bytes of every tensor of the unsharded graph, as the reference evaluator holds them."""
    return sum(math.prod(t.shape) * _itemsize(t.dtype, widen) for t in program.graph.tensors.values())


def held_elements(mesh: Mesh, value: Value) -> int:
    """Elements of `value` over all devices' shards together. The shards of each dim partition it
    (evenly or at offsets), so every element is held once per device outside its split axes; a
    haloed dim's shards are each its ceildiv block plus both halos. Counted without walking the
    devices, which a mesh of a million of them would make slow."""
    sharding = value.sharding
    counts = [sharding.shard_count(mesh, dim) for dim in range(len(value.shape))]
    spans = [count * (-(-size // count) + sum(sharding.halo(dim))) if any(sharding.halo(dim)) else size
             for dim, (size, count) in enumerate(zip(value.shape, counts))]
    return math.prod(spans) * mesh.num_devices // math.prod(counts)


def simulate_program(program: SpmdProgram, inputs: Mapping[str, np.ndarray] | None = None, *,
                     seed: int = 0, max_bytes: float = DEFAULT_MAX_BYTES, widen: bool = True) -> Verdict:
    """Run `program` on every device and compare every value it computes with the reference
    evaluator on the unsharded graph. `inputs` maps graph inputs and parameters to global
    arrays (default: `random_inputs(program.graph, seed)`).

    Every instruction's outputs are checked as they are made, so the program's results (which
    are such outputs) are checked too: each device's shard of each result, partial groups
    reduced, equals its slice of the reference's value within the dtype's tolerance.
    Raises InputError if the simulation would hold more than `max_bytes`.
    """
    needed = simulation_bytes(program, widen)
    if needed > max_bytes:
        raise InputError(f"simulating graph {program.graph.name!r} on {program.mesh.num_devices} devices needs about "
                         f"{size(needed)}, over the limit of {size(max_bytes)}; simulate a smaller version of the "
                         f"graph or raise the limit", "max_bytes")
    inputs = inputs if inputs is not None else random_inputs(program.graph, seed)
    if widen:
        inputs = widen_inputs(inputs)
    reference = evaluate_graph(widen_graph(program.graph) if widen else program.graph, inputs)
    execution = Execution(program, widen)
    env = execution.arguments(inputs)
    try:
        execution.run(program.body, env, reference)
    except Diverged as failure:
        return execution.verdict(failure.divergence)
    return execution.verdict(results_problem(program, env))


class Execution:
    """A program's run in progress: how its values are judged, which stored values were
    overwritten in place, and the largest error and number of values checked so far."""

    def __init__(self, program: SpmdProgram, widen: bool):
        self.program, self.widen = program, widen
        self.judged_as = comparison_dtypes(program.graph, widen)
        self.stored = {v.tensor: v for v in program.arguments}
        self.overwritten: dict[int, str] = {}  # argument value -> the value that overwrote its storage in place
        self.worst, self.checked = 0.0, 0

    def arguments(self, inputs: Mapping[str, np.ndarray], values: Sequence[Value] | None = None) -> dict[int, Placed]:
        """The program's arguments (or those of them in `values`) laid out from global `inputs`."""
        return {v.id: Placed(distribute(inputs[v.tensor], self.program.mesh, v.sharding, v.shape), v.sharding, v.shape)
                for v in (self.program.arguments if values is None else values)}

    def run(self, items: Sequence[Instruction], env: dict[int, Placed], reference: Mapping[str, np.ndarray]) -> None:
        """Run `items` in order, checking each value made against `reference`; raises `Diverged`."""
        for item in items:
            name = instruction_name(item)
            try:
                produced = _run(item, env, self.program.mesh, self.widen, self.overwritten)
            except ProgramError as error:
                raise Diverged(Divergence(name, item.outputs[0].tensor, error.device, None, None, None, str(error))) from None
            for value, shards in produced:
                self.record(name, value, shards, env, reference)
                old = self.program.graph.tensors[value.tensor].updates
                if old is not None and isinstance(item, LocalOp):  # the old value's storage now holds the new one
                    self.overwritten[self.stored[old].id] = value.tensor
                    del env[self.stored[old].id]

    def record(self, name: str, value: Value, shards: Shards, env: dict[int, Placed],
               reference: Mapping[str, np.ndarray]) -> None:
        """`value` now holds `shards`, checked against `reference`; raises `Diverged`."""
        env[value.id] = Placed(shards, value.sharding, value.shape)
        self.worst = max(self.worst, _check(name, value, shards, self.program.mesh, reference,
                                            self.judged_as[value.dtype]))
        self.checked += 1

    def verdict(self, divergence: Divergence | None) -> Verdict:
        return Verdict(divergence is None, self.worst, divergence, self.checked)


def results_problem(program: SpmdProgram, env: Mapping[int, Placed]) -> Divergence | None:
    """Why the program's results are not what it returns, or None: one never computed, or a value
    written in place returned in another sharding than its old value's storage."""
    stored = {v.tensor: v for v in program.arguments}
    missing = [v for v in program.results if v.id not in env]
    if missing:
        message = f"result {missing[0].tensor!r} (value %{missing[0].id}) is never computed"
        return Divergence("result", missing[0].tensor, None, None, None, None, message)
    for value in program.results:
        old = program.graph.tensors[value.tensor].updates
        if old is not None and value.sharding != stored[old].sharding:
            message = (f"result {value.tensor!r} overwrites {old!r} in place, but is returned as {value.sharding} "
                       f"while {old!r} is stored as {stored[old].sharding}")
            return Divergence("result", value.tensor, None, None, None, None, message)
    return None


def _run(item: Instruction, env: dict[int, Placed], mesh: Mesh, widen: bool,
         overwritten: Mapping[int, str]) -> list[tuple[Value, Shards]]:
    stale = [v for v in item.inputs if v.id in overwritten]
    if stale:
        raise ProgramError(f"{instruction_name(item)} reads value %{stale[0].id} ({stale[0].tensor!r}) after "
                           f"{overwritten[stale[0].id]!r} overwrote it in place")
    undefined = [v for v in item.inputs if v.id not in env]
    if undefined:
        raise ProgramError(f"{instruction_name(item)} reads value %{undefined[0].id} ({undefined[0].tensor!r}) "
                           f"before it is defined")
    if isinstance(item, Communicate):
        try:
            shards = apply_step(env[item.input.id].shards, mesh, item.input.shape, item.step)
        except (UndefinedValueError, ValueError) as error:  # the collective does not fit its operand
            raise ProgramError(f"{instruction_name(item)}: {error}") from None
        return [(item.output, shards)]
    outputs = [(v.sharding, v.shape, widen_dtype(v.dtype) if widen else v.dtype) for v in item.outputs]
    op = widen_op(item.op) if widen else item.op
    results = run_local_op(mesh, op, item.option, [env[v.id] for v in item.inputs], outputs)
    return list(zip(item.outputs, results))


def comparison_dtypes(graph: Graph, widen: bool) -> dict[str, str]:
    """For each declared dtype of the graph, the dtype whose tolerance its values are judged by.

    Widened, every float is float64. In the declared dtypes a float value may carry the rounding
    of a narrower float it was computed from, so every float gets the loosest float tolerance
    of the graph; integers and booleans are exact either way.
    """
    declared = {t.dtype for t in graph.tensors.values()}
    if widen:
        return {d: widen_dtype(d) for d in declared}
    floats = [d for d in declared if DTYPES[d].is_float]
    loosest = max(floats, key=lambda d: relative_tolerance(d), default=None)
    return {d: loosest if DTYPES[d].is_float else d for d in declared}


def _check(name: str, value: Value, shards: Shards, mesh: Mesh, reference: Mapping[str, np.ndarray],
           dtype: str) -> float:
    what = f"{name}: value %{value.id} ({value.tensor!r}, sharding {value.sharding})"
    try:
        comparison = compare_shards(shards, mesh, value.sharding, reference[value.tensor], dtype, what)
    except ProgramError as error:
        raise Diverged(Divergence(name, value.tensor, error.device, None, None, None, str(error))) from None
    m = comparison.mismatch
    if m is not None:
        message = (f"{value.tensor!r}{list(m.index)} = {m.actual:.6g}, expected {m.expected:.6g} (error "
                   f"{abs(m.actual - m.expected):.3g} > tolerance {comparison.tolerance:.3g}; value %{value.id}, "
                   f"sharding {value.sharding})")
        raise Diverged(Divergence(name, value.tensor, m.device, m.index, m.actual, m.expected, message))
    return comparison.max_error


def verify_plan(plan: Plan, price: Price | None = None, seed: int = 0,
                max_bytes: float = DEFAULT_MAX_BYTES, widen: bool = True) -> Verdict:
    """Partition `plan` (reshardings chosen by `price`, default bytes moved) and simulate the
    program on the graph's random inputs of `seed` (see `simulate_program`)."""
    return simulate_program(partition(plan, price), seed=seed, max_bytes=max_bytes, widen=widen)

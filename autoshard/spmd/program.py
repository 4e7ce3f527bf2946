"""The partitioned (SPMD) program: what every device of the mesh runs, as data.

`partition(plan)` turns a plan into an `SpmdProgram`:

- `arguments`: one `Value` per graph input and parameter (in the graph's tensor order), at its
  storage sharding;
- `body`: `LocalOp`s in topological order of the graph, with `Communicate`s in front of them:
  every operand whose sharding differs from `plan.required(op, i)` is resharded by the
  resharding planner's steps, one `Communicate` per `CollectiveStep`. A value read by several
  uses is resharded once, at its first use, to its delivered sharding
  (`autoshard.planning.report.delivered_shardings`), and every use reads it from there, a use
  that reads another sharding through a resharding of its own: the rule the report prices
  and the formulation minimises;
- `results`: the graph outputs brought to `plan.final` from the values as produced.

Values are in single-assignment form: `Value.id` is unique in the program, and an instruction
only reads values defined before it (arguments, or outputs of earlier instructions).

How a device executes the body (the contract the simulator and the IR printer follow):

- `Communicate(step, input, output)`: the mesh collective `step.kind` over `step.mesh_axes`
  with the attributes in `step.dims`, exactly as `autoshard.sim.reshard_exec.apply_step` runs
  it. Every device's `input` is its shard of `input.sharding`; afterwards its `output` is its
  shard of `output.sharding` (`step.before`/`step.after` equal those shardings).
- `LocalOp(op, option, inputs, outputs)`: device `d` computes its *block* of the op's loops:
  for every loop `l` split over mesh axes `A = option.loop_axes[l]`, with
  `step = ceildiv(extent_l, mesh.group_size(A))` and `k = mesh.in_group_linear(d, A)`, the loop
  range `[min(k*step, extent_l), min((k+1)*step, extent_l))`; unsplit loops are whole. Input `i`
  is cut to `op.nest.operand_range(op.nest.input_maps[i], block, inputs[i].shape)` (global
  indices), taken relative to the device's own shard (`inputs[i].sharding.device_slices`), which
  always contains it. `autoshard.ops.evaluate_block(op.op_kind, op.nest, op.attrs, cut, block)`
  gives the device's local results, which are its shards of `outputs[k].sharding`. A device
  whose block is empty along a reduction loop contributes the reduction's identity. An attention
  op whose key loop is split (`ops.nn`'s combined loop) computes its key block's online-softmax
  state instead and combines it over the key loop's axes: all_reduce max of the row maxima, the
  rescaling, all_reduce sum of the exponent sums and weighted values, their quotient (as
  `autoshard.sim.attention` runs it); its outputs are then complete, not partial.
- Partial values: a split reduction loop makes the outputs partial over its axes (kind
  `op.nest.reduction_kind`). Collective optimisations may also run an op that is linear in
  its partial inputs (`add`/`sub` on `sum`-partial values, `max`/`min` on values partial
  with that kind) on the unreduced pieces: then the outputs carry the inputs' partial axes.
  In both cases the `outputs[k].sharding` says so; the local computation is the same.

Local shapes differ between devices when a split is uneven (the last shards are short);
`Value.buffer_shape` is the largest shard, the static shape the partitioned IR uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Union

from autoshard.errors import InputError, Problem, ShardingError
from autoshard.graph.model import Graph, Op, Tensor, topological_order
from autoshard.mesh import Device, Mesh
from autoshard.planning.options import ShardingOption, result_shardings
from autoshard.planning.plan import Plan, validate_plan
from autoshard.planning.report import delivered_shardings
from autoshard.resharding import CollectiveStep, Price, Resharding, bytes_moved_price, plan_resharding
from autoshard.sharding import Sharding


def canonical(mesh: Mesh, sharding: Sharding) -> Sharding:
    """One spelling per layout: partial axes in mesh order, kind `sum` when nothing is partial
    (the form the resharding planner's steps use, so shardings compare by value)."""
    if not sharding.partial_axes:
        return sharding.without_partial()
    partial = tuple(sorted(sharding.partial_axes, key=mesh.axis_index))
    return Sharding(sharding.split_axes, partial, sharding.partial_kind, sharding.dims_offsets, sharding.halo_sizes)


@dataclass(frozen=True, slots=True)
class Value:
    """One SSA value of the program: a version of graph tensor `tensor` laid out per `sharding`."""

    id: int
    tensor: str
    sharding: Sharding
    shape: tuple[int, ...]  # global
    dtype: str

    def local_shape(self, mesh: Mesh, device: Device) -> tuple[int, ...]:
        return self.sharding.local_shape(mesh, self.shape, device)

    def buffer_shape(self, mesh: Mesh) -> tuple[int, ...]:
        """The largest local shape: the buffer every device allocates."""
        return self.sharding.max_local_shape(mesh, self.shape)


@dataclass(frozen=True)
class LocalOp:
    """Graph op `op` run on every device's block of its loops under `option`."""

    op: Op
    option: ShardingOption
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]


@dataclass(frozen=True)
class Communicate:
    """One collective: `input` (laid out per `step.before`) becomes `output` (per `step.after`)."""

    step: CollectiveStep
    input: Value
    output: Value

    @property
    def inputs(self) -> tuple[Value, ...]:
        return (self.input,)

    @property
    def outputs(self) -> tuple[Value, ...]:
        return (self.output,)


Instruction = Union[LocalOp, Communicate]


@dataclass(frozen=True)
class SpmdProgram:
    mesh: Mesh
    graph: Graph
    arguments: tuple[Value, ...]
    body: tuple[Instruction, ...]
    results: tuple[Value, ...]
    price: Price = field(compare=False, repr=False)  # what the steps' seconds were priced with

    def communicates(self) -> list[Communicate]:
        return [i for i in self.body if isinstance(i, Communicate)]

    def local_ops(self) -> list[LocalOp]:
        return [i for i in self.body if isinstance(i, LocalOp)]

    def communication_seconds(self) -> float:
        return sum(c.step.seconds for c in self.communicates())

    def values(self) -> Iterator[Value]:
        yield from self.arguments
        for instruction in self.body:
            yield from instruction.outputs

    def next_id(self) -> int:
        return max((v.id for v in self.values()), default=-1) + 1


def check_step_values(instruction: Communicate, where: str) -> None:
    """Raise ValueError unless the collective's step goes between its values' shardings."""
    step = instruction.step
    if step.before != instruction.input.sharding or step.after != instruction.output.sharding:
        raise ValueError(f"{where} ({step.kind} of {instruction.input.tensor!r}) goes {step.before} -> {step.after} "
                         f"but its values are {instruction.input.sharding} -> {instruction.output.sharding}")


def check_program(program: SpmdProgram) -> None:
    """Raise ValueError unless ids are unique, every read follows its definition and every
    collective's shardings match its values: the invariants rewrites must keep."""
    defined: set[int] = set()
    for value in program.arguments:
        if value.id in defined:
            raise ValueError(f"value id {value.id} is defined twice")
        defined.add(value.id)
    for index, instruction in enumerate(program.body):
        for value in instruction.inputs:
            if value.id not in defined:
                raise ValueError(f"instruction {index} reads value {value.id} ({value.tensor!r}) before it is defined")
        if isinstance(instruction, Communicate):
            check_step_values(instruction, f"instruction {index}")
        for value in instruction.outputs:
            if value.id in defined:
                raise ValueError(f"value id {value.id} is defined twice")
            defined.add(value.id)
    for value in program.results:
        if value.id not in defined:
            raise ValueError(f"result {value.tensor!r} (value {value.id}) is never defined")


class _Builder:
    """Program under construction: the body so far, each value as produced and as delivered."""

    def __init__(self, plan: Plan, price: Price):
        self.plan, self.price, self.mesh = plan, price, plan.mesh
        self.body: list[Instruction] = []
        self.delivery = delivered_shardings(plan, price)  # tensor -> the sharding its uses read it from
        self.produced: dict[str, Value] = {}
        self.delivered: dict[str, Value] = {}
        self.count = 0

    def new_value(self, tensor: str, sharding: Sharding) -> Value:
        t = self.plan.graph.tensors[tensor]
        value = Value(self.count, tensor, canonical(self.mesh, sharding), t.shape, t.dtype)
        self.count += 1
        return value

    def produce(self, tensor: str, sharding: Sharding) -> Value:
        value = self.produced[tensor] = self.new_value(tensor, sharding)
        return value

    def read(self, tensor: str, target: Sharding) -> Value:
        """`tensor` as a use reads it in `target`: from the value as delivered (resharded once,
        at the first use), resharded again if `target` differs."""
        delivered = self.delivered.get(tensor)
        if delivered is None:
            produced = self.produced[tensor]
            delivered = self.delivered[tensor] = self.reshard(produced, self.delivery.get(tensor, produced.sharding))
        return self.reshard(delivered, target)

    def reshard(self, value: Value, target: Sharding) -> Value:
        """`value` in `target`, through the resharding planner's steps."""
        target = canonical(self.mesh, target)
        if target == value.sharding:
            return value
        t = self.plan.graph.tensors[value.tensor]
        for step in plan_resharding(self.mesh, t.shape, t.itemsize, value.sharding, target, self.price).steps:
            out = self.new_value(value.tensor, step.after)
            self.body.append(Communicate(step, value, out))
            value = out
        return value


def check_plan(plan: Plan) -> None:
    """`validate_plan`, and every graph output's delivered sharding fits the mesh and tensor."""
    validate_plan(plan)
    problems: list[Problem] = []
    for name in plan.graph.outputs:
        try:
            plan.final(name).check(plan.mesh, plan.graph.tensors[name].shape, f"/tensors/{name}")
        except ShardingError as error:
            problems.extend(error.problems)
    if problems:
        raise InputError(problems)


def partition(plan: Plan, price: Price | None = None) -> SpmdProgram:
    """The SPMD program of `plan`; collectives chosen and priced by `price`
    (default: `bytes_moved_price(plan.mesh)`). Raises InputError for a plan that does not fit
    its graph or mesh, naming the op or tensor."""
    check_plan(plan)
    price = price if price is not None else bytes_moved_price(plan.mesh)
    graph = plan.graph
    builder = _Builder(plan, price)
    arguments = tuple(builder.produce(t.name, plan.storage[t.name])
                      for t in graph.tensors.values() if t.role != "intermediate")
    for op in topological_order(graph):
        option = plan.options[op.name]
        inputs = tuple(builder.read(t, plan.required(op, i)) for i, t in enumerate(op.inputs))
        outputs = tuple(builder.produce(t, s) for t, s in zip(op.outputs, result_shardings(op.nest, option)))
        builder.body.append(LocalOp(op, option, inputs, outputs))
    results = tuple(builder.reshard(builder.produced[t], plan.final(t)) for t in graph.outputs)
    return SpmdProgram(plan.mesh, graph, arguments, tuple(builder.body), results, price)


def resharding_program(mesh: Mesh, resharding: Resharding, dtype: str, price: Price,
                       tensor: str = "x", name: str = "reshard") -> SpmdProgram:
    """The program of one resharding: a graph `name` whose only tensor `tensor` is an input
    (the argument, at the source sharding) and the output (at the target), one `Communicate`
    per step in between."""
    graph = Graph(name, {tensor: Tensor(tensor, resharding.shape, dtype, "input")}, (), (tensor,))
    argument = value = Value(0, tensor, canonical(mesh, resharding.source), resharding.shape, dtype)
    body: list[Instruction] = []
    for step in resharding.steps:
        out = Value(value.id + 1, tensor, step.after, resharding.shape, dtype)
        body.append(Communicate(step, value, out))
        value = out
    return SpmdProgram(mesh, graph, (argument,), tuple(body), (value,), price)


def instruction_name(item: Instruction) -> str:
    """How a body item is named in a verdict or an error: the graph op, or the collective and its tensor."""
    if isinstance(item, LocalOp):
        return item.op.name
    return f"{item.step.kind} over {list(item.step.mesh_axes)} of {item.input.tensor!r}"


def describe(program: SpmdProgram) -> list[str]:
    """One line per instruction: a readable listing of the program (for reports and tests)."""
    lines = []
    for instruction in program.body:
        if isinstance(instruction, Communicate):
            step = instruction.step
            attrs = ", ".join(f"{k}={step.dims[k]}" for k in step.dims if k != "transfers")
            lines.append(f"%{instruction.output.id} = {step.kind}[{', '.join(step.mesh_axes)}]({attrs}) "
                         f"%{instruction.input.id} {instruction.input.tensor}: {step.before} -> {step.after}")
        else:
            ins = ", ".join(f"%{v.id}" for v in instruction.inputs)
            outs = ", ".join(f"%{v.id}" for v in instruction.outputs)
            lines.append(f"{outs} = {instruction.op.kind} {instruction.op.name}({ins}) option {instruction.option} "
                         f"-> {', '.join(str(v.sharding) for v in instruction.outputs)}")
    return lines

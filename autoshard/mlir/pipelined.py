"""The partitioned IR of a pipelined step: one function per virtual stage, the values stages
hand each other as the seed's `send` / `recv`, and one function per stage for its once-per-step
part.

Two meshes: `@mesh` is one stage's sub-mesh, on which every function's local ops and
collectives run exactly as in the unpipelined partitioned IR (each device runs its stage's
functions at its place in the stage); `@pipeline` is the machine, the stage axis outermost
then the stage's axes, over which a device sends a value to the device at its place in another
stage (`mesh_axes = [0]`, `destination` / `source` the other stage's index).

A virtual stage's function is one microbatch through it: the values it receives, its `F`
instructions, its `B`, its `W`, each slot's values sent on as soon as it has made them. It
takes the stored values and the batch's slice it reads (and what a virtual stage on the same
stage hands it in place, with no transfer) and returns the gradients the tail sums over the
microbatches, what it hands in place, and the step's results it makes. A stage's step function
takes its stored values and those sums and returns the new state.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoshard.mlir.device import DeviceIndex
from autoshard.mlir.dialect import Dialect
from autoshard.mlir.dialect import dialect as dialect_named
from autoshard.mlir.linalg import Operand, empty
from autoshard.mlir.module import MESH_SYMBOL, function_lines, function_name, mesh_comment
from autoshard.mlir.partitioned import bind_arguments, check_arguments, emit_instructions, value_spec
from autoshard.mlir.text import Body
from autoshard.pipeline.schedules import KINDS
from autoshard.planning.pipeline_plan import STAGE_AXIS, pipeline_mesh
from autoshard.spmd.program import Value
from autoshard.spmd.staged import StagedProgram

PIPELINE_SYMBOL = "@pipeline"


@dataclass(frozen=True)
class _Function:
    name: str
    lines: list[str]


def emit_pipelined(staged: StagedProgram, dialect: str = "mesh", arguments: str = "local") -> str:
    """The module of `staged` in the `mesh` or `shard` spelling, arguments `local` or `global`
    (as `emit_partitioned`)."""
    check_arguments(arguments)
    d = dialect_named(dialect)
    program, orders = staged.program, staged.orders
    machine = pipeline_mesh(program.mesh, orders.stages)
    base = function_name(program.graph.name)
    functions = []
    for virtual in range(orders.virtual_stages):
        stage, chunk = orders.placement(virtual)
        name = f"{base}_stage{stage}" + (f"_chunk{chunk}" if orders.chunks > 1 else "")
        functions.append(_part_function(staged, d, virtual, name, arguments))
    functions += [_tail_function(staged, d, stage, f"{base}_stage{stage}_step", arguments)
                  for stage in range(orders.stages)]
    comments = [f"autoshard partitioned IR: graph {program.graph.name!r} pipelined over {orders.stages} stages "
                f"({orders.schedule}, {orders.microbatches} microbatches, {orders.chunks} virtual stage(s) per stage), "
                f"{d.name} dialect", f"{MESH_SYMBOL}: one stage's sub-mesh; " + mesh_comment(program.mesh),
                f"{PIPELINE_SYMBOL}: the machine, stage axis {STAGE_AXIS!r} outermost; " + mesh_comment(machine),
                "per virtual stage, one microbatch's F, B and W: " + ", ".join(f.name for f in functions[:-orders.stages]),
                "per stage, once per step on the gradients summed over the microbatches: "
                + ", ".join(f.name for f in functions[-orders.stages:])]
    lines = [f"// {c}" for c in comments]
    lines.append(f"{d.mesh_op} {MESH_SYMBOL}(shape = {program.mesh.to_mlir_shape()})")
    lines.append(f"{d.mesh_op} {PIPELINE_SYMBOL}(shape = {machine.to_mlir_shape()})")
    for function in functions:
        lines += function.lines
    return "\n".join(lines) + "\n"


def _part_function(staged: StagedProgram, d: Dialect, virtual: int, name: str, arguments: str) -> _Function:
    program, body = staged.program, staged.program.body
    b = Body()
    device = DeviceIndex(b, d, program.mesh)
    positions = [p for kind in KINDS for p in staged.work(virtual, kind)]
    in_place = [h for h in staged.handovers if h.target[0] == virtual and not staged.crosses(h)]
    values: dict[int, Operand] = {}
    args = bind_arguments(b, device, _arguments_read(staged, positions), arguments, values)
    args += bind_arguments(b, device, [h.value for h in in_place], "local", values)
    for kind in KINDS:
        slot = (virtual, kind)
        for h in staged.handovers:
            if h.target == slot and staged.crosses(h):
                values[h.value.id] = _recv(b, d, device, h.value, staged.stage_of(h.source))
        emit_instructions(b, device, [body[p] for p in staged.work(*slot)], values)
        for h in staged.handovers:
            if h.source == slot and staged.crosses(h):
                _send(b, d, values[h.value.id], staged.stage_of(h.target))
    made = {v.id for p in positions for v in body[p].outputs}
    returned = [v for v, source in staged.accumulated if source[0] == virtual]
    returned += [h.value for h in staged.handovers if h.source[0] == virtual and not staged.crosses(h)]
    returned += [v for v in program.results if v.id in made]
    return _Function(name, function_lines(name, args, [values[v.id] for v in _unique(returned)], b))


def _tail_function(staged: StagedProgram, d: Dialect, stage: int, name: str, arguments: str) -> _Function:
    program, body = staged.program, staged.program.body
    b = Body()
    device = DeviceIndex(b, d, program.mesh)
    positions = staged.tail(stage)
    values: dict[int, Operand] = {}
    args = bind_arguments(b, device, _arguments_read(staged, positions), arguments, values)
    read = {v.id for p in positions for v in body[p].inputs}
    args += bind_arguments(b, device, [v for v, _ in staged.accumulated if v.id in read], "local", values)
    emit_instructions(b, device, [body[p] for p in positions], values)
    made = {v.id for p in positions for v in body[p].outputs}
    return _Function(name, function_lines(name, args, [values[v.id] for v in program.results if v.id in made], b))


def _arguments_read(staged: StagedProgram, positions: list[int] | tuple[int, ...]) -> list[Value]:
    """The program's arguments (stored values and the batch) the instructions at `positions` read."""
    read = {v.id for p in positions for v in staged.program.body[p].inputs}
    return [v for v in staged.program.arguments if v.id in read]


def _unique(values: list[Value]) -> list[Value]:
    return list({v.id: v for v in values}.values())


def _send(b: Body, d: Dialect, x: Operand, stage: int) -> None:
    name = b.name(f"{x.name[1:]}_sent")
    b.emit(f"{name} = {d.op('send')} {x.name} on {PIPELINE_SYMBOL} {d.axes_attr} = [0] destination = [{stage}] "
           f": ({x.type}) -> {x.type}")


def _recv(b: Body, d: Dialect, device: DeviceIndex, value: Value, stage: int) -> Operand:
    buffer = empty(b, value_spec(device, value), f"{value.tensor}_buffer")
    name = b.name(value.tensor)
    b.emit(f"{name} = {d.op('recv')} {buffer.name} on {PIPELINE_SYMBOL} {d.axes_attr} = [0] source = [{stage}] "
           f": ({buffer.type}) -> {buffer.type}")
    return Operand(name, buffer.spec)

"""The partitioned IR: the SPMD program as every device runs it.

Values have the device's local types: the largest shard per dim, and `?` for a dim whose shards
differ in size between devices (their sizes computed from the process index where an op needs
them). Every `LocalOp` is the graph op lowered on local shapes (an attention or attention gradient
with its key loop split adds its combine's all_reduces); every `Communicate` is the dialect's collective.
Arguments follow one of the two conventions of the design:

- `local`: the function receives every argument already partitioned (its local shard);
- `global`: it receives the full tensors and cuts its shard, one split dim at a time: with
  `all_slice` (the reference's in-group pieces, exactly the sharding's shards) where the dim
  splits evenly, else with `tensor.extract_slice` at the start the process index gives; a halo
  sharding's halos then come from one `update_halo`.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from autoshard.errors import InputError
from autoshard.mlir.collectives import emit_all_reduce, emit_step
from autoshard.mlir.device import DeviceIndex
from autoshard.mlir.dialect import dialect as dialect_named
from autoshard.mlir.linalg import Operand, Spec
from autoshard.mlir.lower import LoweringContext, lower
from autoshard.mlir.lower_ring import lower_ring
from autoshard.mlir.module import MESH_SYMBOL, axes_list, function_name, mesh_comment, module_text
from autoshard.mlir.text import Body
from autoshard.ops.grads import attention_key_axes
from autoshard.planning.options import local_extents
from autoshard.planning.plan import Plan
from autoshard.resharding import Price, halo_step
from autoshard.sharding import Sharding
from autoshard.spmd.program import Communicate, Instruction, LocalOp, SpmdProgram, Value, partition

ARGUMENT_CONVENTIONS = ("local", "global")


def _spec(device: DeviceIndex, sharding: Sharding, shape: tuple[int, ...], dtype: str) -> Spec:
    """Local type of a value: static where every device's shard has the same size (always on a
    haloed dim, padded to the largest block)."""
    mesh = device.mesh
    largest = sharding.max_local_shape(mesh, shape)
    dims: list[int | str] = []
    for d, size in enumerate(shape):
        even = sharding.halo(d) != (0, 0) or len({stop - start for start, stop in sharding.dim_bounds(mesh, size, d)}) == 1
        dims.append(largest[d] if even else device.shard_size(sharding, shape, d))
    return Spec(largest, dtype, tuple(dims))


def value_spec(device: DeviceIndex, value: Value) -> Spec:
    return _spec(device, value.sharding, value.shape, value.dtype)


def emit_partitioned(program: SpmdProgram | Plan, dialect: str = "mesh", arguments: str = "local",
                     price: Price | None = None) -> str:
    """The SPMD module of a program (or of `partition(plan, price)`), in the `mesh` or `shard`
    spelling, with arguments `local` (already partitioned) or `global` (full, sliced here)."""
    check_arguments(arguments)
    if isinstance(program, Plan):
        program = partition(program, price)
    d = dialect_named(dialect)
    mesh = program.mesh
    b = Body()
    device = DeviceIndex(b, d, mesh)
    values: dict[int, Operand] = {}
    args = bind_arguments(b, device, program.arguments, arguments, values)
    emit_instructions(b, device, program.body, values)
    results = [values[v.id] for v in program.results]
    comments = [f"autoshard partitioned IR: graph {program.graph.name!r} on mesh {mesh} ({d.name} dialect), "
                f"as every device runs it", mesh_comment(mesh),
                "arguments: " + ("each device's local shard" if arguments == "local" else
                                 "full tensors, each device cutting its shard"),
                "local types: the largest shard per dim; ? where shards differ between devices"]
    return module_text(d, mesh, comments, function_name(program.graph.name), args, results, b)


def check_arguments(arguments: str) -> None:
    if arguments not in ARGUMENT_CONVENTIONS:
        raise InputError(f"unknown argument convention {arguments!r}; expected one of {list(ARGUMENT_CONVENTIONS)}",
                         "arguments")


def bind_arguments(b: Body, device: DeviceIndex, values: Sequence[Value], arguments: str,
                   bound: dict[int, Operand]) -> list[Operand]:
    """The function arguments of `values` under the `arguments` convention, each value bound in
    `bound` to its local shard (the argument itself, or the shard cut from it)."""
    args = []
    for value in values:
        if arguments == "local":
            arg = bound[value.id] = Operand(b.name(value.tensor), value_spec(device, value))
        else:
            arg = Operand(b.name(value.tensor), Spec(value.shape, value.dtype))
            bound[value.id] = _slice_argument(b, device, value, arg)
        args.append(arg)
    return args


def emit_instructions(b: Body, device: DeviceIndex, items: Iterable[Instruction], values: dict[int, Operand]) -> None:
    """`items` on local shards, reading and binding their values in `values`."""
    for instruction in items:
        if isinstance(instruction, LocalOp):
            _emit_local_op(b, device, instruction, values)
        else:
            _emit_communicate(b, device, instruction, values)


def _slice_argument(b: Body, device: DeviceIndex, value: Value, arg: Operand) -> Operand:
    """Cut the device's shard of a full argument, one split dim at a time: `all_slice` where the
    dim splits evenly, else `tensor.extract_slice` at the shard's start (from the process index)."""
    mesh, sharding = device.mesh, value.sharding
    current, split, offsets = arg, [() for _ in value.shape], [() for _ in value.shape]
    for dim, axes in enumerate(sharding.split_axes):
        if not axes:
            continue
        split[dim] = axes
        offsets[dim] = sharding.dims_offsets[dim] if dim < len(sharding.dims_offsets) else ()
        spec = _spec(device, Sharding(tuple(split), dims_offsets=tuple(offsets)), value.shape, value.dtype)
        name = b.name(f"{value.tensor}_local")
        if isinstance(spec.sizes[dim], int):
            b.emit(f"{name} = {device.dialect.op('all_slice')} {current.name} on {MESH_SYMBOL} "
                   f"{device.dialect.axes_attr} = {axes_list(mesh, axes)} slice_axis = {dim} : {current.type} -> {spec.type}")
        else:
            start = device.shard_start(sharding, value.shape, dim)
            starts = ", ".join(start if d == dim else "0" for d in range(len(value.shape)))
            sizes = ", ".join(str(s) for s in spec.sizes)
            b.emit(f"{name} = tensor.extract_slice {current.name}[{starts}] [{sizes}] [{', '.join(['1'] * len(value.shape))}] "
                   f": {current.type} to {spec.type}")
        current = Operand(name, spec)
    if sharding.has_halo:
        cut = Sharding(sharding.split_axes)
        step = halo_step(mesh, value.shape, 1.0, cut, cut.with_halo(sharding.halo_sizes), lambda *_: 0.0)
        current = emit_step(b, device.dialect, mesh, step, current, _spec(device, step.after, value.shape, value.dtype),
                            device, f"{value.tensor}_local")
    return current


def _emit_local_op(b: Body, device: DeviceIndex, instruction: LocalOp, values: dict[int, Operand]) -> None:
    op, option, mesh = instruction.op, instruction.option, device.mesh
    shardings = ", ".join(f"{v.tensor} {v.sharding}" for v in instruction.outputs)
    b.comment(f"op {op.name} ({op.kind}), option {option}: {shardings}")

    def offset(loop: int) -> str | None:
        axes = option.loop_axes[loop]
        return device.block_start(axes, op.nest.extents[loop]) if axes else None

    inputs = tuple(values[v.id] for v in instruction.inputs)
    specs = tuple(value_spec(device, v) for v in instruction.outputs)
    halos = tuple(tuple(v.sharding.halo(d) for d in range(len(v.shape))) for v in instruction.inputs)
    key_axes = attention_key_axes(op.kind, op.attrs, option.loop_axes)

    def all_reduce(b: Body, x: Operand, kind: str, hint: str) -> Operand:
        return emit_all_reduce(b, device.dialect, mesh, key_axes, x, kind, hint)
    ctx = LoweringContext(op, inputs, specs, local_extents(op.nest, option, mesh), offset, halos,
                          all_reduce if key_axes else None)
    results = lower(b, ctx) if option.ring is None else lower_ring(b, device, ctx, option.ring)
    for value, result in zip(instruction.outputs, results):
        values[value.id] = result


def _emit_communicate(b: Body, device: DeviceIndex, instruction: Communicate, values: dict[int, Operand]) -> None:
    step = instruction.step
    b.comment(f"{instruction.input.tensor}: {step.before} -> {step.after}")
    out = value_spec(device, instruction.output)
    values[instruction.output.id] = emit_step(b, device.dialect, device.mesh, step, values[instruction.input.id], out,
                                              device, instruction.output.tensor)

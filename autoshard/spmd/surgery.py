"""Program surgery for the collective rewrites: who reads and who makes a value, removing and
inserting instructions, and building the collectives of a resharding or a reduction."""

from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType
from typing import Iterator, Sequence

from autoshard.errors import ShardingError
from autoshard.mesh import Mesh
from autoshard.ops.loops import PARALLEL
from autoshard.planning.options import local_extents
from autoshard.resharding import CollectiveStep, plan_resharding
from autoshard.sharding import Sharding, ceildiv
from autoshard.spmd.program import Communicate, Instruction, LocalOp, SpmdProgram, Value, canonical, check_program


def edit(program: SpmdProgram, remove: set[int], insert: dict[int, list[Instruction]],
          substitute: dict[int, Value] | None = None) -> SpmdProgram:
    """Drop the instructions at `remove`, put `insert[k]` where instruction `k` was (before it if
    it stays), and read `substitute[id]` wherever value `id` was read."""
    substitute = substitute or {}

    def sub(value: Value) -> Value:
        return substitute.get(value.id, value)

    body: list[Instruction] = []
    for index, instruction in enumerate(program.body):
        body += insert.get(index, [])
        if index in remove:
            continue
        if isinstance(instruction, Communicate):
            body.append(replace(instruction, input=sub(instruction.input)))
        else:
            body.append(replace(instruction, inputs=tuple(sub(v) for v in instruction.inputs)))
    edited = replace(program, body=tuple(body), results=tuple(sub(v) for v in program.results))
    check_program(edited)
    return edited


class Ids:
    def __init__(self, program: SpmdProgram):
        self.next = program.next_id()

    def value(self, like: Value, sharding: Sharding, mesh: Mesh) -> Value:
        self.next += 1
        return Value(self.next - 1, like.tensor, canonical(mesh, sharding), like.shape, like.dtype)


def reshard(program: SpmdProgram, ids: Ids, value: Value, target: Sharding,
             last: Value | None = None) -> tuple[list[Communicate], Value]:
    """Communicates taking `value` to `target` (planned with the program's price); the final
    output is `last` when given (it must have the target sharding)."""
    mesh = program.mesh
    target = canonical(mesh, target)
    if value.sharding == target:
        return [], value
    plan = plan_resharding(mesh, value.shape, itemsize_of(program, value), value.sharding, target, program.price)
    steps: list[Communicate] = []
    for k, step in enumerate(plan.steps):
        out = last if last is not None and k == len(plan.steps) - 1 else ids.value(value, step.after, mesh)
        if out.sharding != step.after:
            raise ShardingError(f"resharding {value.tensor!r} ends in {step.after}, not {out.sharding}")
        steps.append(Communicate(step, value, out))
        value = out
    return steps, value


def itemsize_of(program: SpmdProgram, value: Value) -> int:
    return program.graph.tensors[value.tensor].itemsize


def reduction_step(program: SpmdProgram, value: Value, kind: str, axes: tuple[str, ...],
                   scatter_axis: int | None = None) -> CollectiveStep:
    """An `all_reduce` (or `reduce_scatter` along `scatter_axis`) of `value`'s partial `axes`,
    priced as the resharding planner prices it (the input buffer, padded to equal chunks when
    scattered)."""
    mesh, before = program.mesh, value.sharding
    split = [before.dim_axes(d) for d in range(len(value.shape))]
    dims: dict[str, object] = {"reduction": before.partial_kind}
    buffer = list(before.max_local_shape(mesh, value.shape))
    if scatter_axis is not None:
        split[scatter_axis] = split[scatter_axis] + axes
        dims["scatter_axis"] = scatter_axis
        group = mesh.group_size(axes)
        buffer[scatter_axis] = ceildiv(buffer[scatter_axis], group) * group
    rest = tuple(a for a in before.partial_axes if a not in axes)
    after = canonical(mesh, Sharding(tuple(split), rest, before.partial_kind))
    size = float(math.prod(buffer)) * itemsize_of(program, value)
    return CollectiveStep(kind, axes, MappingProxyType(dims), before.max_local_shape(mesh, value.shape),
                          after.max_local_shape(mesh, value.shape), size, program.price(kind, axes, size), before, after)


def ordered_axes(mesh: Mesh, axes: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted(axes, key=mesh.axis_index))


def is_elementwise(instruction: Instruction) -> bool:
    """A LocalOp whose loops are all parallel and whose single result is indexed by them in order."""
    if not isinstance(instruction, LocalOp) or len(instruction.outputs) != 1:
        return False
    nest = instruction.op.nest
    out = nest.output_maps[0]
    return (all(t == PARALLEL for t in nest.iterator_types)
            and [e.single_loop() for e in out.results] == list(range(nest.num_loops)))


def communicates(program: SpmdProgram, *kinds: str) -> Iterator[int]:
    for index, instruction in enumerate(program.body):
        if isinstance(instruction, Communicate) and instruction.step.kind in kinds:
            yield index


def sole_user(program: SpmdProgram, value: Value) -> int | None:
    users = program.user_indices.get(value.id, [])
    return users[0] if len(users) == 1 and users[0] < len(program.body) else None


def local_flops(program: SpmdProgram) -> float:
    """FLOPs one device computes: each op's FLOPs scaled to its largest block."""
    total = 0.0
    for op in program.local_ops():
        nest = op.op.nest
        share = math.prod(local_extents(nest, op.option, program.mesh)) / max(nest.points(), 1)
        total += op.op.flops() * share
    return total

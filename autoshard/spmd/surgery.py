"""Program surgery for the collective rewrites: who reads a value, which instructions are
elementwise, what an op computes per device, and the collectives of a resharding or a reduction."""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import TYPE_CHECKING, Sequence

from autoshard.errors import ShardingError
from autoshard.mesh import Mesh
from autoshard.ops.loops import PARALLEL
from autoshard.planning.costs import device_flops
from autoshard.resharding import CollectiveStep, plan_resharding
from autoshard.sharding import Sharding, ceildiv
from autoshard.spmd.program import Communicate, Instruction, LocalOp, SpmdProgram, Value, canonical

if TYPE_CHECKING:
    from autoshard.spmd.draft import Draft

RESULT = -1  # the "instruction" that reads the program's results, in `Draft.users`


def reshard(draft: Draft, value: Value, target: Sharding, last: Value | None = None) -> tuple[list[Communicate], Value]:
    """Communicates taking `value` to `target` (planned with the program's price); the final
    output is `last` when given (it must have the target sharding)."""
    mesh = draft.mesh
    target = canonical(mesh, target)
    if value.sharding == target:
        return [], value
    plan = plan_resharding(mesh, value.shape, itemsize_of(draft, value), value.sharding, target, draft.price)
    steps: list[Communicate] = []
    for k, step in enumerate(plan.steps):
        out = last if last is not None and k == len(plan.steps) - 1 else draft.new_value(value, step.after)
        if out.sharding != step.after:
            raise ShardingError(f"resharding {value.tensor!r} ends in {step.after}, not {out.sharding}")
        steps.append(Communicate(step, value, out))
        value = out
    return steps, value


def itemsize_of(program: SpmdProgram | Draft, value: Value) -> int:
    return program.graph.tensors[value.tensor].itemsize


def reduction_step(program: SpmdProgram | Draft, value: Value, kind: str, axes: tuple[str, ...],
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
                          after.max_local_shape(mesh, value.shape), size, program.price(kind, axes, size), before,
                          after)


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


def sole_user(draft: Draft, value: Value) -> int | None:
    """The one instruction reading `value`, if one does and the results do not."""
    users = draft.users.get(value.id, ())
    if len(users) != 1:
        return None
    (user,) = users
    return None if user == RESULT else user


def local_flops(program: SpmdProgram) -> float:
    """FLOPs one device computes: each op's FLOPs scaled to its largest block."""
    return sum(local_op_flops(op, program.mesh) for op in program.local_ops())


def local_op_flops(op: LocalOp, mesh: Mesh) -> float:
    """The FLOPs of the op's busiest block."""
    return device_flops(op.op, op.option, mesh)

"""The collective rewrites as (pattern, rewrite) pairs: a pattern yields the sites where its
rewrite could apply, the rewrite returns the changed program and what it did (or None). Each
keeps the program's meaning; `collective_opt.optimize` decides which to keep."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from autoshard.errors import ShardingError
from autoshard.mesh import Mesh
from autoshard.planning.options import ShardingOption, check_option, operand_shardings, result_shardings
from autoshard.reductions import REDUCTIONS
from autoshard.resharding import STEP_KINDS
from autoshard.sharding import Sharding, ceildiv
from autoshard.spmd.program import Communicate, Instruction, LocalOp, SpmdProgram, Value
from autoshard.spmd.surgery import (Ids, communicates, edit, is_elementwise, local_flops, ordered_axes,
                                     reduction_step, reshard, sole_user)


@dataclass(frozen=True)
class Rewrite:
    name: str
    pattern: Callable[[SpmdProgram], Iterator[int]]  # indices of candidate instructions
    rewrite: Callable[[SpmdProgram, int], tuple[SpmdProgram, str] | None]  # new program and what changed



# --- drop_unused --------------------------------------------------------------------------

def _unused(program: SpmdProgram) -> Iterator[int]:
    users = program.user_indices
    for index in communicates(program, *STEP_KINDS):
        if not users.get(program.body[index].output.id):
            yield index


def _drop(program: SpmdProgram, index: int) -> tuple[SpmdProgram, str]:
    c = program.body[index]
    return edit(program, {index}, {}), f"dropped unused {c.step.kind} of {c.input.tensor!r}"


# --- fold_all_reduce ----------------------------------------------------------------------

def _fold_sites(program: SpmdProgram) -> Iterator[int]:
    producers = program.producer_indices
    for index in communicates(program, "all_reduce"):
        first = producers.get(program.body[index].input.id)
        if first is not None and isinstance(program.body[first], Communicate) \
                and program.body[first].step.kind == "all_reduce" and sole_user(program, program.body[first].output) == index:
            yield index


def _fold(program: SpmdProgram, index: int) -> tuple[SpmdProgram, str]:
    second = program.body[index]
    first_index = program.producer_indices[second.input.id]
    first = program.body[first_index]
    axes = ordered_axes(program.mesh, first.step.mesh_axes + second.step.mesh_axes)
    step = reduction_step(program, first.input, "all_reduce", axes)
    folded = Communicate(step, first.input, second.output)
    return (edit(program, {first_index, index}, {index: [folded]}),
            f"folded all_reduces of {second.input.tensor!r} over {list(first.step.mesh_axes)} and "
            f"{list(second.step.mesh_axes)} into one over {list(axes)}")


# --- reassociation ------------------------------------------------------------------------

def _reduced_pair(program: SpmdProgram, index: int, kind: str) -> tuple[int, int] | None:
    """The producers of the LocalOp's two inputs when both are `kind` collectives read only by it."""
    op = program.body[index]
    if not isinstance(op, LocalOp) or len(op.inputs) != 2 or op.inputs[0].id == op.inputs[1].id:
        return None
    producers = program.producer_indices
    pair = []
    for value in op.inputs:
        p = producers.get(value.id)
        if p is None or not isinstance(program.body[p], Communicate) or program.body[p].step.kind != kind \
                or sole_user(program, value) != index:
            return None
        pair.append(p)
    a, b = (program.body[p] for p in pair)
    same = (a.step.dims.get("reduction") == b.step.dims.get("reduction") and a.input.sharding.partial_kind ==
            b.input.sharding.partial_kind and op.op.kind in REDUCTIONS[a.step.dims["reduction"]].passes_through)
    return (pair[0], pair[1]) if same else None


def _reassociate_all_reduce_sites(program: SpmdProgram) -> Iterator[int]:
    for index, instruction in enumerate(program.body):
        pair = _reduced_pair(program, index, "all_reduce")
        if pair is not None:
            a, b = (program.body[p] for p in pair)
            if set(a.step.mesh_axes) == set(b.step.mesh_axes) and \
                    not set(a.step.mesh_axes) & set(instruction.option.used_axes()):
                yield index


def _partial_op(program: SpmdProgram, ids: Ids, op: LocalOp, option: ShardingOption, inputs: tuple[Value, ...],
                partial: Sharding) -> LocalOp:
    """`op` under `option` on partial `inputs`: its result carries their partial axes."""
    split = result_shardings(op.op.nest, option)[0]
    out = ids.value(op.outputs[0], Sharding(split.split_axes, partial.partial_axes, partial.partial_kind), program.mesh)
    return LocalOp(op.op, option, inputs, (out,))


def _reassociate_all_reduce(program: SpmdProgram, index: int) -> tuple[SpmdProgram, str]:
    op = program.body[index]
    first, second = _reduced_pair(program, index, "all_reduce")
    a = program.body[first]
    ids = Ids(program)
    moved = _partial_op(program, ids, op, op.option, (a.input, program.body[second].input), a.input.sharding)
    step = reduction_step(program, moved.outputs[0], "all_reduce", ordered_axes(program.mesh, a.step.mesh_axes))
    return (edit(program, {first, second, index}, {index: [moved, Communicate(step, moved.outputs[0], op.outputs[0])]}),
            f"{op.op.name} ({op.op.kind}) runs on the partial values; one all_reduce over {list(a.step.mesh_axes)} "
            f"replaces two")


def _reassociate_reduce_scatter_sites(program: SpmdProgram) -> Iterator[int]:
    for index, instruction in enumerate(program.body):
        pair = _reduced_pair(program, index, "reduce_scatter")
        if pair is None or not is_elementwise(instruction):
            continue
        a, b = (program.body[p] for p in pair)
        identity = all(m == instruction.op.nest.output_maps[0] for m in instruction.op.nest.input_maps)
        if identity and a.step.mesh_axes == b.step.mesh_axes and \
                a.step.dims["scatter_axis"] == b.step.dims["scatter_axis"] and a.input.sharding == b.input.sharding:
            yield index


def _reassociate_reduce_scatter(program: SpmdProgram, index: int) -> tuple[SpmdProgram, str] | None:
    op = program.body[index]
    first, second = _reduced_pair(program, index, "reduce_scatter")
    a = program.body[first]
    axes, dim = a.step.mesh_axes, a.step.dims["scatter_axis"]
    loops = list(op.option.loop_axes)
    if loops[dim][len(loops[dim]) - len(axes):] != axes:
        return None
    loops[dim] = loops[dim][:len(loops[dim]) - len(axes)]
    option = ShardingOption(tuple(loops))
    if operand_shardings(op.op.nest, option)[0] != a.input.sharding.without_partial():
        return None
    ids = Ids(program)
    moved = _partial_op(program, ids, op, option, (a.input, program.body[second].input), a.input.sharding)
    step = reduction_step(program, moved.outputs[0], "reduce_scatter", axes, dim)
    if step.after != op.outputs[0].sharding:
        return None
    return (edit(program, {first, second, index}, {index: [moved, Communicate(step, moved.outputs[0], op.outputs[0])]}),
            f"{op.op.name} ({op.op.kind}) runs on the unscattered partial values; one reduce_scatter over "
            f"{list(axes)} along dim {dim} replaces two")


# --- moving all_gathers down ----------------------------------------------------------------

def _gathered_loop(op: LocalOp, value: Value, dim: int) -> int | None:
    """The loop through which `op` reads `value`'s `dim` (the same at every position it reads it)."""
    loops = {m.results[dim].single_loop() for m, v in zip(op.op.nest.input_maps, op.inputs) if v.id == value.id}
    return loops.pop() if len(loops) == 1 and None not in loops else None


def _move_down(program: SpmdProgram, index: int) -> tuple[SpmdProgram, str] | None:
    """All_gather `index` (along a suffix of a dim's axes) moved past its only reader, an
    elementwise op, which then also splits that loop over the gathered axes."""
    gather = program.body[index]
    user = sole_user(program, gather.output)
    if user is None or not is_elementwise(program.body[user]):
        return None
    op = program.body[user]
    axes, dim = gather.step.mesh_axes, gather.step.dims["gather_axis"]
    loop = _gathered_loop(op, gather.output, dim)
    if loop is None or set(axes) & set(op.option.used_axes()):
        return None
    loops = list(op.option.loop_axes)
    loops[loop] = loops[loop] + axes
    option = ShardingOption(tuple(loops))
    try:
        check_option(op.op.nest, option, program.mesh)
    except ShardingError:
        return None
    required = operand_shardings(op.op.nest, option)
    ids = Ids(program)
    before: list[Instruction] = []
    inputs = []
    for value, need in zip(op.inputs, required):
        source = gather.input if value.id == gather.output.id else value
        steps, ready = reshard(program, ids, source, need)
        before += steps
        inputs.append(ready)
    out = ids.value(op.outputs[0], result_shardings(op.op.nest, option)[0], program.mesh)
    moved = LocalOp(op.op, option, tuple(inputs), (out,))
    after, _ = reshard(program, ids, out, op.outputs[0].sharding, last=op.outputs[0])
    substitute = {} if after else {op.outputs[0].id: out}
    edited = edit(program, {index, user}, {user: before + [moved] + after}, substitute)
    return edited, f"all_gather over {list(axes)} of {gather.input.tensor!r} moved below {op.op.name} ({op.op.kind})"


def _move_down_sites(program: SpmdProgram) -> Iterator[int]:
    for index in communicates(program, "all_gather"):
        user = sole_user(program, program.body[index].output)
        if user is not None and is_elementwise(program.body[user]):
            yield index


def _decompose_sites(program: SpmdProgram) -> Iterator[int]:
    for index in communicates(program, "all_reduce"):
        user = sole_user(program, program.body[index].output)
        if user is not None and is_elementwise(program.body[user]):
            yield index


def _decompose(program: SpmdProgram, index: int) -> tuple[SpmdProgram, str] | None:
    """all_reduce -> reduce_scatter + all_gather along the dim that leaves the least to compute,
    with the all_gather moved below the elementwise op reading the result."""
    reduce = program.body[index]
    value, axes = reduce.input, reduce.step.mesh_axes
    op = program.body[sole_user(program, reduce.output)]
    best: tuple[tuple[float, int], SpmdProgram, str] | None = None
    for dim in range(len(value.shape)):
        if _gathered_loop(op, reduce.output, dim) is None:
            continue
        try:
            scatter = reduction_step(program, value, "reduce_scatter", ordered_axes(program.mesh, axes), dim)
            if not _cut_exact(program.mesh, value, scatter.after, dim):
                continue
            ids = Ids(program)
            scattered = ids.value(value, scatter.after, program.mesh)
            gathers, _ = reshard(program, ids, scattered, reduce.output.sharding, last=reduce.output)
        except ShardingError:
            continue
        if [c.step.kind for c in gathers] != ["all_gather"]:
            continue
        split = edit(program, {index}, {index: [Communicate(scatter, value, scattered)] + gathers})
        moved = _move_down(split, index + 1)
        if moved is None:
            continue
        # Least to compute; then the dim with the largest shards (the most even cut).
        key = (local_flops(moved[0]), -scatter.in_local_shape[dim])
        if best is None or key < best[0]:
            best = (key, moved[0], f"all_reduce over {list(axes)} of {value.tensor!r} split into reduce_scatter "
                                     f"along dim {dim} and all_gather; " + moved[1])
    return None if best is None else (best[1], best[2])


def _cut_exact(mesh: Mesh, value: Value, after: Sharding, dim: int) -> bool:
    """Cutting every shard of `value`'s `dim` into ceildiv pieces gives exactly `after`'s shards."""
    if value.sharding.dims_offsets:
        return False
    coarse = value.sharding.dim_bounds(mesh, value.shape[dim], dim)
    fine = after.dim_bounds(mesh, value.shape[dim], dim)
    group = len(fine) // len(coarse)
    for k, (start, stop) in enumerate(coarse):
        step = ceildiv(stop - start, group)
        pieces = [(min(start + j * step, stop), min(start + (j + 1) * step, stop)) for j in range(group)]
        if pieces != fine[k * group:(k + 1) * group]:
            return False
    return True


# --- merge_reshardings --------------------------------------------------------------------

def _chain_sites(program: SpmdProgram) -> Iterator[int]:
    producers = program.producer_indices
    for index in communicates(program, *STEP_KINDS):
        first = producers.get(program.body[index].input.id)
        if first is not None and isinstance(program.body[first], Communicate) and \
                sole_user(program, program.body[first].output) == index:
            yield index


def _merge(program: SpmdProgram, index: int) -> tuple[SpmdProgram, str] | None:
    second = program.body[index]
    first_index = program.producer_indices[second.input.id]
    first = program.body[first_index]
    ids = Ids(program)
    try:
        steps, _ = reshard(program, ids, first.input, second.output.sharding, last=second.output)
    except ShardingError:
        return None
    kinds = " + ".join(c.step.kind for c in steps) or "nothing"
    what = f"{first.step.kind} + {second.step.kind} of {second.input.tensor!r} replanned as {kinds}"
    if not steps:
        return edit(program, {first_index, index}, {}, {second.output.id: first.input}), what
    return edit(program, {first_index, index}, {index: steps}), what


REWRITES: tuple[Rewrite, ...] = (
    Rewrite("drop_unused", _unused, _drop),
    Rewrite("fold_all_reduce", _fold_sites, _fold),
    Rewrite("reassociate_all_reduce", _reassociate_all_reduce_sites, _reassociate_all_reduce),
    Rewrite("reassociate_reduce_scatter", _reassociate_reduce_scatter_sites, _reassociate_reduce_scatter),
    Rewrite("merge_reshardings", _chain_sites, _merge),
    Rewrite("decompose_all_reduce", _decompose_sites, _decompose),
    Rewrite("move_all_gather_down", _move_down_sites, _move_down),
)

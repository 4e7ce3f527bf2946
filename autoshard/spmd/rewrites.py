"""The collective rewrites as (site, rewrite) pairs: `site` says whether an instruction of a
`Draft` is where the rewrite could apply, `rewrite` edits the draft there and says what it did
(or returns None, leaving the draft as it was). Each keeps the program's meaning;
`collective_opt.optimize` decides which edits to keep.

A site's answer, and what its rewrite does and costs, depend only on the instruction, the
instructions making and reading what it reads, and those reading what it makes: the
neighbourhood `Draft` reports as touched by an edit, which is all `optimize` looks at again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from autoshard.errors import ShardingError
from autoshard.mesh import Mesh
from autoshard.planning.options import ShardingOption, check_option, operand_shardings, result_shardings
from autoshard.reductions import REDUCTIONS
from autoshard.resharding import STEP_KINDS
from autoshard.sharding import Sharding, ceildiv
from autoshard.spmd.draft import Draft
from autoshard.spmd.program import Communicate, Instruction, LocalOp, Value
from autoshard.spmd.surgery import is_elementwise, ordered_axes, reduction_step, reshard, sole_user


@dataclass(frozen=True)
class Rewrite:
    name: str
    site: Callable[[Draft, int], bool]  # whether the instruction at a key is a candidate
    rewrite: Callable[[Draft, int], str | None]  # edits the draft there; what changed


def _communicate(draft: Draft, key: int, *kinds: str) -> Communicate | None:
    instruction = draft.body[key]
    return instruction if isinstance(instruction, Communicate) and instruction.step.kind in kinds else None


# --- drop_unused --------------------------------------------------------------------------

def _unused(draft: Draft, key: int) -> bool:
    c = _communicate(draft, key, *STEP_KINDS)
    return c is not None and not draft.users.get(c.output.id)


def _drop(draft: Draft, key: int) -> str:
    c = draft.body[key]
    draft.edit({key}, {})
    return f"dropped unused {c.step.kind} of {c.input.tensor!r}"


# --- fold_all_reduce ----------------------------------------------------------------------

def _fold_site(draft: Draft, key: int) -> bool:
    second = _communicate(draft, key, "all_reduce")
    first = draft.producer.get(second.input.id) if second is not None else None
    return first is not None and _communicate(draft, first, "all_reduce") is not None \
        and sole_user(draft, draft.body[first].output) == key


def _fold(draft: Draft, key: int) -> str:
    second = draft.body[key]
    first_key = draft.producer[second.input.id]
    first = draft.body[first_key]
    axes = ordered_axes(draft.mesh, first.step.mesh_axes + second.step.mesh_axes)
    step = reduction_step(draft, first.input, "all_reduce", axes)
    draft.edit({first_key, key}, {key: [Communicate(step, first.input, second.output)]})
    return (f"folded all_reduces of {second.input.tensor!r} over {list(first.step.mesh_axes)} and "
            f"{list(second.step.mesh_axes)} into one over {list(axes)}")


# --- reassociation ------------------------------------------------------------------------

def _reduced_pair(draft: Draft, key: int, kind: str) -> tuple[int, int] | None:
    """The producers of the LocalOp's two inputs when both are `kind` collectives read only by it."""
    op = draft.body[key]
    if not isinstance(op, LocalOp) or len(op.inputs) != 2 or op.inputs[0].id == op.inputs[1].id:
        return None
    pair = []
    for value in op.inputs:
        p = draft.producer.get(value.id)
        if p is None or _communicate(draft, p, kind) is None or sole_user(draft, value) != key:
            return None
        pair.append(p)
    a, b = (draft.body[p] for p in pair)
    same = (a.step.dims.get("reduction") == b.step.dims.get("reduction") and a.input.sharding.partial_kind ==
            b.input.sharding.partial_kind and op.op.kind in REDUCTIONS[a.step.dims["reduction"]].passes_through)
    return (pair[0], pair[1]) if same else None


def _reassociate_all_reduce_site(draft: Draft, key: int) -> bool:
    pair = _reduced_pair(draft, key, "all_reduce")
    if pair is None:
        return False
    a, b = (draft.body[p] for p in pair)
    return set(a.step.mesh_axes) == set(b.step.mesh_axes) and \
        not set(a.step.mesh_axes) & set(draft.body[key].option.used_axes())


def _partial_op(draft: Draft, op: LocalOp, option: ShardingOption, inputs: tuple[Value, ...],
                partial: Sharding) -> LocalOp:
    """`op` under `option` on partial `inputs`: its result carries their partial axes."""
    split = result_shardings(op.op.nest, option)[0]
    sharding = Sharding(split.split_axes, partial.partial_axes, partial.partial_kind)
    return LocalOp(op.op, option, inputs, (draft.new_value(op.outputs[0], sharding),))


def _reassociate_all_reduce(draft: Draft, key: int) -> str:
    op = draft.body[key]
    first, second = _reduced_pair(draft, key, "all_reduce")
    a = draft.body[first]
    moved = _partial_op(draft, op, op.option, (a.input, draft.body[second].input), a.input.sharding)
    step = reduction_step(draft, moved.outputs[0], "all_reduce", ordered_axes(draft.mesh, a.step.mesh_axes))
    draft.edit({first, second, key}, {key: [moved, Communicate(step, moved.outputs[0], op.outputs[0])]})
    return (f"{op.op.name} ({op.op.kind}) runs on the partial values; one all_reduce over {list(a.step.mesh_axes)} "
            f"replaces two")


def _reassociate_reduce_scatter_site(draft: Draft, key: int) -> bool:
    instruction = draft.body[key]
    pair = _reduced_pair(draft, key, "reduce_scatter")
    if pair is None or not is_elementwise(instruction):
        return False
    a, b = (draft.body[p] for p in pair)
    identity = all(m == instruction.op.nest.output_maps[0] for m in instruction.op.nest.input_maps)
    return identity and a.step.mesh_axes == b.step.mesh_axes and \
        a.step.dims["scatter_axis"] == b.step.dims["scatter_axis"] and a.input.sharding == b.input.sharding


def _reassociate_reduce_scatter(draft: Draft, key: int) -> str | None:
    op = draft.body[key]
    first, second = _reduced_pair(draft, key, "reduce_scatter")
    a = draft.body[first]
    axes, dim = a.step.mesh_axes, a.step.dims["scatter_axis"]
    loops = list(op.option.loop_axes)
    if loops[dim][len(loops[dim]) - len(axes):] != axes:
        return None
    loops[dim] = loops[dim][:len(loops[dim]) - len(axes)]
    option = ShardingOption(tuple(loops))
    if operand_shardings(op.op.nest, option)[0] != a.input.sharding.without_partial():
        return None
    moved = _partial_op(draft, op, option, (a.input, draft.body[second].input), a.input.sharding)
    step = reduction_step(draft, moved.outputs[0], "reduce_scatter", axes, dim)
    if step.after != op.outputs[0].sharding:
        return None
    draft.edit({first, second, key}, {key: [moved, Communicate(step, moved.outputs[0], op.outputs[0])]})
    return (f"{op.op.name} ({op.op.kind}) runs on the unscattered partial values; one reduce_scatter over "
            f"{list(axes)} along dim {dim} replaces two")


# --- moving all_gathers down ----------------------------------------------------------------

def _gathered_loop(op: LocalOp, value: Value, dim: int) -> int | None:
    """The loop through which `op` reads `value`'s `dim` (the same at every position it reads it)."""
    loops = {m.results[dim].single_loop() for m, v in zip(op.op.nest.input_maps, op.inputs) if v.id == value.id}
    return loops.pop() if len(loops) == 1 and None not in loops else None


def _move_down(draft: Draft, key: int) -> str | None:
    """All_gather `key` (along a suffix of a dim's axes) moved past its only reader, an
    elementwise op, which then also splits that loop over the gathered axes."""
    gather = draft.body[key]
    user = sole_user(draft, gather.output)
    if user is None or not is_elementwise(draft.body[user]):
        return None
    op = draft.body[user]
    axes, dim = gather.step.mesh_axes, gather.step.dims["gather_axis"]
    loop = _gathered_loop(op, gather.output, dim)
    if loop is None or set(axes) & set(op.option.used_axes()):
        return None
    loops = list(op.option.loop_axes)
    loops[loop] = loops[loop] + axes
    option = ShardingOption(tuple(loops))
    try:
        check_option(op.op.nest, option, draft.mesh)
    except ShardingError:
        return None
    required = operand_shardings(op.op.nest, option)
    before: list[Instruction] = []
    inputs = []
    for value, need in zip(op.inputs, required):
        source = gather.input if value.id == gather.output.id else value
        steps, ready = reshard(draft, source, need)
        before += steps
        inputs.append(ready)
    out = draft.new_value(op.outputs[0], result_shardings(op.op.nest, option)[0])
    moved = LocalOp(op.op, option, tuple(inputs), (out,))
    after, _ = reshard(draft, out, op.outputs[0].sharding, last=op.outputs[0])
    substitute = {} if after else {op.outputs[0].id: out}
    draft.edit({key, user}, {user: before + [moved] + after}, substitute)
    return f"all_gather over {list(axes)} of {gather.input.tensor!r} moved below {op.op.name} ({op.op.kind})"


def _gather_site(draft: Draft, key: int) -> bool:
    return _feeds_elementwise(draft, _communicate(draft, key, "all_gather"))


def _reduce_site(draft: Draft, key: int) -> bool:
    return _feeds_elementwise(draft, _communicate(draft, key, "all_reduce"))


def _feeds_elementwise(draft: Draft, c: Communicate | None) -> bool:
    user = sole_user(draft, c.output) if c is not None else None
    return user is not None and is_elementwise(draft.body[user])


def _decompose(draft: Draft, key: int) -> str | None:
    """all_reduce -> reduce_scatter + all_gather along the dim that leaves the least to compute,
    with the all_gather moved below the elementwise op reading the result."""
    shard_shape = draft.body[key].input.buffer_shape(draft.mesh)
    best: tuple[tuple[float, int], int] | None = None
    for dim in range(len(shard_shape)):
        mark = draft.mark()
        if _split_and_move(draft, key, dim) is not None:
            # Least to compute; then the dim with the largest shards (the most even cut).
            rank = (draft.flops, -shard_shape[dim])
            if best is None or rank < best[0]:
                best = (rank, dim)
        draft.rollback(mark)
    return None if best is None else _split_and_move(draft, key, best[1])


def _split_and_move(draft: Draft, key: int, dim: int) -> str | None:
    """all_reduce `key` done as a reduce_scatter along `dim` and the all_gather undoing it, the
    gather moved below the op reading the result; None (and the draft as it was) if it cannot."""
    reduce = draft.body[key]
    value, axes = reduce.input, reduce.step.mesh_axes
    if _gathered_loop(draft.body[sole_user(draft, reduce.output)], reduce.output, dim) is None:
        return None
    try:
        scatter = reduction_step(draft, value, "reduce_scatter", ordered_axes(draft.mesh, axes), dim)
        if not _cut_exact(draft.mesh, value, scatter.after, dim):
            return None
        scattered = draft.new_value(value, scatter.after)
        gathers, _ = reshard(draft, scattered, reduce.output.sharding, last=reduce.output)
    except ShardingError:
        return None
    if [c.step.kind for c in gathers] != ["all_gather"]:
        return None
    mark = draft.mark()
    (_, gather), = draft.edit({key}, {key: [Communicate(scatter, value, scattered)] + gathers}).values()
    moved = _move_down(draft, gather)
    if moved is None:
        draft.rollback(mark)
        return None
    return (f"all_reduce over {list(axes)} of {value.tensor!r} split into reduce_scatter along dim {dim} and "
            f"all_gather; " + moved)


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

def _chain_site(draft: Draft, key: int) -> bool:
    second = _communicate(draft, key, *STEP_KINDS)
    first = draft.producer.get(second.input.id) if second is not None else None
    return first is not None and isinstance(draft.body[first], Communicate) and \
        sole_user(draft, draft.body[first].output) == key


def _merge(draft: Draft, key: int) -> str | None:
    second = draft.body[key]
    first_key = draft.producer[second.input.id]
    first = draft.body[first_key]
    try:
        steps, _ = reshard(draft, first.input, second.output.sharding, last=second.output)
    except ShardingError:
        return None
    if steps:
        draft.edit({first_key, key}, {key: steps})
    else:
        draft.edit({first_key, key}, {}, {second.output.id: first.input})
    kinds = " + ".join(c.step.kind for c in steps) or "nothing"
    return f"{first.step.kind} + {second.step.kind} of {second.input.tensor!r} replanned as {kinds}"


REWRITES: tuple[Rewrite, ...] = (
    Rewrite("drop_unused", _unused, _drop),
    Rewrite("fold_all_reduce", _fold_site, _fold),
    Rewrite("reassociate_all_reduce", _reassociate_all_reduce_site, _reassociate_all_reduce),
    Rewrite("reassociate_reduce_scatter", _reassociate_reduce_scatter_site, _reassociate_reduce_scatter),
    Rewrite("merge_reshardings", _chain_site, _merge),
    Rewrite("decompose_all_reduce", _reduce_site, _decompose),
    Rewrite("move_all_gather_down", _gather_site, _move_down),
)

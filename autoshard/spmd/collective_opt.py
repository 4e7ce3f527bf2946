"""Collective optimisations on an `SpmdProgram`, as small (pattern, rewrite) pairs.

A pattern yields the sites where its rewrite could apply; the rewrite returns the changed
program (or None). `optimize` applies rewrites one at a time, keeping a change only when it
lowers the program's cost: communication seconds (as priced by the program's own price), then
per-device FLOPs. Every rewrite keeps the program's meaning (the simulator runs the result):

- `drop_unused`: a collective whose result nobody reads;
- `fold_all_reduce`: `all_reduce(B, all_reduce(A, x))` -> `all_reduce(A + B, x)`;
- `reassociate_all_reduce`: `add(all_reduce(x), all_reduce(y))` -> `all_reduce(add(x, y))`
  (also `sub` for sums, and `max`/`min` on max/min-partial values): the op runs on the partial
  pieces, which is exact because it is linear in them;
- `reassociate_reduce_scatter`: the same with two reduce_scatters along the same dim;
- `decompose_all_reduce`: `all_reduce` before an elementwise op -> `reduce_scatter`, the op on
  the scattered shards, then `all_gather` (the gather moved down past the op);
- `move_all_gather_down`: an `all_gather` before an elementwise op moves past it;
- `merge_reshardings`: two consecutive collectives replanned as one resharding when that is
  cheaper (an all_gather followed by the all_slice it undoes disappears).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Callable, Iterator, Sequence

from autoshard.errors import ShardingError
from autoshard.mesh import Mesh
from autoshard.ops.loops import PARALLEL
from autoshard.planning.options import ShardingOption, check_option, local_extents, operand_shardings, result_shardings
from autoshard.reductions import REDUCTIONS
from autoshard.resharding import STEP_KINDS, CollectiveStep, plan_resharding
from autoshard.sharding import Sharding, ceildiv
from autoshard.spmd.program import Communicate, Instruction, LocalOp, SpmdProgram, Value, canonical, check_program


@dataclass(frozen=True, slots=True)
class Change:
    """One applied rewrite: where, and the program's communication seconds before and after."""

    rewrite: str
    detail: str
    seconds_before: float
    seconds_after: float


@dataclass(frozen=True)
class Rewrite:
    name: str
    pattern: Callable[[SpmdProgram], Iterator[int]]  # indices of candidate instructions
    rewrite: Callable[[SpmdProgram, int], tuple[SpmdProgram, str] | None]  # new program and what changed


# --- program surgery ----------------------------------------------------------------------

def _users(program: SpmdProgram) -> dict[int, list[int]]:
    """Value id -> indices of the instructions reading it (results count as index len(body))."""
    users: dict[int, list[int]] = {}
    for index, instruction in enumerate(program.body):
        for value in dict.fromkeys(instruction.inputs):
            users.setdefault(value.id, []).append(index)
    for value in program.results:
        users.setdefault(value.id, []).append(len(program.body))
    return users


def _producers(program: SpmdProgram) -> dict[int, int]:
    return {v.id: index for index, instruction in enumerate(program.body) for v in instruction.outputs}


def _edit(program: SpmdProgram, remove: set[int], insert: dict[int, list[Instruction]],
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


class _Ids:
    def __init__(self, program: SpmdProgram):
        self.next = program.next_id()

    def value(self, like: Value, sharding: Sharding, mesh: Mesh) -> Value:
        self.next += 1
        return Value(self.next - 1, like.tensor, canonical(mesh, sharding), like.shape, like.dtype)


def _reshard(program: SpmdProgram, ids: _Ids, value: Value, target: Sharding,
             last: Value | None = None) -> tuple[list[Communicate], Value]:
    """Communicates taking `value` to `target` (planned with the program's price); the final
    output is `last` when given (it must have the target sharding)."""
    mesh = program.mesh
    target = canonical(mesh, target)
    if value.sharding == target:
        return [], value
    itemsize = _itemsize(program, value)
    plan = plan_resharding(mesh, value.shape, itemsize, value.sharding, target, program.price)
    steps: list[Communicate] = []
    for k, step in enumerate(plan.steps):
        out = last if last is not None and k == len(plan.steps) - 1 else ids.value(value, step.after, mesh)
        if out.sharding != step.after:
            raise ShardingError(f"resharding {value.tensor!r} ends in {step.after}, not {out.sharding}")
        steps.append(Communicate(step, value, out))
        value = out
    return steps, value


def _itemsize(program: SpmdProgram, value: Value) -> int:
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
    size = float(math.prod(buffer)) * _itemsize(program, value)
    return CollectiveStep(kind, axes, MappingProxyType(dims), before.max_local_shape(mesh, value.shape),
                          after.max_local_shape(mesh, value.shape), size, program.price(kind, axes, size), before, after)


def _ordered(mesh: Mesh, axes: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted(axes, key=mesh.axis_index))


def _is_elementwise(instruction: Instruction) -> bool:
    """A LocalOp whose loops are all parallel and whose single result is indexed by them in order."""
    if not isinstance(instruction, LocalOp) or len(instruction.outputs) != 1:
        return False
    nest = instruction.op.nest
    out = nest.output_maps[0]
    return (all(t == PARALLEL for t in nest.iterator_types)
            and [e.single_loop() for e in out.results] == list(range(nest.num_loops)))


def _communicates(program: SpmdProgram, *kinds: str) -> Iterator[int]:
    for index, instruction in enumerate(program.body):
        if isinstance(instruction, Communicate) and instruction.step.kind in kinds:
            yield index


def _sole_user(program: SpmdProgram, value: Value) -> int | None:
    users = _users(program).get(value.id, [])
    return users[0] if len(users) == 1 and users[0] < len(program.body) else None


# --- drop_unused --------------------------------------------------------------------------

def _unused(program: SpmdProgram) -> Iterator[int]:
    users = _users(program)
    for index in _communicates(program, *STEP_KINDS):
        if not users.get(program.body[index].output.id):
            yield index


def _drop(program: SpmdProgram, index: int) -> tuple[SpmdProgram, str]:
    c = program.body[index]
    return _edit(program, {index}, {}), f"dropped unused {c.step.kind} of {c.input.tensor!r}"


# --- fold_all_reduce ----------------------------------------------------------------------

def _fold_sites(program: SpmdProgram) -> Iterator[int]:
    producers = _producers(program)
    for index in _communicates(program, "all_reduce"):
        first = producers.get(program.body[index].input.id)
        if first is not None and isinstance(program.body[first], Communicate) \
                and program.body[first].step.kind == "all_reduce" and _sole_user(program, program.body[first].output) == index:
            yield index


def _fold(program: SpmdProgram, index: int) -> tuple[SpmdProgram, str]:
    second = program.body[index]
    first_index = _producers(program)[second.input.id]
    first = program.body[first_index]
    axes = _ordered(program.mesh, first.step.mesh_axes + second.step.mesh_axes)
    step = reduction_step(program, first.input, "all_reduce", axes)
    folded = Communicate(step, first.input, second.output)
    return (_edit(program, {first_index, index}, {index: [folded]}),
            f"folded all_reduces of {second.input.tensor!r} over {list(first.step.mesh_axes)} and "
            f"{list(second.step.mesh_axes)} into one over {list(axes)}")


# --- reassociation ------------------------------------------------------------------------

def _reduced_pair(program: SpmdProgram, index: int, kind: str) -> tuple[int, int] | None:
    """The producers of the LocalOp's two inputs when both are `kind` collectives read only by it."""
    op = program.body[index]
    if not isinstance(op, LocalOp) or len(op.inputs) != 2 or op.inputs[0].id == op.inputs[1].id:
        return None
    producers = _producers(program)
    pair = []
    for value in op.inputs:
        p = producers.get(value.id)
        if p is None or not isinstance(program.body[p], Communicate) or program.body[p].step.kind != kind \
                or _sole_user(program, value) != index:
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


def _partial_op(program: SpmdProgram, ids: _Ids, op: LocalOp, option: ShardingOption, inputs: tuple[Value, ...],
                partial: Sharding) -> LocalOp:
    """`op` under `option` on partial `inputs`: its result carries their partial axes."""
    split = result_shardings(op.op.nest, option)[0]
    out = ids.value(op.outputs[0], Sharding(split.split_axes, partial.partial_axes, partial.partial_kind), program.mesh)
    return LocalOp(op.op, option, inputs, (out,))


def _reassociate_all_reduce(program: SpmdProgram, index: int) -> tuple[SpmdProgram, str]:
    op = program.body[index]
    first, second = _reduced_pair(program, index, "all_reduce")
    a = program.body[first]
    ids = _Ids(program)
    moved = _partial_op(program, ids, op, op.option, (a.input, program.body[second].input), a.input.sharding)
    step = reduction_step(program, moved.outputs[0], "all_reduce", _ordered(program.mesh, a.step.mesh_axes))
    return (_edit(program, {first, second, index}, {index: [moved, Communicate(step, moved.outputs[0], op.outputs[0])]}),
            f"{op.op.name} ({op.op.kind}) runs on the partial values; one all_reduce over {list(a.step.mesh_axes)} "
            f"replaces two")


def _reassociate_reduce_scatter_sites(program: SpmdProgram) -> Iterator[int]:
    for index, instruction in enumerate(program.body):
        pair = _reduced_pair(program, index, "reduce_scatter")
        if pair is None or not _is_elementwise(instruction):
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
    ids = _Ids(program)
    moved = _partial_op(program, ids, op, option, (a.input, program.body[second].input), a.input.sharding)
    step = reduction_step(program, moved.outputs[0], "reduce_scatter", axes, dim)
    if step.after != op.outputs[0].sharding:
        return None
    return (_edit(program, {first, second, index}, {index: [moved, Communicate(step, moved.outputs[0], op.outputs[0])]}),
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
    user = _sole_user(program, gather.output)
    if user is None or not _is_elementwise(program.body[user]):
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
    ids = _Ids(program)
    before: list[Instruction] = []
    inputs = []
    for value, need in zip(op.inputs, required):
        source = gather.input if value.id == gather.output.id else value
        steps, ready = _reshard(program, ids, source, need)
        before += steps
        inputs.append(ready)
    out = ids.value(op.outputs[0], result_shardings(op.op.nest, option)[0], program.mesh)
    moved = LocalOp(op.op, option, tuple(inputs), (out,))
    after, _ = _reshard(program, ids, out, op.outputs[0].sharding, last=op.outputs[0])
    substitute = {} if after else {op.outputs[0].id: out}
    edited = _edit(program, {index, user}, {user: before + [moved] + after}, substitute)
    return edited, f"all_gather over {list(axes)} of {gather.input.tensor!r} moved below {op.op.name} ({op.op.kind})"


def _move_down_sites(program: SpmdProgram) -> Iterator[int]:
    for index in _communicates(program, "all_gather"):
        user = _sole_user(program, program.body[index].output)
        if user is not None and _is_elementwise(program.body[user]):
            yield index


def _decompose_sites(program: SpmdProgram) -> Iterator[int]:
    for index in _communicates(program, "all_reduce"):
        user = _sole_user(program, program.body[index].output)
        if user is not None and _is_elementwise(program.body[user]):
            yield index


def _decompose(program: SpmdProgram, index: int) -> tuple[SpmdProgram, str] | None:
    """all_reduce -> reduce_scatter + all_gather along the dim that leaves the least to compute,
    with the all_gather moved below the elementwise op reading the result."""
    reduce = program.body[index]
    value, axes = reduce.input, reduce.step.mesh_axes
    op = program.body[_sole_user(program, reduce.output)]
    best: tuple[tuple[float, int], SpmdProgram, str] | None = None
    for dim in range(len(value.shape)):
        if _gathered_loop(op, reduce.output, dim) is None:
            continue
        try:
            scatter = reduction_step(program, value, "reduce_scatter", _ordered(program.mesh, axes), dim)
            if not _cut_exact(program.mesh, value, scatter.after, dim):
                continue
            ids = _Ids(program)
            scattered = ids.value(value, scatter.after, program.mesh)
            gathers, _ = _reshard(program, ids, scattered, reduce.output.sharding, last=reduce.output)
        except ShardingError:
            continue
        if [c.step.kind for c in gathers] != ["all_gather"]:
            continue
        split = _edit(program, {index}, {index: [Communicate(scatter, value, scattered)] + gathers})
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
    producers = _producers(program)
    for index in _communicates(program, *STEP_KINDS):
        first = producers.get(program.body[index].input.id)
        if first is not None and isinstance(program.body[first], Communicate) and \
                _sole_user(program, program.body[first].output) == index:
            yield index


def _merge(program: SpmdProgram, index: int) -> tuple[SpmdProgram, str] | None:
    second = program.body[index]
    first_index = _producers(program)[second.input.id]
    first = program.body[first_index]
    ids = _Ids(program)
    try:
        steps, _ = _reshard(program, ids, first.input, second.output.sharding, last=second.output)
    except ShardingError:
        return None
    kinds = " + ".join(c.step.kind for c in steps) or "nothing"
    what = f"{first.step.kind} + {second.step.kind} of {second.input.tensor!r} replanned as {kinds}"
    if not steps:
        return _edit(program, {first_index, index}, {}, {second.output.id: first.input}), what
    return _edit(program, {first_index, index}, {index: steps}), what


# --- the driver -----------------------------------------------------------------------------

REWRITES: tuple[Rewrite, ...] = (
    Rewrite("drop_unused", _unused, _drop),
    Rewrite("fold_all_reduce", _fold_sites, _fold),
    Rewrite("reassociate_all_reduce", _reassociate_all_reduce_sites, _reassociate_all_reduce),
    Rewrite("reassociate_reduce_scatter", _reassociate_reduce_scatter_sites, _reassociate_reduce_scatter),
    Rewrite("merge_reshardings", _chain_sites, _merge),
    Rewrite("decompose_all_reduce", _decompose_sites, _decompose),
    Rewrite("move_all_gather_down", _move_down_sites, _move_down),
)


def local_flops(program: SpmdProgram) -> float:
    """FLOPs one device computes: each op's FLOPs scaled to its largest block."""
    total = 0.0
    for op in program.local_ops():
        nest = op.op.nest
        share = math.prod(local_extents(nest, op.option, program.mesh)) / max(nest.points(), 1)
        total += op.op.flops() * share
    return total


def _better(new: SpmdProgram, old: SpmdProgram) -> bool:
    a, b = new.communication_seconds(), old.communication_seconds()
    if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-18):
        return local_flops(new) < local_flops(old) * (1 - 1e-12)
    return a < b


def optimize(program: SpmdProgram, rewrites: Sequence[Rewrite] = REWRITES,
             max_changes: int = 1000) -> tuple[SpmdProgram, list[Change]]:
    """Apply `rewrites` until none lowers the cost; returns the program and the changes made."""
    changes: list[Change] = []
    progress = True
    while progress and len(changes) < max_changes:
        progress = False
        for rule in rewrites:
            for site in rule.pattern(program):
                result = rule.rewrite(program, site)
                if result is None or not _better(result[0], program):
                    continue
                changes.append(Change(rule.name, result[1], program.communication_seconds(),
                                      result[0].communication_seconds()))
                program, progress = result[0], True
                break
            if progress:
                break
    return program, changes

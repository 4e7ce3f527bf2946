"""A plan in DTensor's vocabulary: per tensor one placement per mesh dim, and, where every linear
layer's option is a tensor-parallel style, the `parallelize_module` plan.

For mesh axis `a` (mesh dim `j`): `Partial(kind)` if the value is partial over `a`, `Shard(d)` if
`a` splits tensor dim `d`, else `Replicate()`. DTensor splits a dim sharded over several mesh dims
in mesh-dim order, which is our major-first order only when the axes appear in mesh order; any
other order has no public placement, so it is refused naming the tensor, never emitted wrong.

The string forms (`"Shard(1)"`) need no torch: `plan.json` carries them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoshard.errors import InputError, Problem
from autoshard.graph.model import Op
from autoshard.mesh import Mesh
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding

# Plan tensors a document of `dtensor_document` lists under "refused" rather than "tensors".
REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class PlacementSpec:
    """One mesh dim's placement: kind `shard` (with `dim`), `replicate` or `partial` (with `reduce_op`)."""

    kind: str
    dim: int = 0
    reduce_op: str = "sum"

    def __str__(self) -> str:
        if self.kind == "shard":
            return f"Shard({self.dim})"
        return f"Partial({self.reduce_op})" if self.kind == "partial" else "Replicate()"

    def to_torch(self) -> Any:
        from torch.distributed.tensor import Partial, Replicate, Shard
        if self.kind == "shard":
            return Shard(self.dim)
        return Partial(self.reduce_op) if self.kind == "partial" else Replicate()


def placement_specs(sharding: Sharding, mesh: Mesh, tensor: str) -> tuple[PlacementSpec, ...]:
    """One placement per mesh axis, in mesh order; an InputError naming `tensor` if DTensor has
    no public placement for the sharding."""
    if sharding.dims_offsets:
        raise InputError(f"tensor {tensor!r} has explicit uneven shard offsets {list(sharding.dims_offsets)}, "
                         "which DTensor cannot express (its shards follow torch.chunk)", f"/tensors/{tensor}")
    if sharding.has_halo:
        raise InputError(f"tensor {tensor!r} has halo_sizes {sharding.flat_halo_sizes()}, which DTensor cannot express "
                         "(its shards hold no neighbours' cells)", f"/tensors/{tensor}")
    dim_of = {a: d for d, axes in enumerate(sharding.split_axes) for a in axes}
    for d, axes in enumerate(sharding.split_axes):
        order = [mesh.axis_names.index(a) for a in axes]
        if order != sorted(order):
            raise InputError(f"tensor {tensor!r} splits dim {d} over mesh axes {list(axes)} (major first), against the "
                             f"mesh order {list(mesh.axis_names)}: DTensor shards a dim in mesh-dim order and has no "
                             "public placement for this one; plan with SolveSettings(mesh_order_splits=True) "
                             "(autoshard plan --mesh-order-splits), or pin the tensor", f"/tensors/{tensor}")
    specs = []
    for axis in mesh.axis_names:
        if axis in sharding.partial_axes:
            specs.append(PlacementSpec("partial", reduce_op=sharding.partial_kind))
        elif axis in dim_of:
            specs.append(PlacementSpec("shard", dim_of[axis]))
        else:
            specs.append(PlacementSpec("replicate"))
    return tuple(specs)


def tensor_placements(plan: Plan) -> dict[str, tuple[Any, ...]]:
    """Every tensor of the plan (parameters and inputs as stored, the others as produced) to its
    DTensor placements; an InputError names every tensor DTensor cannot express."""
    specs, problems = _all_specs(plan)
    if problems:
        raise InputError(problems)
    return {name: tuple(s.to_torch() for s in placements) for name, placements in specs.items()}


def dtensor_document(plan: Plan) -> dict[str, Any]:
    """The `dtensor` entry of plan.json: mesh dim names, placements per tensor as strings, the
    tensors refused with why, and the `parallelize_module` plan when there is one."""
    specs, problems = _all_specs(plan)
    document: dict[str, Any] = {
        "mesh_dim_names": list(plan.mesh.axis_names),
        "tensors": {name: [str(s) for s in placements] for name, placements in specs.items()},
    }
    if problems:
        document[REFUSED] = {p.where.removeprefix("/tensors/"): p.message for p in problems}
    styles = parallelize_plan(plan)
    if styles is not None:
        axis, layers = styles
        document["parallelize_module"] = {"mesh_dim": axis, "plan": {path: str(style) for path, style in layers.items()}}
    return document


def _all_specs(plan: Plan) -> tuple[dict[str, tuple[PlacementSpec, ...]], list[Problem]]:
    specs: dict[str, tuple[PlacementSpec, ...]] = {}
    problems: list[Problem] = []
    for name in plan.graph.tensors:
        try:
            specs[name] = placement_specs(plan.produced(name), plan.mesh, name)
        except InputError as error:
            problems.extend(error.problems)
    return specs, problems


# --- tensor-parallel styles ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LinearStyle:
    """`ColwiseParallel` or `RowwiseParallel` with its input and output layouts on one mesh dim."""

    style: str  # "colwise" or "rowwise"
    input_layout: PlacementSpec
    output_layout: PlacementSpec

    def __str__(self) -> str:
        name = "ColwiseParallel" if self.style == "colwise" else "RowwiseParallel"
        return f"{name}(input_layouts={self.input_layout}, output_layouts={self.output_layout})"

    def to_torch(self) -> Any:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
        style = ColwiseParallel if self.style == "colwise" else RowwiseParallel
        return style(input_layouts=self.input_layout.to_torch(), output_layouts=self.output_layout.to_torch())


def parallelize_plan(plan: Plan) -> tuple[str, dict[str, LinearStyle]] | None:
    """(mesh axis, module path -> style) when every linear layer (a `dot_general` over an
    nn.Linear weight [out, in]) is column- or row-parallel over one and the same mesh axis, with
    its weight replicated over every other axis; None when some layer matches no style."""
    linears = [op for op in plan.graph.ops if op.kind == "dot_general" and op.module
               and plan.graph.tensors[op.inputs[1]].role == "parameter"
               and op.attrs.get("rhs_contracting_dims") == [1] and not op.attrs.get("rhs_batch_dims")]
    if not linears:
        return None
    styles: dict[str, LinearStyle] = {}
    axes: set[str] = set()
    for op in linears:
        found = _linear_style(plan, op)
        if found is None:
            return None
        axis, style = found
        axes.add(axis)
        styles[op.module] = style
    return (axes.pop(), styles) if len(axes) == 1 else None


def _linear_style(plan: Plan, op: Op) -> tuple[str, LinearStyle] | None:
    weight = plan.storage.get(op.inputs[1], Sharding())
    used = [(d, axes) for d, axes in enumerate(weight.split_axes) if axes]
    if len(used) != 1 or len(used[0][1]) != 1:
        return None
    dim, (axis,) = used[0]
    x_rank = len(plan.graph.tensors[op.inputs[0]].shape)
    x = _on_axis(plan.required(op, 0), axis, x_rank)
    y = _on_axis(plan.produced(op.outputs[0]), axis, x_rank)
    if dim == 0 and y == PlacementSpec("shard", x_rank - 1):  # out features split: column-parallel
        return axis, LinearStyle("colwise", x, y)
    if dim == 1 and x == PlacementSpec("shard", x_rank - 1) and y.kind == "partial":  # in features split: row-parallel
        consumers = plan.graph.consumers[op.outputs[0]]
        after = [_on_axis(plan.required(c, c.inputs.index(op.outputs[0])), axis, x_rank) for c in consumers]
        if len(set(after)) != 1 or after[0].kind == "partial":
            return None
        return axis, LinearStyle("rowwise", x, after[0])
    return None


def _on_axis(sharding: Sharding, axis: str, rank: int) -> PlacementSpec:
    if axis in sharding.partial_axes:
        return PlacementSpec("partial", reduce_op=sharding.partial_kind)
    for d, axes in enumerate(sharding.split_axes):
        if axis in axes:
            return PlacementSpec("shard", d)
    return PlacementSpec("replicate")

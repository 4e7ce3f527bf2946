"""The frame shared by both emitters: header comments, the mesh symbol, one `func.func`, and
sharding annotations (`mesh.sharding` + `mesh.shard`) in either dialect spelling."""

from __future__ import annotations

import re
from typing import Sequence

from autoshard.mesh import Mesh
from autoshard.mlir.dialect import PARTIAL_AXES_ATTR, PARTIAL_TYPE_ATTR, Dialect
from autoshard.mlir.linalg import Operand
from autoshard.mlir.text import Body, int_list
from autoshard.sharding import Sharding

MESH_SYMBOL = "@mesh"


def axes_list(mesh: Mesh, axes: Sequence[str]) -> str:
    return int_list([mesh.axis_index(a) for a in axes])


def sharding_attrs(mesh: Mesh, sharding: Sharding, shape: Sequence[int], with_partial: bool) -> str:
    """`split_axes = [[0], []] partial = sum[1] halo_sizes = [..] sharded_dims_offsets = [...]` (mesh axes by
    index; halos and offsets are exclusive)."""
    split = ", ".join(axes_list(mesh, axes) for axes in sharding.split_axes) or "[]"
    text = f"split_axes = [{split}]"
    if with_partial and sharding.partial_axes:
        text += f" partial = {sharding.partial_kind}{axes_list(mesh, sharding.partial_axes)}"
    if sharding.halo_sizes:
        text += f" halo_sizes = {int_list(sharding.flat_halo_sizes())}"
    if sharding.dims_offsets:
        # The reference wants offsets for every split dim, in dim order.
        flat = []
        for dim, size in enumerate(shape):
            if sharding.dim_axes(dim):
                bounds = sharding.dim_bounds(mesh, size, dim)
                flat += [start for start, _ in bounds] + [bounds[-1][1]]
        text += f" sharded_dims_offsets = {int_list(flat)}"
    return text


class Annotations:
    """Emits `sharding` ops once per distinct sharding and `shard` ops on values."""

    def __init__(self, b: Body, dialect: Dialect, mesh: Mesh):
        self.b, self.dialect, self.mesh = b, dialect, mesh
        self.shardings: dict[str, str] = {}

    def sharding(self, sharding: Sharding, shape: Sequence[int]) -> str:
        attrs = sharding_attrs(self.mesh, sharding, shape, self.dialect.partial_in_sharding)
        if attrs not in self.shardings:
            name = self.b.name("sharding")
            self.b.emit(f"{name} = {self.dialect.sharding_op} {MESH_SYMBOL} {attrs} : {self.dialect.sharding_type}")
            self.shardings[attrs] = name
        return self.shardings[attrs]

    def annotate(self, value: Operand, sharding: Sharding, for_users: bool, hint: str) -> Operand:
        handle = self.sharding(sharding, value.shape)
        extra = ""
        if sharding.partial_axes and not self.dialect.partial_in_sharding:
            axes = ", ".join(str(self.mesh.axis_index(a)) for a in sharding.partial_axes)
            extra = (f" {{{PARTIAL_AXES_ATTR} = array<i16: {axes}>, "
                     f"{PARTIAL_TYPE_ATTR} = #{self.dialect.prefix}<partial {sharding.partial_kind}>}}")
        name = self.b.name(hint)
        users = " annotate_for_users" if for_users else ""
        self.b.emit(f"{name} = {self.dialect.shard_op} {value.name} to {handle}{users}{extra} : {value.type}")
        return Operand(name, value.spec)


def mesh_comment(mesh: Mesh) -> str:
    return "mesh axes: " + ", ".join(f"{i} = {n} (size {s})" for i, (n, s) in enumerate(zip(mesh.axis_names, mesh.shape)))


def function_name(graph_name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", graph_name) or "graph"
    return name if not name[0].isdigit() else "g" + name


def function_lines(func: str, args: Sequence[Operand], results: Sequence[Operand], body: Body) -> list[str]:
    """One `func.func @func` returning `results`, its body's lines inside."""
    signature = ", ".join(f"{a.name}: {a.type}" for a in args)
    types = [r.type for r in results]
    returns = types[0] if len(types) == 1 else "(" + ", ".join(types) + ")"
    lines = [f"func.func @{func}({signature}) -> {returns} {{", *body.lines]
    lines.append(f"  return {', '.join(r.name for r in results)} : {', '.join(types)}" if results else "  return")
    lines.append("}")
    return lines


def module_text(dialect: Dialect, mesh: Mesh, comments: Sequence[str], func: str, args: Sequence[Operand],
                results: Sequence[Operand], body: Body) -> str:
    lines = [f"// {c}" for c in comments]
    lines.append(f"{dialect.mesh_op} {MESH_SYMBOL}(shape = {mesh.to_mlir_shape()})")
    lines += function_lines(func, args, results, body)
    return "\n".join(lines) + "\n"

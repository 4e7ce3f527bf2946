"""SSA values about the device running the partitioned program: its coordinates, its in-group
index over some mesh axes, and where its block of a split loop or tensor dim starts and how long
it is (the reference's ceildiv pieces, or explicit `sharded_dims_offsets`). Each is computed once,
at its first use, at the top level of the function."""

from __future__ import annotations

from typing import Sequence

from autoshard.mesh import Mesh
from autoshard.mlir.dialect import Dialect
from autoshard.mlir.module import MESH_SYMBOL, axes_list
from autoshard.mlir.text import Body, int_list
from autoshard.sharding import Sharding, ceildiv


class DeviceIndex:
    def __init__(self, b: Body, dialect: Dialect, mesh: Mesh):
        self.b, self.dialect, self.mesh = b, dialect, mesh
        self.cache: dict[tuple, str] = {}

    def _once(self, key: tuple, hint: str, text: str) -> str:
        if key not in self.cache:
            name = self.b.name(hint)
            self.b.emit(f"{name} = {text}")
            self.cache[key] = name
        return self.cache[key]

    def const(self, value: int) -> str:
        return self._once(("const", value), f"c{value}", f"arith.constant {value} : index")

    def coordinate(self, axis: str) -> str:
        """The device's coordinate along `axis`."""
        n = len(self.mesh.shape)
        if ("device",) not in self.cache:
            name = self.b.name("device")
            self.b.emit(f"{name}{f':{n}' if n > 1 else ''} = {self.dialect.op('process_multi_index')} on {MESH_SYMBOL} "
                        f"axes = {axes_list(self.mesh, self.mesh.axis_names)} : {', '.join(['index'] * n)}")
            self.cache["device",] = name
        device = self.cache["device",]
        return device if n == 1 else f"{device}#{self.mesh.axis_index(axis)}"

    def linear(self) -> str:
        return self._once(("linear",), "linear", f"{self.dialect.op('process_linear_index')} on {MESH_SYMBOL} : index")

    def _arith(self, op: str, a: str, b: str, hint: str) -> str:
        return self._once((op, a, b), hint, f"arith.{op} {a}, {b} : index")

    def in_group(self, axes: Sequence[str]) -> str:
        """The device's position in its group over `axes` (first axis major)."""
        position = self.coordinate(axes[0])
        for axis in axes[1:]:
            scaled = self._arith("muli", position, self.const(self.mesh.axis_size(axis)), "pos")
            position = self._arith("addi", scaled, self.coordinate(axis), "pos")
        return position

    def block_start(self, axes: Sequence[str], extent: int) -> str:
        """First index of the device's ceildiv piece of `[0, extent)` split over `axes`."""
        step = ceildiv(extent, self.mesh.group_size(axes))
        start = self._arith("muli", self.in_group(axes), self.const(step), "start")
        return self._arith("minui", start, self.const(extent), "start")

    def ring_block_start(self, axis: str, step: int, block: int) -> str:
        """First index of the block a device holds at `step` of a ring over `axis` (blocks of
        `block` indices passed one place along the axis per step): block (c - step) mod n."""
        n = self.mesh.axis_size(axis)
        held = self._arith("addi", self.coordinate(axis), self.const(n - step), "ring")
        return self._arith("muli", self._arith("remui", held, self.const(n), "ring"), self.const(block), "ring_start")

    def block_size(self, axes: Sequence[str], extent: int) -> str:
        step = ceildiv(extent, self.mesh.group_size(axes))
        start = self.block_start(axes, extent)
        stop = self._arith("minui", self._arith("addi", start, self.const(step), "stop"), self.const(extent), "stop")
        return self._arith("subi", stop, start, "size")

    def shard_start(self, sharding: Sharding, shape: Sequence[int], dim: int) -> str:
        """Where the device's shard of `dim` under `sharding` starts (explicit offsets via a table)."""
        axes = sharding.dim_axes(dim)
        offsets = sharding.dims_offsets[dim] if dim < len(sharding.dims_offsets) else ()
        if not offsets:
            return self.block_start(axes, shape[dim])
        return self._offset(offsets, self.in_group(axes))

    def shard_size(self, sharding: Sharding, shape: Sequence[int], dim: int) -> str:
        axes = sharding.dim_axes(dim)
        offsets = sharding.dims_offsets[dim] if dim < len(sharding.dims_offsets) else ()
        if not offsets:
            return self.block_size(axes, shape[dim])
        k = self.in_group(axes)
        stop = self._offset(offsets, self._arith("addi", k, self.const(1), "next"))
        return self._arith("subi", stop, self._offset(offsets, k), "size")

    def _offset(self, offsets: tuple[int, ...], index: str) -> str:
        kind = f"tensor<{len(offsets)}xindex>"
        table = self._once(("offsets", offsets), "offsets", f"arith.constant dense<{int_list(offsets)}> : {kind}")
        return self._once(("extract", table, index), "offset", f"tensor.extract {table}[{index}] : {kind}")

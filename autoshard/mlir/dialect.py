"""The two spellings of the sharding dialect, in one table.

`mesh` is the seed reference's spelling (the `mesh` dialect of LLVM 19-21); `shard` is
upstream LLVM 22's rename of the same dialect. The emitters print every sharding word through
a `Dialect`, so the two outputs differ exactly in these words and in how partial values are
written (the `shard` dialect has no partial shardings).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoshard.errors import InputError


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    mesh_op: str  # the symbol op declaring the device mesh
    sharding_op: str
    sharding_type: str
    shard_op: str
    axes_attr: str  # the device-group attribute of collectives
    prefix: str  # of collectives and process-index ops
    reduction_format: str  # how a reduction kind is written after `reduction =`
    partial_in_sharding: bool  # True: `partial = sum[1]` in the sharding op; False: see PARTIAL_NOTE

    def op(self, name: str) -> str:
        return f"{self.prefix}.{name}"

    def reduction(self, kind: str) -> str:
        return self.reduction_format.format(kind)


MESH = Dialect("mesh", "mesh.mesh", "mesh.sharding", "!mesh.sharding", "mesh.shard", "mesh_axes", "mesh",
               "<{}>", True)
SHARD = Dialect("shard", "shard.grid", "shard.sharding", "!shard.sharding", "shard.shard", "grid_axes", "shard",
                "{}", False)
DIALECTS = {d.name: d for d in (MESH, SHARD)}

# Attributes carrying a partial value's reduction on its `shard.shard` op in the `shard` spelling.
PARTIAL_TYPE_ATTR = "autoshard.partial_type"
PARTIAL_AXES_ATTR = "autoshard.partial_axes"
PARTIAL_NOTE = (f"partial values: the shard dialect has no partial shardings, so a partial value is annotated with its "
                f"split axes and its reduction rides on the shard op as {PARTIAL_AXES_ATTR} (mesh axes) and "
                f"{PARTIAL_TYPE_ATTR} (kind); upstream passes ignore them")


def dialect(name: str) -> Dialect:
    try:
        return DIALECTS[name]
    except KeyError:
        raise InputError(f"unknown dialect {name!r}; expected one of {sorted(DIALECTS)}", "dialect") from None

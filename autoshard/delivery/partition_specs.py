"""A plan's shardings in the `PartitionSpec` vocabulary of JAX (and of XLA's named shardings):
per tensor dim the mesh axis splitting it, a list of axes (major first) or null, trailing nulls
dropped, as `P(("dp", "tp"), None)` reads. Kept as plain JSON in `plan.json`, so a user can read
them without autoshard; `autoshard.frontends.jax` turns them into `PartitionSpec`s.

A spec cannot say a value is partial (outside `shard_map` and JAX's explicit mode, a partial sum
exists only inside XLA's partitioner) nor give shard offsets other than the even split; those
values get no spec and a reason. A jit argument or result must also divide evenly.
"""

from __future__ import annotations

from typing import Any

from autoshard.mesh import Mesh
from autoshard.planning.plan import Plan
from autoshard.planning.report import PlanShardings
from autoshard.sharding import Sharding

Spec = list[str | list[str] | None]


def partition_spec(sharding: Sharding) -> Spec:
    """`[["dp", "tp"], [], ["x"]]` -> `[["dp", "tp"], None, "x"]` (the split axes only)."""
    return [None if not axes else axes[0] if len(axes) == 1 else list(axes) for axes in sharding.split_axes]


def spec_problem(sharding: Sharding, mesh: Mesh, shape: tuple[int, ...], boundary: bool) -> str | None:
    """Why `sharding` has no spec (None when it has one); `boundary`: a jit argument or result."""
    if sharding.is_partial:
        return (f"partial ({sharding.partial_kind}) over {list(sharding.partial_axes)}: a PartitionSpec cannot say so; "
                "XLA reduces it where a consumer's spec asks")
    if sharding.dims_offsets:
        return "explicit sharded_dims_offsets: a PartitionSpec only splits evenly (ceildiv)"
    if sharding.has_halo:
        return f"halo_sizes {sharding.flat_halo_sizes()}: a PartitionSpec's shards hold no neighbours' cells"
    if boundary:
        uneven = [f"dim {d} of size {shape[d]} over {sharding.shard_count(mesh, d)}" for d in range(len(shape))
                  if shape[d] % sharding.shard_count(mesh, d)]
        if uneven:
            return f"uneven ({', '.join(uneven)}): jit arguments and results must divide evenly"
    return None


def plan_partition_specs(plan: Plan) -> dict[str, Any]:
    """`inputs` (graph inputs and parameters, as stored), `outputs` (as delivered) and
    `intermediates` (as produced: the spec to constrain each to), tensor name -> spec; `not_expressible`:
    tensor name -> why it has no spec."""
    graph, mesh = plan.graph, plan.mesh
    produced = PlanShardings.of(plan).produced  # derived once per op, not once per value
    specs: dict[str, Any] = {"inputs": {}, "outputs": {}, "intermediates": {}, "not_expressible": {}}
    entries = [("inputs", t.name, plan.storage[t.name]) for t in graph.tensors.values() if t.role != "intermediate"]
    entries += [("outputs", t, plan.final(t)) for t in graph.outputs]
    entries += [("intermediates", t, produced[t]) for t in graph.producers]
    for group, name, sharding in entries:
        problem = spec_problem(sharding, mesh, graph.tensors[name].shape, group != "intermediates")
        if problem is None:
            specs[group][name] = partition_spec(sharding)
        else:
            specs["not_expressible"][f"{group}/{name}"] = problem
    return specs

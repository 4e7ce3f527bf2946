"""Execute a planned resharding on device contents with the collectives: the executable truth
of every plan the resharding planner returns."""

from __future__ import annotations

from autoshard.mesh import Mesh
from autoshard.resharding import CollectiveStep, Resharding
from autoshard.sim import collectives as c
from autoshard.sim.collectives import Shards


def apply_step(shards: Shards, mesh: Mesh, shape: tuple[int, ...], step: CollectiveStep) -> Shards:
    axes, dims = step.mesh_axes, step.dims
    if step.kind == "all_gather":
        return c.all_gather(shards, mesh, axes, dims["gather_axis"])
    if step.kind == "all_slice":
        return c.all_slice(shards, mesh, axes, dims["slice_axis"])
    if step.kind == "all_to_all":
        return c.all_to_all(shards, mesh, axes, dims["split_axis"], dims["concat_axis"])
    if step.kind == "all_reduce":
        return c.all_reduce(shards, mesh, axes, dims["reduction"])
    if step.kind == "reduce_scatter":
        return c.reduce_scatter(shards, mesh, axes, dims["scatter_axis"], dims["reduction"])
    if step.kind == "permute":
        out_shapes = {d: step.after.local_shape(mesh, shape, d) for d in mesh.devices()}
        return c.permute(shards, dims["transfers"], out_shapes)
    raise ValueError(f"unknown resharding step kind {step.kind!r}")


def apply_resharding(shards: Shards, mesh: Mesh, resharding: Resharding) -> Shards:
    for step in resharding.steps:
        shards = apply_step(shards, mesh, resharding.shape, step)
    return shards

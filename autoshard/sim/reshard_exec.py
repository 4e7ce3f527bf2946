"""Execute a planned resharding on device contents with the collectives: the executable truth
of every plan the resharding planner returns."""

from __future__ import annotations

from typing import Callable

from autoshard.mesh import Mesh
from autoshard.resharding import CollectiveStep, Resharding, step_kind
from autoshard.sim import collectives as c
from autoshard.sim.collectives import Shards
from autoshard.sim.halo import update_halo


def _collective(fn: Callable[..., Shards]) -> Callable[[Shards, Mesh, tuple[int, ...], CollectiveStep], Shards]:
    """A step run by the collective of its kind, its `dims` passed as the keyword arguments."""
    return lambda shards, mesh, shape, step: fn(shards, mesh, step.mesh_axes, **step.dims)


def _permute(shards: Shards, mesh: Mesh, shape: tuple[int, ...], step: CollectiveStep) -> Shards:
    out_shapes = {d: step.after.local_shape(mesh, shape, d) for d in mesh.devices()}
    return c.permute(shards, step.dims["transfers"], out_shapes)


def _update_halo(shards: Shards, mesh: Mesh, shape: tuple[int, ...], step: CollectiveStep) -> Shards:
    return update_halo(shards, mesh, shape, step.before, step.after)


# How each kind of `autoshard.resharding.STEP_KINDS` runs.
STEP_RUNNERS: dict[str, Callable[[Shards, Mesh, tuple[int, ...], CollectiveStep], Shards]] = {
    "all_gather": _collective(c.all_gather),
    "all_slice": _collective(c.all_slice),
    "all_to_all": _collective(c.all_to_all),
    "all_reduce": _collective(c.all_reduce),
    "reduce_scatter": _collective(c.reduce_scatter),
    "permute": _permute,
    "update_halo": _update_halo,
}


def apply_step(shards: Shards, mesh: Mesh, shape: tuple[int, ...], step: CollectiveStep) -> Shards:
    return STEP_RUNNERS[step_kind(step.kind).name](shards, mesh, shape, step)


def apply_resharding(shards: Shards, mesh: Mesh, resharding: Resharding) -> Shards:
    for step in resharding.steps:
        shards = apply_step(shards, mesh, resharding.shape, step)
    return shards

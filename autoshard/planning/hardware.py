"""Bind a mesh to a hardware topology profile, with cost_models' errors turned into input errors."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import cost_models
from autoshard.errors import InputError, Problem
from autoshard.mesh import Mesh


def bind_hardware(topology: str | Mapping[str, Any], mesh: Mesh, *, nodes: int | None = None,
                  slice_shape: Sequence[int] | None = None,
                  mapping: Mapping[str, Any] | None = None) -> "cost_models.BoundTopology":
    """`topology` is a profile name (`autoshard topologies`), a profile file path, or a profile object."""
    try:
        profile = cost_models.load_profile(topology)
        return cost_models.bind(profile, mesh.axis_names, mesh.shape, nodes=nodes, slice_shape=slice_shape,
                                mapping=mapping)
    except cost_models.TopologyError as error:
        raise InputError([Problem(f"topology/{field}" if field else "topology", message)
                          for field, message in error.problems]) from None

"""PyTorch: a `torch.export` program in as an `autoshard.graph/v1` graph, a plan back out as DTensor
placements, and the program run under DTensor as the plan says.

    ep = torch.export.export(module, args)                 # plain or .run_decompositions({}): one canonical form
    imported = import_program(ep)                          # .graph (a document), .warnings, .opaque
    routed = import_program(ep, expert_capacity=ExpertCapacity(1.25))  # MoE experts routed, not dense
    ...plan imported.graph with autoshard.make_plan...
    placements = tensor_placements(plan)                   # tensor name -> (Shard(1), Replicate())
    sharded = parallelize(ep, plan, device_mesh)           # a module running the plan on DTensors
    run = pipeline(ep, pipelined_plan)                     # this rank's stages and the plan's schedule

torch is imported only when one of these is called; without it they raise an `InputError` naming
the extra to install (`autoshard[torch]`).

May import: everything below it (`graph`, `models`, `planning`, `delivery` and what they import).
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module that defines it; loaded on first use, so that importing the package does not
# import torch. The placements are plain data every plan document carries, so they live in
# `autoshard.delivery`.
_NAMES = {
    "import_program": f"{__name__}.importer",
    "ImportedProgram": f"{__name__}.importer",
    "ExpertCapacity": f"{__name__}.capacity",
    "export_factory": f"{__name__}.factory",
    "tensor_placements": "autoshard.delivery.dtensor_placements",
    "parallelize_plan": "autoshard.delivery.dtensor_placements",
    "parallelize": f"{__name__}.apply",
    "pipeline": f"{__name__}.pipelining",
    "PipelineRun": f"{__name__}.pipelining",
}
__all__ = list(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_NAMES[name]), name)
    globals()[name] = value
    return value

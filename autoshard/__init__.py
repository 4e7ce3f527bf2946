"""autoshard: plans how every tensor and op of a model is split across a device mesh.

The front door: the few names a user needs, importable from here.

    import autoshard

    mesh = autoshard.Mesh.parse("dp=2,tp=4")
    graph = autoshard.load_graph("examples/mlp.json", mesh)
    hardware = autoshard.bind_hardware("dgx-h100", mesh)
    result = autoshard.make_plan(graph, mesh, hardware, autoshard.SolveSettings(time_limit_s=10))
    delivered = autoshard.deliver(result, hardware, "dgx-h100", emit=["partitioned"])

They are loaded on first use, so `import autoshard.mesh` (or the CLI's `validate`) does not pay
for the solver's and the simulator's imports. The package map is in the README.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module that defines it
_FRONT_DOOR = {
    "Mesh": "autoshard.mesh",
    "Sharding": "autoshard.sharding",
    "load_graph": "autoshard.graph.schema",
    "bind_hardware": "autoshard.planning.hardware",
    "SolveSettings": "autoshard.planning.make_plan",
    "make_plan": "autoshard.planning.make_plan",
    "plan_layer_once": "autoshard.planning.compose",
    "Weights": "autoshard.planning.formulation",
    "estimate": "autoshard.planning.report",
    "deliver": "autoshard.delivery.deliver",
    "verify_plan": "autoshard.sim.program",
    "read_plan": "autoshard.planning.plan_contract",
}
__all__ = ["__version__", "Mesh", "Sharding", "load_graph", "bind_hardware", "SolveSettings", "make_plan",
           "plan_layer_once", "Weights", "estimate", "deliver", "verify_plan", "read_plan"]  # the names of _FRONT_DOOR

if TYPE_CHECKING:
    from autoshard.delivery.deliver import deliver
    from autoshard.graph.schema import load_graph
    from autoshard.mesh import Mesh
    from autoshard.planning.compose import plan_layer_once
    from autoshard.planning.formulation import Weights
    from autoshard.planning.hardware import bind_hardware
    from autoshard.planning.make_plan import SolveSettings, make_plan
    from autoshard.planning.plan_contract import read_plan
    from autoshard.planning.report import estimate
    from autoshard.sharding import Sharding
    from autoshard.sim.program import verify_plan


def __getattr__(name: str) -> Any:
    if name not in _FRONT_DOOR:
        raise AttributeError(f"module 'autoshard' has no attribute {name!r}")
    value = getattr(importlib.import_module(_FRONT_DOOR[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

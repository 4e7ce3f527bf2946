"""The plan file `autoshard.plan/v1`: the plan, what it costs, and how it was found."""

from __future__ import annotations

from typing import Any

from autoshard import __version__
from autoshard.delivery.dtensor_placements import dtensor_document
from autoshard.delivery.partition_specs import plan_partition_specs
from autoshard.planning.make_plan import PlanResult
from autoshard.planning.plan import plan_to_json
from autoshard.planning.roles import plan_roles, roles_document


def plan_document(result: PlanResult, topology: str) -> dict[str, Any]:
    """Per-op options and per-tensor shardings (read back by `plan_contract.read_plan`), plus per-edge
    reshardings, totals, a per-op breakdown, the solver's status, objective, bound and gap, the
    roles of the mesh axes and tensors (`roles`; per op its `class` and `axis_roles`), and the
    shardings as PartitionSpecs (`partition_specs`) and as DTensor placements (`dtensor`)."""
    report = result.report.to_json()
    document = plan_to_json(result.plan)
    document["autoshard_version"] = __version__
    document["graph"] = result.plan.graph.name
    document["topology"] = topology
    for entry in report["ops"]:
        document["ops"][entry["op"]].update({k: v for k, v in entry.items() if k not in ("op", "kind", "option")})
    for op in result.plan.graph.ops:
        if op.module:  # where an imported op came from, so that reports can group ops by layer
            document["ops"][op.name]["module"] = op.module
    roles = plan_roles(result.plan)
    for name, entry in document["ops"].items():
        entry["class"] = roles.classes[name]
        entry["axis_roles"] = dict(roles.ops[name])
    document["reshardings"] = report["reshardings"]
    document["totals"] = report["totals"]
    document["roles"] = roles_document(result.plan, roles)
    document["solver"] = result.solver
    if result.microbatching is not None:
        document["microbatches"] = result.microbatching.count
    document["partition_specs"] = plan_partition_specs(result.plan)
    document["dtensor"] = dtensor_document(result.plan)
    return document


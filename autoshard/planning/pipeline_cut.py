"""Where a pipelined plan runs each op: its virtual stage, and the schedule's orders.

This is what executing or emitting a pipelined plan needs and all it needs: the seconds, the
memory and the timeline are the planner's prices. `PipelinedPlan.cut` gives it for a plan just
made; `read_cut` reads it back from plan.json's `pipeline` section (stages, their chunks' ops
and virtual stages, the schedule, M and V), every problem named by its JSON pointer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from autoshard.errors import InputError, Problem
from autoshard.graph.model import Graph
from autoshard.pipeline import StageOrders, stage_orders

# The schedule's parameters as plan.json names them
_FIELD = {"stages": "stage_count", "chunks": "virtual_stages_per_stage"}


@dataclass(frozen=True)
class PipelineCut:
    orders: StageOrders
    part_of: Mapping[str, int]  # op name -> virtual stage (chunk c of stage s is c * S + s)

    def stage_of(self, op: str) -> int:
        return self.orders.placement(self.part_of[op])[0]


def read_cut(document: Mapping[str, Any], graph: Graph) -> PipelineCut:
    """The cut of plan.json's `pipeline` section for `graph` (the step on one microbatch)."""
    section = document.get("pipeline")
    if not isinstance(section, dict):
        raise InputError("expected an object with the stages, schedule and microbatches", "/pipeline")
    try:
        orders = stage_orders(section.get("schedule"), section.get("stage_count"), section.get("microbatches"),
                              section.get("virtual_stages_per_stage", 1))
    except InputError as error:
        raise InputError([Problem(f"/pipeline/{_FIELD.get(p.where, p.where)}", p.message) for p in error.problems]) from None
    if orders.microbatches != document.get("microbatches", 1):
        raise InputError(f"{orders.microbatches} microbatches, but the plan is made for "
                         f"{document.get('microbatches', 1)}", "/pipeline/microbatches")
    part_of: dict[str, int] = {}
    problems: list[Problem] = []
    stages = section.get("stages")
    if not isinstance(stages, list) or len(stages) != orders.stages:
        raise InputError(f"expected a list of {orders.stages} stages", "/pipeline/stages")
    for s, stage in enumerate(stages):
        chunks = stage.get("chunks") if isinstance(stage, dict) else None
        if not isinstance(chunks, list) or len(chunks) != orders.chunks:
            problems.append(Problem(f"/pipeline/stages/{s}/chunks", f"expected a list of {orders.chunks} chunks"))
            continue
        for c, chunk in enumerate(chunks):
            where = f"/pipeline/stages/{s}/chunks/{c}"
            virtual = orders.virtual_stage(s, c)
            if not isinstance(chunk, dict) or chunk.get("virtual_stage") != virtual:
                problems.append(Problem(f"{where}/virtual_stage", f"chunk {c} of stage {s} is virtual stage {virtual}"))
                continue
            for op in chunk.get("ops") if isinstance(chunk.get("ops"), list) else []:
                if op not in graph.op_by_name:
                    problems.append(Problem(f"{where}/ops", f"graph {graph.name!r} has no op {op!r}"))
                elif op in part_of:
                    problems.append(Problem(f"{where}/ops", f"op {op!r} is also on virtual stage {part_of[op]}"))
                else:
                    part_of[op] = virtual
    missing = [op.name for op in graph.ops if op.name not in part_of]
    if missing and not problems:
        problems.append(Problem("/pipeline/stages", f"no stage runs op(s) {', '.join(map(repr, missing[:5]))}"))
    if problems:
        raise InputError(problems)
    return PipelineCut(orders, part_of)

"""`/v1/validate`: check a graph (and optionally a plan for it) without planning."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from autoshard.errors import InputError
from autoshard.graph.recompute import stated_recompute, with_recomputation
from autoshard.graph.summary import graph_summary
from autoshard.planning.plan_contract import read_plan
from service import deps
from service.config import Settings
from service.inputs import parse_graph, parse_mesh, under
from service.routes import INPUT_ERRORS
from service.schemas import Validation, ValidateRequest

router = APIRouter(prefix="/v1/validate", tags=["validate"])


@router.post("", response_model=Validation, responses=INPUT_ERRORS)
def validate(body: ValidateRequest, settings: Settings = Depends(deps.settings)) -> Validation:
    """200 with a summary when valid; 422 with every problem (the CLI's `validate` messages) otherwise."""
    mesh_value = body.model_dump(mode="json")["mesh"]
    if "plan" in body.model_fields_set and mesh_value is None:  # as the schema's dependentRequired says
        raise InputError("checking a plan needs the mesh it is for", "/mesh")
    mesh = parse_mesh(mesh_value, settings.max_devices) if mesh_value is not None else None
    graph = parse_graph(body.graph, mesh, settings)
    if body.plan is not None and mesh is not None:
        try:  # against the graph the plan was made for, with the recomputation it records
            read_plan(body.plan, with_recomputation(graph, stated_recompute(body.plan), mesh), mesh)
        except InputError as error:
            raise under("/plan", error) from None
    return Validation(summary=graph_summary(graph), ops=len(graph.ops), tensors=len(graph.tensors),
                      plan_checked=body.plan is not None)

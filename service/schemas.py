"""Wire models of the REST API: what requests carry and responses return.

They describe JSON only; routes turn them into library types (`Mesh`, `Graph`, `Plan`, ...)
through `service.inputs`, so nothing past the HTTP boundary sees a pydantic model.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from autoshard.graph.schema import graph_json_schema
from autoshard.planning.formulation import WEIGHT_UNITS, weight_name_problem
from autoshard.planning.formulation import Weights as ObjectiveWeights
from autoshard.planning.make_plan import MAX_MEMORY_BUDGET_BYTES, MAX_SEED

JobStatus = Literal["queued", "solving", "done", "failed", "cancelled", "interrupted"]
Stage = Literal["annotated", "partitioned"]
Dialect = Literal["mesh", "shard"]
VerifyPolicy = Literal["auto", "always", "never"]
Recompute = Literal["none", "selective", "full", "routed"]


# Read as plain JSON: `graph_from_json` reports every problem with the CLI's own pointers.
GraphDocument = Annotated[dict[str, Any], WithJsonSchema(graph_json_schema())]


class _Wire(BaseModel):
    # Python's JSON reader takes NaN, Infinity and 1e999; no option means anything with them.
    # strict: `true` is not a number nor "yes" a boolean, as the CLI refuses them
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class MeshAxis(_Wire):
    name: str
    size: int = Field(ge=1)


class MeshSpec(_Wire):
    axes: list[MeshAxis] = Field(min_length=1)


MeshField = Field(description='mesh axes in order: "dp=2,tp=4" or {"axes": [{"name": "dp", "size": 2}, ...]}',
                  examples=["dp=2,tp=4"])
TopologyField = Field("dgx-h100", description="a profile name (GET /v1/topologies) or a profile object",
                      examples=["dgx-h100"])


class TopologyOptions(_Wire):
    nodes: int | None = Field(None, ge=1, description="number of GPU nodes (GPU profiles)")
    slice: list[int] | str | None = Field(None, description='TPU slice shape: [4, 4, 4] or "4x4x4"')


class Weights(_Wire):
    """Objective weights, each in seconds of objective per unit of what it weighs: the solver minimises
    time * step seconds + comm_s_per_byte * bytes communicated + memory_s_per_byte * bytes held."""

    time: float = Field(1.0, ge=0, description=WEIGHT_UNITS["time"] + " (dimensionless)")
    comm_s_per_byte: float = Field(0.0, ge=0, description=WEIGHT_UNITS["comm_s_per_byte"],
                                   examples=[1e-11])
    memory_s_per_byte: float = Field(0.0, ge=0, description=WEIGHT_UNITS["memory_s_per_byte"] +
                                     ", summed over every value of the step (not the peak)")

    @model_validator(mode="before")
    @classmethod
    def _known_names(cls, data: Any) -> Any:
        """A renamed or unknown weight is a problem at its own field, saying what the weights are."""
        if not isinstance(data, dict):
            return data
        wrong = [(name, value, weight_name_problem(name)) for name, value in data.items() if isinstance(name, str)]
        details = [InitErrorDetails(type=PydanticCustomError("weight_name", "{message}", {"message": message}),
                                    loc=(name,), input=value)
                   for name, value, message in wrong if message is not None]
        if details:
            raise ValidationError.from_exception_data(cls.__name__, details)
        return data

    @model_validator(mode="after")
    def _some_weight(self) -> "Weights":
        problem = ObjectiveWeights(self.time, self.comm_s_per_byte, self.memory_s_per_byte).problem()
        if problem is not None:
            raise ValueError(problem)
        return self


class PipelineOptions(_Wire):
    stages: int = Field(ge=1, description="cut the layers into this many pipeline stages, each on its own sub-mesh "
                                          "with the request's mesh axes (the stages multiply the devices); needs ops "
                                          "with a `layer` (as `--pipeline S`)")
    schedule: str = Field("1f1b", description="gpipe, 1f1b, interleaved:V (V virtual stages per device; "
                                              "microbatches a multiple of the stages) or zb-h1")


class PlanOptions(_Wire):
    time_limit_s: float | None = Field(None, gt=0, description="solver time limit (default and cap: server settings)")
    gap_limit: float = Field(1e-4, ge=0, lt=1, description="stop once (cost - bound) / cost is at most this; "
                                                           "0: prove optimality or use the whole time limit")
    memory_budget_bytes: float | None = Field(None, gt=0, le=MAX_MEMORY_BUDGET_BYTES,
                                              description="per-device memory limit (default: the chip's HBM)")
    weights: Weights = Field(default_factory=Weights, description="objective weights, each in seconds of objective "
                                                                    "per unit it weighs (default: step time only)")
    emit: list[Stage] = Field(default_factory=list, description="IR to emit with the plan")
    dialect: Dialect = "mesh"
    verify: VerifyPolicy = Field("auto", description="simulate the partitioned plan against the unsharded graph: "
                                                     "auto (plans small enough to simulate in seconds), always, never; "
                                                     "the verdict is the plan's `verification`")
    workers: int | None = Field(None, ge=1, description="solver threads (default and cap: server settings)")
    seed: int = Field(0, ge=0, le=MAX_SEED)
    deterministic: bool = Field(False, description="bound the solver by a fixed amount of work instead of the "
                                                   "clock: the same request gives the same plan (apart from its "
                                                   "timing fields); time_limit_s no longer stops the solve")
    microbatches: int = Field(1, ge=1, description="forward and backward on 1/M of the batch, M times, gradients "
                                                   "accumulated, the optimizer once (inputs must declare batch_dim)")
    mesh_order_splits: bool = Field(False, description="a dim split over several mesh axes takes them in mesh "
                                                       "order only, the one order DTensor's placements express "
                                                       "(as `--mesh-order-splits`)")
    collective_optimizations: bool = Field(True, description="fold, reassociate and move the partitioned "
                                                             "program's collectives where that lowers communication "
                                                             "time; false keeps them as planned (`--no-collective-opt`)")
    layer_once: bool = Field(False, description="solve each kind of repeated layer once and compose the plan "
                                                "(as `--layer-once`; needs ops with a `layer`, and no microbatches)")
    pipeline: PipelineOptions | None = Field(None, description="pipeline the step (as `--pipeline`): the plan "
                                                               "gains its `pipeline` section")
    recompute: Recompute = Field("none", description="activations computed again in the backward instead of kept "
                                                     "(as `--recompute`; a training step with layers): the plan "
                                                     "records it as `recompute`")


class PlanRequest(_Wire):
    graph: GraphDocument = Field(description="a graph document, format autoshard.graph/v1")
    mesh: str | MeshSpec = MeshField
    topology: str | dict[str, Any] = TopologyField
    topology_options: TopologyOptions = Field(default_factory=TopologyOptions)
    options: PlanOptions = Field(default_factory=PlanOptions)


class EstimateRequest(_Wire):
    graph: GraphDocument
    mesh: str | MeshSpec = MeshField
    topology: str | dict[str, Any] = TopologyField
    topology_options: TopologyOptions = Field(default_factory=TopologyOptions)
    plan: dict[str, Any] = Field(description="per-op options and/or per-tensor shardings (autoshard.plan/v1)")
    microbatches: int | None = Field(None, ge=1, description="price the step as M microbatches (default: as many "
                                                              "as the plan was made for, or 1)")


class ValidateRequest(_Wire):
    # a plan is checked against a mesh: one without the other is a 422 at /mesh
    model_config = ConfigDict(extra="forbid", json_schema_extra={"dependentRequired": {"plan": ["mesh"]}})

    graph: GraphDocument
    mesh: str | MeshSpec | None = Field(None, description="mesh to check constraints (and the plan) against")
    plan: dict[str, Any] | None = Field(None, description="a plan to check against the graph; needs `mesh`")


class ProblemOut(BaseModel):
    where: str = Field(description="JSON pointer into the request body")
    message: str


class ErrorOut(BaseModel):
    kind: str = Field(description="input, too_large, not_found, conflict, infeasible, timeout, interrupted, internal")
    message: str
    problems: list[ProblemOut] = Field(default_factory=list)


class ErrorResponse(BaseModel):
    error: ErrorOut


class PlanJob(BaseModel):
    id: str
    status: JobStatus
    progress: dict[str, Any] = Field(default_factory=dict, description="phase, incumbent objective, bound, elapsed; "
                                                                          "while queued, queue_position (1: starts next)")
    plan: dict[str, Any] | None = Field(None, description="the plan document (autoshard.plan/v1) once done; "
                                                                    "when interrupted, the best plan found by then "
                                                                    "(solver.status: interrupted), if any")
    ir: dict[str, str] = Field(default_factory=dict, description="IR text per stage requested in options.emit")
    error: ErrorOut | None = None
    created_at: str
    updated_at: str


class Estimate(BaseModel):
    totals: dict[str, Any]
    ops: list[dict[str, Any]]
    reshardings: list[dict[str, Any]]
    pipeline: dict[str, Any] | None = Field(None, description="a pipelined plan's stages priced on its own cut "
                                                              "(step, bubble, per stage F/B/W, tail and memory)")


class Validation(BaseModel):
    valid: Literal[True] = True
    summary: str
    ops: int
    tensors: int
    plan_checked: bool


class Topology(BaseModel):
    name: str
    kind: str
    chip: str
    description: str
    hbm_bytes: float


class Health(BaseModel):
    status: str
    jobs: dict[str, int] = Field(default_factory=dict)

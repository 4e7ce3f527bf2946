"""From request JSON to library inputs, with every problem pointing into the request body.

A plan request is checked here once, in the API process, and turned into its canonical form:
plain JSON with the graph re-serialised, the mesh as `dp=2,tp=4` text and every option
filled in. That form is what is hashed to find identical requests, what is stored, and what a
worker process rebuilds the graph, mesh and hardware from.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

import cost_models
from autoshard import __version__
from autoshard.errors import InputError, Problem
from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_from_json, graph_to_json
from autoshard.mesh import Mesh
from autoshard.numerals import parse_dims
from autoshard.planning.costs import Hardware
from autoshard.planning.formulation import Weights
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings
from autoshard.graph.recompute import with_recomputation
from autoshard.planning.pipeline_plan import PipelineSettings, checked_orders, pipeline_mesh
from autoshard.pipeline import parse_schedule
from service.config import Settings
from service.errors import TooLarge


def under(prefix: str, error: InputError) -> InputError:
    """The same problems with their pointers moved under `prefix` (a field of the request body)."""
    moved = []
    for p in error.problems:
        where = p.where if p.where.startswith("/") else "/" + p.where if p.where else ""
        moved.append(Problem(prefix + ("" if where == "/" else where), p.message))
    return type(error)(moved)


def parse_mesh(value: str | Mapping[str, Any], max_devices: int | None = None) -> Mesh:
    """`"dp=2,tp=4"` or `{"axes": [{"name": "dp", "size": 2}, ...]}`, of at most `max_devices`
    devices (the service's setting) when given."""
    try:
        if isinstance(value, str):
            mesh = Mesh.parse(value)
        else:
            axes = value["axes"]
            mesh = Mesh(tuple(a["name"] for a in axes), tuple(a["size"] for a in axes))
    except InputError as error:
        # the mesh's own problems say "mesh" or "mesh/<axis>"; the request field is /mesh
        raise InputError([Problem("/" + p.where if p.where else "/mesh", p.message) for p in error.problems]) from None
    if max_devices is not None and mesh.num_devices > max_devices:
        raise InputError(f"{mesh.num_devices} devices; this service accepts meshes of at most {max_devices}", "/mesh")
    return mesh


def mesh_text(mesh: Mesh) -> str:
    return ",".join(f"{name}={size}" for name, size in zip(mesh.axis_names, mesh.shape))


def check_graph_size(document: Any, settings: Settings) -> None:
    """Refuse graphs over the service's limits before spending time validating them."""
    if not isinstance(document, dict):
        return
    problems = []
    ops, tensors = document.get("ops"), document.get("tensors")
    if isinstance(ops, list) and len(ops) > settings.max_ops:
        problems.append(Problem("/graph/ops", f"{len(ops)} ops; this service accepts at most {settings.max_ops}"))
    if isinstance(tensors, dict) and len(tensors) > settings.max_tensors:
        problems.append(Problem("/graph/tensors",
                                f"{len(tensors)} tensors; this service accepts at most {settings.max_tensors}"))
    if problems:
        raise TooLarge(problems)


def parse_graph(document: Any, mesh: Mesh | None, settings: Settings) -> Graph:
    check_graph_size(document, settings)
    try:
        return graph_from_json(document, mesh)
    except InputError as error:
        raise under("/graph", error) from None


def topology_name(topology: str | Mapping[str, Any]) -> str:
    return topology if isinstance(topology, str) else str(topology.get("name") or "custom")


def bind_topology(topology: str | Mapping[str, Any], options: Mapping[str, Any], mesh: Mesh) -> Hardware:
    """Bind a shipped profile (by name) or a profile object to the mesh."""
    # a string is a profile name only: the library would also read it as a file path on the server
    if isinstance(topology, str) and topology not in cost_models.list_profiles():
        raise InputError(f"unknown topology {topology!r}; expected one of {cost_models.list_profiles()} "
                         "or a profile object", "/topology")
    slice_shape = slice_of(options.get("slice"))
    try:
        return bind_hardware(topology, mesh, nodes=options.get("nodes"), slice_shape=slice_shape)
    except InputError as error:
        raise InputError([Problem(_OPTION_POINTERS.get(p.where, "/" + p.where.replace(".", "/")), p.message)
                          for p in error.problems]) from None


# the binding's placement fields come from the request's topology_options
_OPTION_POINTERS = {"topology/nodes": "/topology_options/nodes", "topology/slice_shape": "/topology_options/slice"}


def slice_of(value: str | list[int] | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else "x".join(str(v) for v in value)
    return parse_dims(text, "/topology_options/slice", "expected a slice shape like [4, 4, 4] or \"4x4x4\"")


def fill_options(options: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """The request's options with the server's defaults filled in and its caps checked."""
    filled = dict(options)
    if filled.get("time_limit_s") is None:
        filled["time_limit_s"] = settings.default_time_limit_s
    if filled.get("workers") is None:
        filled["workers"] = settings.solver_threads
    problems = []
    if filled["time_limit_s"] > settings.max_time_limit_s:
        problems.append(Problem("/options/time_limit_s", f"at most {settings.max_time_limit_s:g} s on this service, "
                                                         f"got {filled['time_limit_s']:g}"))
    if filled["workers"] > settings.max_solver_threads:
        problems.append(Problem("/options/workers", f"at most {settings.max_solver_threads} solver threads on this "
                                                    f"service, got {filled['workers']}"))
    if filled.get("layer_once") and filled.get("pipeline"):
        problems.append(Problem("/options/layer_once", "composing layers solved once does not take a pipeline yet; "
                                                       "drop layer_once or pipeline"))
    if filled.get("layer_once") and filled.get("microbatches", 1) > 1:
        problems.append(Problem("/options/layer_once", "composing layers solved once does not take microbatches "
                                                       "yet; drop layer_once or microbatches"))
    if problems:
        raise InputError(problems)
    filled["emit"] = sorted(set(filled.get("emit", [])))
    return filled


def canonical_plan_request(request: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """Check a plan request (graph, mesh, topology, options); return its canonical form."""
    mesh = parse_mesh(request["mesh"], settings.max_devices)
    graph = parse_graph(request["graph"], mesh, settings)
    given = request.get("options", {})
    try:  # the graph the plan is made for: the canonical request holds it rewritten
        graph = with_recomputation(graph, given.get("recompute", "none"), mesh)
    except InputError as error:
        raise InputError([Problem("/options/recompute", p.message) for p in error.problems]) from None
    # the copies count against the service's limits too
    check_graph_size({"ops": list(graph.ops), "tensors": dict(graph.tensors)}, settings)
    pipeline = pipeline_of(given)
    machine = mesh
    if pipeline is not None:  # the stages against the graph's layers; the machine is the stages times the mesh
        try:
            checked_orders(graph, pipeline, given.get("microbatches", 1))
        except InputError as error:
            raise InputError([Problem(PIPELINE_POINTERS.get(p.where, "/options/pipeline"), p.message)
                              for p in error.problems]) from None
        machine = pipeline_mesh(mesh, pipeline.stages)
        if settings.max_devices is not None and machine.num_devices > settings.max_devices:
            raise InputError(f"{pipeline.stages} stages of {mesh.num_devices} devices; this service accepts at most "
                             f"{settings.max_devices} devices", "/options/pipeline/stages")
    topology_options = {k: v for k, v in request.get("topology_options", {}).items() if v is not None}
    bind_topology(request["topology"], topology_options, machine)
    return {"graph": graph_to_json(graph), "mesh": mesh_text(mesh), "topology": request["topology"],
            "topology_options": topology_options, "options": fill_options(given, settings)}


# Where the planner names a pipeline setting -> its field in a plan request
PIPELINE_POINTERS = {"pipeline": "/options/pipeline/stages", "schedule": "/options/pipeline/schedule",
                     "microbatches": "/options/microbatches"}


def pipeline_of(options: Mapping[str, Any]) -> PipelineSettings | None:
    """The pipeline a request's filled options ask for, None without one."""
    given = options.get("pipeline")
    if not given:
        return None
    try:
        schedule, chunks = parse_schedule(given.get("schedule", "1f1b"))
    except InputError as error:
        raise InputError([Problem("/options/pipeline/schedule", p.message) for p in error.problems]) from None
    return PipelineSettings(given["stages"], schedule, chunks)


def request_key(canonical: Mapping[str, Any]) -> str:
    """Identical requests (to this autoshard version) have the same key."""
    text = json.dumps({"request": canonical, "autoshard": __version__}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class PlanInputs:
    """What a solve needs, rebuilt from a canonical request."""

    graph: Graph
    mesh: Mesh
    hardware: Hardware
    topology: str
    settings: SolveSettings
    emit: tuple[str, ...]
    dialect: str
    verify: str
    optimize_collectives: bool
    layer_once: bool
    pipeline: PipelineSettings | None


def plan_inputs(canonical: Mapping[str, Any]) -> PlanInputs:
    mesh = Mesh.parse(canonical["mesh"])
    options = canonical["options"]
    settings = SolveSettings(time_limit_s=options["time_limit_s"], workers=options["workers"], seed=options["seed"],
                             gap_limit=options.get("gap_limit", SolveSettings.gap_limit),
                             memory_budget_bytes=options.get("memory_budget_bytes"),
                             weights=Weights(**options["weights"]),
                             deterministic=options.get("deterministic", False),
                             microbatches=options.get("microbatches", 1),
                             mesh_order_splits=options.get("mesh_order_splits", False))
    pipeline = pipeline_of(options)
    machine = mesh if pipeline is None else pipeline_mesh(mesh, pipeline.stages)
    return PlanInputs(graph_from_json(canonical["graph"], mesh), mesh,
                      bind_topology(canonical["topology"], canonical["topology_options"], machine),
                      topology_name(canonical["topology"]), settings, tuple(options["emit"]), options["dialect"],
                      options.get("verify", "auto"), options.get("collective_optimizations", True),
                      options.get("layer_once", False), pipeline)

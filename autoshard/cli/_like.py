"""`plan GRAPH.json --like PLAN.json`: plan a graph with the layout another plan decided: its mesh,
topology and placement (nodes or slice), pipeline stages, schedule with its virtual stages,
microbatches, the layers of each virtual stage and each layer's recomputation. A narrow version
of a model planned so runs in the simulator what the wide plan decided, and its plan.json records
the same decisions.

A flag given as well must say what the plan says (else an error naming both); a field the plan
lacks or states badly is named by its JSON pointer."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from autoshard.errors import InputError, Problem
from autoshard.graph.model import Graph
from autoshard.graph.recompute import Recompute, stated_recompute
from autoshard.mesh import Mesh
from autoshard.pipeline import parse_schedule
from autoshard.planning.microbatches import stated_microbatches
from autoshard.planning.pipeline_stages import layer_order
from autoshard.planning.plan import stated_mesh

# What `plan` takes when neither a flag nor --like says otherwise
DEFAULTS = {"topology": "dgx-h100", "recompute": "none", "microbatches": 1}


@dataclass(frozen=True)
class Decisions:
    """A plan's layout decisions, as `plan`'s flags spell them."""

    mesh: Mesh
    topology: str
    nodes: int | None
    slice: str | None  # as --slice spells it: 4x4x4
    stages: int | None  # None: not pipelined
    schedule: str | None  # as --schedule spells it: interleaved:3
    microbatches: int
    recompute: Recompute
    layers: tuple[tuple[int, int], ...]  # per virtual stage, its first and last layer (none unpipelined)

    def part_at(self, graph: Graph) -> tuple[int, ...] | None:
        """The virtual stage of each layer position of `graph` (None unpipelined); an error when
        the graph's layers are not the plan's."""
        if self.stages is None:
            return None
        order = layer_order(graph)
        index = {layer: i for i, layer in enumerate(order)}
        part_at: list[int | None] = [None] * len(order)
        for virtual, (first, last) in enumerate(self.layers):
            if first not in index or last not in index:
                raise InputError(f"virtual stage {virtual} runs layers {first}-{last}; graph {graph.name!r} has layers "
                                 f"{order[0]} to {order[-1]}", "--like")
            for position in range(index[first], index[last] + 1):
                part_at[position] = virtual
        missing = [order[p] for p, part in enumerate(part_at) if part is None]
        if missing:
            raise InputError(f"no virtual stage of the plan runs layer(s) {missing[:5]} of graph {graph.name!r}",
                             "--like")
        return tuple(part for part in part_at if part is not None)


def read_decisions(document: Any) -> Decisions:
    """The decisions of a plan document; an InputError naming the field missing or wrong."""
    if not isinstance(document, dict):
        raise InputError(f"expected a plan.json object, got {type(document).__name__}", "/")
    mesh = stated_mesh(document)
    if mesh is None:
        raise InputError('missing; expected {"axes": [{"name": "tp", "size": 8}, ...]}', "/mesh")
    topology = document.get("topology")
    if not isinstance(topology, str):
        raise InputError(f"expected the name of the profile the plan was made for, {_got(topology)}", "/topology")
    placed = document.get("topology_options", {})
    if not isinstance(placed, dict):
        raise InputError(f"expected an object of nodes or slice, got {placed!r}", "/topology_options")
    if "mapping" in placed:
        raise InputError("the plan places its mesh axes by a mapping, which `plan` does not take",
                         "/topology_options/mapping")
    nodes, slice_shape = placed.get("nodes"), placed.get("slice")
    if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1):
        raise InputError(f"expected a positive number of nodes, got {nodes!r}", "/topology_options/nodes")
    if slice_shape is not None and not (isinstance(slice_shape, list) and slice_shape
                                        and all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                                for d in slice_shape)):
        raise InputError(f"expected a slice shape like [4, 4, 4], got {slice_shape!r}", "/topology_options/slice")
    microbatches = stated_microbatches(document)
    stages, schedule, layers = _pipeline(document.get("pipeline"), microbatches)
    return Decisions(mesh, topology, nodes, "x".join(map(str, slice_shape)) if slice_shape else None, stages,
                     schedule, microbatches, stated_recompute(document), layers)


def _pipeline(section: Any, microbatches: int) -> tuple[int | None, str | None, tuple[tuple[int, int], ...]]:
    """(stages, schedule as --schedule spells it, each virtual stage's layers) of plan.json's
    `pipeline` section, (None, None, ()) without one."""
    if section is None:
        return None, None, ()
    if not isinstance(section, dict):
        raise InputError(f"expected an object with the stages, schedule and microbatches, got {section!r}", "/pipeline")
    count, name, chunks = section.get("stage_count"), section.get("schedule"), section.get("virtual_stages_per_stage", 1)
    for field, value in (("stage_count", count), ("virtual_stages_per_stage", chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"expected a positive integer, {_got(value)}", f"/pipeline/{field}")
    if not isinstance(name, str):
        raise InputError(f"expected the schedule's name (gpipe, 1f1b, interleaved, zb-h1), {_got(name)}",
                         "/pipeline/schedule")
    if section.get("microbatches") != microbatches:
        raise InputError(f"expected the plan's {microbatches} microbatches, {_got(section.get('microbatches'))}",
                         "/pipeline/microbatches")
    stages = section.get("stages")
    if not isinstance(stages, list) or len(stages) != count:
        raise InputError(f"expected a list of {count} stages", "/pipeline/stages")
    layers: dict[int, tuple[int, int]] = {}
    for s, stage in enumerate(stages):
        listed = stage.get("chunks") if isinstance(stage, dict) else None
        if not isinstance(listed, list) or len(listed) != chunks:
            raise InputError(f"expected a list of {chunks} chunks", f"/pipeline/stages/{s}/chunks")
        for c, chunk in enumerate(listed):
            where = f"/pipeline/stages/{s}/chunks/{c}"
            virtual = chunk.get("virtual_stage") if isinstance(chunk, dict) else None
            if virtual != c * count + s:
                raise InputError(f"chunk {c} of stage {s} is virtual stage {c * count + s}, {_got(virtual)}",
                                 f"{where}/virtual_stage")
            span = chunk.get("layers")
            if not (isinstance(span, list) and len(span) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                      for x in span)):
                raise InputError(f"expected [first layer, last layer], {_got(span)}", f"{where}/layers")
            layers[virtual] = (span[0], span[1])
    return count, name + (f":{chunks}" if chunks > 1 else ""), tuple(layers[v] for v in range(count * chunks))


def _got(value: Any) -> str:
    return "but it is missing" if value is None else f"got {value!r}"


def apply_decisions(args: argparse.Namespace, decisions: Decisions) -> None:
    """Set `plan`'s flags to the decisions; a flag given with another value is an error naming
    it and the plan's field (every conflict at once)."""
    stated = {"mesh": (str(decisions.mesh), "/mesh"), "topology": (decisions.topology, "/topology"),
              "nodes": (decisions.nodes, "/topology_options/nodes"),
              "slice": (decisions.slice, "/topology_options/slice"),
              "pipeline": (decisions.stages, "/pipeline/stage_count"),
              "schedule": (decisions.schedule, "/pipeline/schedule"),
              "microbatches": (decisions.microbatches, "/microbatches"),
              "recompute": (decisions.recompute, "/recompute")}
    problems = []
    for name, (value, field) in stated.items():
        given = getattr(args, name)
        if given is not None and not _same(name, given, value):
            problems.append(Problem(f"--{name}", f"{_spelled(given)} conflicts with --like {args.like}, whose {field} "
                                                 f"is {_spelled(value)}; drop --{name} or give the plan's value"))
        setattr(args, name, value)
    if problems:
        raise InputError(problems)


def _same(name: str, given: Any, stated: Any) -> bool:
    if name == "mesh":
        try:
            return Mesh.parse(given) == Mesh.parse(stated)
        except InputError:
            return False
    if name == "schedule":
        try:
            return parse_schedule(given) == parse_schedule(stated) if stated is not None else False
        except InputError:
            return False
    return given == stated


def _spelled(value: Any) -> str:
    if value is None:
        return "not set"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{layer}: {mode}" for layer, mode in sorted(value.items())) + "}"
    return str(value)


def fill_defaults(args: argparse.Namespace) -> None:
    """The flags neither given nor set by --like take `plan`'s defaults."""
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)

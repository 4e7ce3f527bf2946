"""A sharding plan: one option per op and a storage sharding per graph input and parameter.

Everything else a plan says (each value's sharding as produced, what each consumer needs,
the reshardings between them) is derived here, so the solver, the estimator, the IR emitter
and the simulator all read the same facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

from autoshard.errors import InputError, Problem, ShardingError
from autoshard.graph.model import Graph, Op
from autoshard.mesh import Mesh
from autoshard.planning.options import ShardingOption, check_option, operand_shardings, result_shardings
from autoshard.planning.ring_attention import check_ring
from autoshard.sharding import Sharding


@dataclass(frozen=True)
class Plan:
    graph: Graph
    mesh: Mesh
    options: Mapping[str, ShardingOption]  # op name -> option
    storage: Mapping[str, Sharding]  # graph input / parameter -> how it is stored

    def produced(self, tensor: str) -> Sharding:
        """The sharding a value has where it is produced (or stored)."""
        if tensor in self.storage:
            return self.storage[tensor]
        op = self.graph.producers[tensor]
        return self._shardings(op)[1][op.outputs.index(tensor)]

    def required(self, op: Op, input_index: int) -> Sharding:
        """The sharding `op` reads its input `input_index` in."""
        return self._shardings(op)[0][input_index]

    def _shardings(self, op: Op) -> tuple[tuple[Sharding, ...], tuple[Sharding, ...]]:
        """`op`'s operand and result shardings, derived once per plan (every phase after the
        solve asks for them, several times per op)."""
        found = self._derived.get(op.name)
        if found is None:
            option = self.options[op.name]
            found = self._derived[op.name] = (operand_shardings(op.nest, option), result_shardings(op.nest, option))
        return found

    @cached_property
    def _derived(self) -> dict[str, tuple[tuple[Sharding, ...], tuple[Sharding, ...]]]:
        return {}

    def final(self, tensor: str) -> Sharding:
        """A graph output's delivered sharding: a pinned one if given; for a value written in
        place, the storage sharding of the value it overwrites; else as produced, reduced."""
        for c in self.graph.constraints:
            if c.tensor == tensor and c.required:
                return c.sharding
        old = self.graph.tensors[tensor].updates
        if old is not None and old in self.storage:
            return self.storage[old]
        return self.produced(tensor).without_partial()


def validate_plan(plan: Plan) -> None:
    """Raise an InputError naming each op or tensor whose part of the plan does not fit."""
    problems: list[Problem] = []
    graph, mesh = plan.graph, plan.mesh
    for op in graph.ops:
        option = plan.options.get(op.name)
        if option is None:
            problems.append(Problem(f"/ops/{op.name}", f"op {op.name!r} has no option in the plan"))
            continue
        try:
            check_option(op.nest, option, mesh, f"/ops/{op.name}")
            check_ring(op, option, mesh, f"/ops/{op.name}")
        except ShardingError as error:
            problems.extend(error.problems)
    for name in plan.options:
        if name not in graph.op_by_name:
            problems.append(Problem(f"/ops/{name}", f"the plan names op {name!r}, which the graph does not have"))
    for name, sharding in plan.storage.items():
        tensor = graph.tensors.get(name)
        if tensor is None:
            problems.append(Problem(f"/tensors/{name}", f"the plan names tensor {name!r}, which the graph does not have"))
            continue
        if tensor.role == "intermediate":
            problems.append(Problem(f"/tensors/{name}", f"tensor {name!r} is produced by an op; only inputs and parameters have a storage sharding"))
        try:
            sharding.check(mesh, tensor.shape, f"/tensors/{name}")
        except ShardingError as error:
            problems.extend(error.problems)
        if sharding.is_partial:
            problems.append(Problem(f"/tensors/{name}", f"stored tensor {name!r} cannot be partial"))
    for tensor in graph.tensors.values():
        if tensor.role != "intermediate" and tensor.name not in plan.storage:
            problems.append(Problem(f"/tensors/{tensor.name}", f"{tensor.role} {tensor.name!r} has no storage sharding in the plan"))
    if problems:
        raise InputError(problems)


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The minimal plan form: per-op options and per-tensor shardings (as produced)."""
    return {
        "format": "autoshard.plan/v1",
        "mesh": {"axes": [{"name": n, "size": s} for n, s in zip(plan.mesh.axis_names, plan.mesh.shape)]},
        "ops": {op.name: option_entry(op.kind, plan.options[op.name]) for op in plan.graph.ops},
        "tensors": {name: plan.produced(name).to_json() for name in plan.graph.tensors},
    }


def option_entry(kind: str, option: ShardingOption) -> dict[str, Any]:
    """An op's entry in a plan document: its kind, its option, and its ring axis if any."""
    return {"kind": kind, "option": option.to_json()} | ({"ring": option.ring} if option.ring is not None else {})


MESH_DOCUMENT = '{"axes": [{"name": "dp", "size": 2}, ...]}'


def stated_mesh(document: Any) -> Mesh | None:
    """The mesh a plan document says it was made for (`mesh.axes`), None if it states none; an
    InputError naming each field of a mesh stated badly."""
    if not isinstance(document, dict) or document.get("mesh") is None:
        return None
    problems = mesh_document_problems(document["mesh"])
    if problems:
        raise InputError(problems)
    axes = document["mesh"]["axes"]
    return Mesh(tuple(a["name"] for a in axes), tuple(a["size"] for a in axes))


def mesh_document_problems(stated: Any) -> list[Problem]:
    """What is wrong with a plan document's `mesh`, each at its pointer."""
    if not isinstance(stated, dict) or not isinstance(stated.get("axes"), list):
        return [Problem("/mesh", f"expected {MESH_DOCUMENT}, got {stated!r}")]
    problems = [Problem(f"/mesh/{key}", f"unknown key {key!r}; expected 'axes'") for key in stated if key != "axes"]
    for i, axis in enumerate(stated["axes"]):
        where = f"/mesh/axes/{i}"
        if not isinstance(axis, dict):
            problems.append(Problem(where, f'expected {{"name": ..., "size": ...}}, got {axis!r}'))
            continue
        problems += [Problem(f"{where}/{key}", f"unknown key {key!r}; expected 'name' and 'size'")
                     for key in axis if key not in ("name", "size")]
        if not isinstance(axis.get("name"), str):
            problems.append(Problem(f"{where}/name", f"expected a mesh axis name, got {axis.get('name')!r}"))
        size = axis.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            problems.append(Problem(f"{where}/size", f"expected a positive integer, got {size!r}"))
    return problems


def check_plan_mesh(document: Any, mesh: Mesh, where: str) -> None:
    """Refuse a plan made for another mesh than `mesh` (its options would be priced or run on
    axes of other sizes); `where` names the mesh given."""
    stated = stated_mesh(document)
    if stated is not None and stated != mesh:
        raise InputError(f"the plan was made for mesh {stated}, not {mesh}", where)


def plan_from_json(document: Any, graph: Graph, mesh: Mesh) -> Plan:
    """Read a plan: `ops.<name>.option` (mesh axes per loop) and/or `tensors.<name>` shardings.

    An op without an option gets the one consistent with the shardings given for its operands
    and results; inputs and parameters are stored as their `tensors` entry says (default
    replicated).
    """
    from autoshard.planning.options import options_consistent_with  # local: only this reader needs it

    if not isinstance(document, dict):
        raise InputError("a plan is a JSON object", "/")
    ops_doc = document.get("ops", {}) or {}
    tensors_doc = document.get("tensors", {}) or {}
    problems = [Problem(f"/{key}", f"expected an object keyed by {key[:-1]} name")
                for key, value in (("ops", ops_doc), ("tensors", tensors_doc)) if not isinstance(value, dict)]
    if problems:
        raise InputError(problems)
    problems.extend(Problem(f"/ops/{name}", 'expected an object such as {"option": [["dp"], [], ["tp"]]}')
                    for name, entry in ops_doc.items() if not isinstance(entry, dict))
    shardings: dict[str, Sharding] = {}
    for name, value in tensors_doc.items():
        try:
            shardings[name] = Sharding.parse(value)
        except ShardingError as error:
            problems.extend(Problem(f"/tensors/{name}", p.message) for p in error.problems)
    problems.extend(Problem(f"/ops/{name}", f"graph {graph.name!r} has no op {name!r}")
                    for name in ops_doc if name not in graph.op_by_name)
    problems.extend(Problem(f"/tensors/{name}", f"graph {graph.name!r} has no tensor {name!r}")
                    for name in tensors_doc if name not in graph.tensors)
    options: dict[str, ShardingOption] = {}
    for op in graph.ops:
        entry = ops_doc.get(op.name)
        if isinstance(entry, dict) and "option" not in entry:
            problems.append(Problem(f"/ops/{op.name}", "no option given: expected mesh axes per loop, e.g. "
                                                       '{"option": [["dp"], [], ["tp"]]}'))
            continue
        if isinstance(entry, dict):
            loops = entry["option"]
            if not isinstance(loops, list) or not all(isinstance(a, list) and all(isinstance(x, str) for x in a) for a in loops):
                problems.append(Problem(f"/ops/{op.name}/option", "expected a list of mesh axis name lists, one per loop"))
                continue
            ring = entry.get("ring")
            if ring is not None and not isinstance(ring, str):
                problems.append(Problem(f"/ops/{op.name}/ring", f"expected a mesh axis name, got {ring!r}"))
                continue
            options[op.name] = ShardingOption(tuple(tuple(a) for a in loops), ring)
            continue
        known = {i: shardings[t] for i, t in enumerate(op.operands) if t in shardings and i >= len(op.inputs)}
        found = options_consistent_with(op.nest, mesh, known)
        if not found:
            problems.append(Problem(f"/ops/{op.name}", f"no option of op {op.name!r} produces the shardings given for {list(op.outputs)}"))
            continue
        options[op.name] = found[0]
    storage = {t.name: shardings.get(t.name, Sharding()) for t in graph.tensors.values() if t.role != "intermediate"}
    if problems:
        raise InputError(problems)
    plan = Plan(graph, mesh, options, storage)
    validate_plan(plan)
    # A sharding given for a value an op's option produces must be the one it produces.
    contradicted = [Problem(f"/tensors/{name}", f"given as {given} but op {graph.producers[name].name!r} with its "
                                                f"option produces {plan.produced(name)}")
                    for name, given in shardings.items()
                    if name in graph.producers
                    and not given.same_layout(plan.produced(name), mesh, graph.tensors[name].shape)]
    if contradicted:
        raise InputError(contradicted)
    return plan


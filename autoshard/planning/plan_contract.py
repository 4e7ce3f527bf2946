"""The plan document `autoshard.plan/v1` as a contract between whoever wrote it and every reader.

`read_plan` is the one door a plan document comes in through: the CLI's `emit`, `simulate` and
`estimate`, the service's `/v1/estimate` and `/v1/validate`, and Python callers
(`autoshard.read_plan`, JAX's `shard` and `partition_specs`, torch's `parallelize`). It checks every field against the graph and the mesh asked for and
reports every problem by JSON pointer, so that a hand-edited plan is refused rather than
emitted, simulated or priced as if it were the plan it no longer is:

- `format` is `autoshard.plan/v1`; no key is unknown, at the top, in an op entry, a resharding
  or one of its steps; `microbatches`, if given, is a positive integer;
- `mesh.axes` names the mesh asked for, axis by axis;
- `ops` has an entry for every op of the graph and no other, each with the graph's `kind` and an
  `option` giving mesh axes for each of the op's loops;
- `tensors` has a sharding for every tensor of the graph and no other, each valid for its shape;
  a stored one is not partial, and one an op produces is what its option produces;
- each resharding starts where its tensor is produced (or where an earlier resharding of it
  delivered it), ends where its consumer reads it (or where a later one starts), and its steps
  are known collectives over mesh axes, each starting where the previous one ended.

`plan_from_json` (planning/plan.py) stays the lenient builder for code that gives a few options
and shardings and lets the rest be derived; documents from users come through here.
"""

from __future__ import annotations

from typing import Any, Mapping

from autoshard.errors import InputError, Problem, ShardingError, json_type
from autoshard.graph.model import Graph
from autoshard.graph.recompute import stated_recompute
from autoshard.graph.schema import pointer
from autoshard.mesh import Mesh
from autoshard.planning.plan import MESH_DOCUMENT, Plan, check_plan_mesh, mesh_document_problems, plan_from_json
from autoshard.resharding.steps import STEP_KINDS
from autoshard.sharding import Sharding

PLAN_FORMAT = "autoshard.plan/v1"

# What `plan_document` and `deliver` write (delivery/); everything but `format`, `mesh`, `ops`,
# `tensors`, `reshardings`, `microbatches`, `recompute` (the readers rewrite the graph as it says
# before reading the plan onto it), `topology`, `topology_options` and `pipeline` (a pipelined
# plan's cut, checked by planning/pipeline_cut.read_cut where it is run or emitted) is a report the
# readers do not act on.
DOCUMENT_KEYS = frozenset({
    "format", "mesh", "ops", "tensors", "reshardings", "microbatches", "autoshard_version", "graph", "topology",
    "topology_options", "totals", "roles", "solver", "partition_specs", "dtensor", "collective_optimizations",
    "verification", "phases", "search", "pipeline", "recompute"})
OP_KEYS = frozenset({"kind", "option", "ring", "compute_s", "flops_per_device", "bytes_per_device", "bound",
                     "communication_s", "communication_bytes", "runs", "module", "class", "axis_roles"})
RESHARDING_KEYS = frozenset({"tensor", "consumer", "input", "from", "to", "steps", "seconds", "bytes_per_device",
                             "runs"})
STEP_KEYS = frozenset({"kind", "mesh_axes", "dims", "in_local_shape", "out_local_shape", "bytes_per_device", "seconds",
                       "before", "after"})
OUTPUT_CONSUMER = "output"  # a resharding delivering a graph output names this as its consumer


def read_plan(document: Any, graph: Graph, mesh: Mesh) -> Plan:
    """The plan a `autoshard.plan/v1` document states for `graph` on `mesh`, or an InputError
    naming every field that does not fit them."""
    problems = document_problems(document, graph, mesh)
    if problems:
        raise InputError(problems)
    plan = plan_from_json(document, graph, mesh)  # options and shardings against the ops' loops and shapes
    problems = resharding_problems(document.get("reshardings", []), plan)
    if problems:
        raise InputError(problems)
    return plan


def document_problems(document: Any, graph: Graph, mesh: Mesh) -> list[Problem]:
    """Every problem with the document's shape: format, keys, mesh, and which ops and tensors it
    names (their options and shardings are then read by `plan_from_json`)."""
    if not isinstance(document, dict):
        return [Problem("/", f"a plan is a JSON object, got {json_type(document)}")]
    problems = []
    if document.get("format") != PLAN_FORMAT:
        problems.append(Problem("/format", f"expected {PLAN_FORMAT!r}, got {document.get('format')!r}"
                                + (" (missing)" if "format" not in document else "")))
    problems += _unknown_keys(document, DOCUMENT_KEYS, "")
    mesh_problems = _mesh_problems(document, mesh)
    if mesh_problems:  # every sharding would then be read on the wrong axes
        return problems + mesh_problems
    problems += _op_problems(document.get("ops"), graph)
    problems += _tensor_problems(document.get("tensors"), graph, mesh)
    problems += _topology_problems(document)
    try:
        from autoshard.planning.microbatches import stated_microbatches  # local: it imports the formulation
        stated_microbatches(document)
    except InputError as error:
        problems += error.problems
    try:
        stated_recompute(document)
    except InputError as error:
        problems += error.problems
    if "reshardings" in document and not isinstance(document["reshardings"], list):
        problems.append(Problem("/reshardings", f"expected a list, got {json_type(document['reshardings'])}"))
    return problems


def _mesh_problems(document: dict[str, Any], mesh: Mesh) -> list[Problem]:
    if document.get("mesh") is None:
        return [Problem("/mesh", f"missing: expected the mesh the plan was made for, {MESH_DOCUMENT}")]
    problems = mesh_document_problems(document["mesh"])
    if not problems:
        try:
            check_plan_mesh(document, mesh, "/mesh")
        except InputError as error:
            problems += error.problems
    return problems


def _topology_problems(document: dict[str, Any]) -> list[Problem]:
    """`topology` and where the mesh was placed on it (`topology_options`), which `emit` and
    `simulate` price reshardings with: each of the type `plan` writes."""
    problems = []
    if "topology" in document and not isinstance(document["topology"], str):
        problems.append(Problem("/topology", f"expected a profile name, got {json_type(document['topology'])}"))
    placed = document.get("topology_options", {})
    if not isinstance(placed, dict):
        return problems + [Problem("/topology_options", f"expected an object, got {json_type(placed)}")]
    problems += _unknown_keys(placed, {"nodes", "slice", "mapping"}, "/topology_options")
    nodes, slice_shape, mapping = placed.get("nodes"), placed.get("slice"), placed.get("mapping")
    if nodes is not None and not _is_count(nodes):
        problems.append(Problem("/topology_options/nodes", f"expected a positive integer, got {nodes!r}"))
    if slice_shape is not None and not (isinstance(slice_shape, list) and all(_is_count(n) for n in slice_shape)):
        problems.append(Problem("/topology_options/slice", f"expected a list of positive integers, got {slice_shape!r}"))
    if mapping is not None and not (isinstance(mapping, dict) and all(
            isinstance(dims, str) or (isinstance(dims, list) and all(isinstance(d, str) for d in dims))
            for dims in mapping.values())):
        problems.append(Problem("/topology_options/mapping", f"expected an object of mesh axis -> physical dim "
                                                             f"names, got {mapping!r}"))
    return problems


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _op_problems(ops: Any, graph: Graph) -> list[Problem]:
    if not isinstance(ops, dict):
        return [Problem("/ops", f"expected an object keyed by op name, got {json_type(ops)}")]
    problems = [Problem(pointer(("ops", name)), f"graph {graph.name!r} has no op {name!r}")
                for name in ops if name not in graph.op_by_name]
    for op in graph.ops:
        where = pointer(("ops", op.name))
        entry = ops.get(op.name)
        if entry is None:
            problems.append(Problem(where, f"op {op.name!r} ({op.kind}) has no entry; expected "
                                           f'{{"kind": "{op.kind}", "option": [mesh axes per loop]}}'))
        elif not isinstance(entry, dict):
            problems.append(Problem(where, f'expected an object such as {{"kind": "{op.kind}", "option": [["dp"], []]}}, '
                                           f"got {json_type(entry)}"))
        else:
            problems += _unknown_keys(entry, OP_KEYS, where)
            if entry.get("kind") != op.kind:
                problems.append(Problem(f"{where}/kind", f"op {op.name!r} is a {op.kind} in the graph, "
                                                         f"but the plan says {entry.get('kind')!r}"))
            if "option" not in entry:
                problems.append(Problem(f"{where}/option", f"missing: expected mesh axes for each of the "
                                                           f"{op.nest.num_loops} loops of op {op.name!r}"))
    return problems


def _tensor_problems(tensors: Any, graph: Graph, mesh: Mesh) -> list[Problem]:
    if not isinstance(tensors, dict):
        return [Problem("/tensors", f"expected an object keyed by tensor name, got {json_type(tensors)}")]
    problems = [Problem(pointer(("tensors", name)), f"graph {graph.name!r} has no tensor {name!r}")
                for name in tensors if name not in graph.tensors]
    for name, tensor in graph.tensors.items():
        where = pointer(("tensors", name))
        if name not in tensors:
            problems.append(Problem(where, f"{tensor.role} {name!r} has no sharding in the plan"))
            continue
        try:
            Sharding.parse(tensors[name]).check(mesh, tensor.shape, where)
        except ShardingError as error:
            problems += _under(where, error)
    return problems


def resharding_problems(reshardings: list[Any], plan: Plan) -> list[Problem]:
    """Each resharding against the plan: its tensor and consumer, its ends, its steps' chain."""
    problems: list[Problem] = []
    ends: list[tuple[str, Sharding, Sharding] | None] = []  # per entry: tensor, from, to (None if unreadable)
    for i, entry in enumerate(reshardings):
        where = f"/reshardings/{i}"
        found = _read_resharding(entry, plan, where, problems)
        ends.append(found)
    for i, found in enumerate(ends):
        if found is None:
            continue
        tensor, source, target = found
        entry, where = reshardings[i], f"/reshardings/{i}"
        shape = plan.graph.tensors[tensor].shape
        earlier = [plan.produced(tensor)] + [e[2] for e in ends[:i] if e is not None and e[0] == tensor]
        if not any(source.same_layout(s, plan.mesh, shape) for s in earlier):
            problems.append(Problem(f"{where}/from", f"tensor {tensor!r} is produced as {plan.produced(tensor)}, "
                                                     f"and no earlier resharding delivers it as {source}"))
        consumer = entry["consumer"]
        wanted = plan.final(tensor) if consumer == OUTPUT_CONSUMER else plan.required(
            plan.graph.op_by_name[consumer], entry["input"])
        later = [wanted] + [e[1] for e in ends[i + 1:] if e is not None and e[0] == tensor]
        if not any(target.same_layout(s, plan.mesh, shape) for s in later):
            what = "delivered" if consumer == OUTPUT_CONSUMER else f"read by op {consumer!r}"
            problems.append(Problem(f"{where}/to", f"tensor {tensor!r} is {what} as {wanted}, and no later "
                                                   f"resharding starts from {target}"))
    return problems


def _read_resharding(entry: Any, plan: Plan, where: str,
                     problems: list[Problem]) -> tuple[str, Sharding, Sharding] | None:
    """The entry's tensor and ends if it names them well (and its steps chain from one to the
    other); else None, with its problems added."""
    graph, count = plan.graph, len(problems)
    if not isinstance(entry, dict):
        problems.append(Problem(where, f"expected a resharding object, got {json_type(entry)}"))
        return None
    problems += _unknown_keys(entry, RESHARDING_KEYS, where)
    tensor, consumer, index = entry.get("tensor"), entry.get("consumer"), entry.get("input")
    if not isinstance(tensor, str) or tensor not in graph.tensors:
        problems.append(Problem(f"{where}/tensor", f"graph {graph.name!r} has no tensor {tensor!r}"))
    elif consumer == OUTPUT_CONSUMER:
        if tensor not in graph.outputs:
            problems.append(Problem(f"{where}/consumer", f"tensor {tensor!r} is not a graph output"))
        if index is not None:
            problems.append(Problem(f"{where}/input", f"expected null for a graph output, got {index!r}"))
    elif not isinstance(consumer, str) or consumer not in graph.op_by_name:
        problems.append(Problem(f"{where}/consumer", f"expected an op of graph {graph.name!r} or "
                                                     f"{OUTPUT_CONSUMER!r}, got {consumer!r}"))
    else:
        inputs = graph.op_by_name[consumer].inputs
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(inputs) \
                or inputs[index] != tensor:
            problems.append(Problem(f"{where}/input", f"op {consumer!r} reads {tensor!r} as no input {index!r} "
                                                      f"(its inputs are {list(inputs)})"))
    known = tensor if isinstance(tensor, str) and tensor in graph.tensors else None
    source = _sharding(entry, "from", plan, known, where, problems)
    target = _sharding(entry, "to", plan, known, where, problems)
    if len(problems) > count:
        return None
    problems += _step_problems(entry.get("steps"), source, target, plan, tensor, where)
    return (tensor, source, target) if len(problems) == count else None


def _step_problems(steps: Any, source: Sharding, target: Sharding, plan: Plan, tensor: str,
                   where: str) -> list[Problem]:
    if not isinstance(steps, list):
        return [Problem(f"{where}/steps", f"expected a list of steps, got {json_type(steps)}")]
    problems: list[Problem] = []
    shape = plan.graph.tensors[tensor].shape
    at = source
    for j, step in enumerate(steps):
        here = f"{where}/steps/{j}"
        if not isinstance(step, dict):
            problems.append(Problem(here, f"expected a step object, got {json_type(step)}"))
            return problems
        problems += _unknown_keys(step, STEP_KEYS, here)
        if not isinstance(step.get("kind"), str) or step["kind"] not in STEP_KINDS:
            problems.append(Problem(f"{here}/kind", f"expected one of {list(STEP_KINDS)}, got {step.get('kind')!r}"))
        axes = step.get("mesh_axes")
        if not isinstance(axes, list) or not axes or not all(a in plan.mesh.axis_names for a in axes):
            problems.append(Problem(f"{here}/mesh_axes", f"expected a non-empty list of the mesh's axes "
                                                         f"{list(plan.mesh.axis_names)}, got {axes!r}"))
        before = _sharding(step, "before", plan, tensor, here, problems)
        after = _sharding(step, "after", plan, tensor, here, problems)
        if before is None or after is None:
            return problems
        if not before.same_layout(at, plan.mesh, shape):
            problems.append(Problem(f"{here}/before", f"expected {at}, where the "
                                                      f"{'resharding starts' if j == 0 else 'previous step ends'}"
                                                      f", got {before}"))
        at = after
    if not at.same_layout(target, plan.mesh, shape):
        problems.append(Problem(f"{where}/steps", f"the steps end at {at}, not at the resharding's target {target}"))
    return problems


def _sharding(entry: Mapping[str, Any], key: str, plan: Plan, tensor: str | None, where: str,
              problems: list[Problem]) -> Sharding | None:
    """`entry[key]` as a sharding valid for `tensor` (if known) on the plan's mesh, or None (a
    problem added)."""
    if key not in entry:
        problems.append(Problem(f"{where}/{key}", "missing: expected a sharding"))
        return None
    try:
        sharding = Sharding.parse(entry[key])
        if tensor is not None:
            sharding.check(plan.mesh, plan.graph.tensors[tensor].shape, f"{where}/{key}")
        return sharding
    except ShardingError as error:
        problems += _under(f"{where}/{key}", error)
        return None


def _under(where: str, error: ShardingError) -> list[Problem]:
    """The error's problems at `where`: its pointers are absolute, relative to `where`, or empty."""
    return [Problem(p.where if p.where.startswith("/") else f"{where}/{p.where}" if p.where else where, p.message)
            for p in error.problems]


def _unknown_keys(entry: Mapping[str, Any], known: frozenset[str] | set[str], where: str) -> list[Problem]:
    return [Problem(f"{where}/{pointer((key,))[1:]}", f"unknown key {key!r}; expected one of {sorted(known)}")
            for key in entry if key not in known]

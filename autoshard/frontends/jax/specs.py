"""A plan as JAX shardings for one function: a pytree of input `PartitionSpec`s matching the
user's arguments, a pytree of output specs matching the results, and the spec to constrain each
planned value to, where it is produced and where a consumer needs it resharded.

The plan comes as `make_plan` returned it (a `PlanResult` or its `Plan`) or as the document read
back from `plan.json`; the function is imported again at the arguments' shapes, and the plan read
against that graph, so every value is found by the name the planned graph gave it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from autoshard.delivery.partition_specs import partition_spec, spec_problem
from autoshard.errors import InputError, Problem
from autoshard.frontends.jax.importer import Imported, import_function
from autoshard.frontends.jax.runtime import require_jax
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.planning.make_plan import PlanResult
from autoshard.planning.plan import Plan, plan_to_json
from autoshard.planning.plan_contract import read_plan
from autoshard.planning.report import delivered_shardings
from autoshard.planning.sequence_layout import refuse_balanced
from autoshard.resharding import Price, bytes_moved_price
from autoshard.sharding import Sharding


@dataclass(frozen=True)
class JaxShardings:
    """`in_specs` / `out_specs`: pytrees of `PartitionSpec` shaped like the arguments and results;
    `produced`: value id -> spec where the value is made; `delivered`: value id -> spec of the one
    copy its uses read it from, for a value the plan reshards once for several uses (a weight
    gathered for its forward and backward reads); `required`: (eqn index, operand position) ->
    spec an operand is resharded to before that equation, from the delivered copy if there is one;
    `constraints`: graph tensor -> spec, the intermediates' as produced (for reading)."""

    in_specs: Any
    out_specs: Any
    produced: dict[int, Any]
    delivered: dict[int, Any]
    required: dict[tuple[int, int], Any]
    constraints: dict[str, Any]
    imported: Imported
    plan: Plan

    def named(self, mesh: Any) -> tuple[Any, Any]:
        """`in_specs` and `out_specs` as `NamedSharding`s on `mesh` (for `jax.device_put`, `jax.jit`)."""
        jax, sharding = require_jax(), require_jax("jax.sharding")

        def is_spec(value: Any) -> bool:
            return isinstance(value, sharding.PartitionSpec)

        def named(spec: Any) -> Any:
            return sharding.NamedSharding(mesh, spec)

        return (jax.tree_util.tree_map(named, self.in_specs, is_leaf=is_spec),
                jax.tree_util.tree_map(named, self.out_specs, is_leaf=is_spec))


def plan_document(plan: PlanResult | Plan | dict[str, Any]) -> dict[str, Any]:
    if isinstance(plan, PlanResult):
        plan = plan.plan
    if isinstance(plan, Plan):
        return plan_to_json(plan)
    if not isinstance(plan, dict):
        raise InputError(f"expected a plan (make_plan's result or plan.json's document), got {type(plan).__name__}",
                         "plan")
    return plan


def plan_mesh(document: dict[str, Any]) -> Mesh:
    try:
        axes = document["mesh"]["axes"]
        return Mesh(tuple(a["name"] for a in axes), tuple(a["size"] for a in axes))
    except (KeyError, TypeError):
        raise InputError('expected {"axes": [{"name": ..., "size": ...}, ...]}', "plan/mesh") from None


def to_partition_spec(sharding: Sharding) -> Any:
    return require_jax("jax.sharding").PartitionSpec(*(tuple(a) if isinstance(a, list) else a
                                                        for a in partition_spec(sharding)))


def partition_specs(f: Any, plan: PlanResult | Plan | dict[str, Any], *args: Any,
                    parameters: Sequence[int] | None = None, price: Price | None = None) -> JaxShardings:
    """The plan's shardings for `f(*args)` (`args` may be arrays or `jax.ShapeDtypeStruct`s).
    `price` chooses, as for `partition`, the sharding a value read by several uses is delivered in
    (default: bytes moved); pass the one the plan was priced with (`hardware.collective_seconds`).

    Raises an InputError naming the value when an argument or result cannot be placed as planned
    (uneven, or explicit offsets); a partial intermediate gets no spec where it is produced (JAX
    cannot write one down), only the specs its consumers ask for."""
    refuse_balanced(plan, "autoshard.frontends.jax.partition_specs")
    jax = require_jax()
    document = plan_document(plan)
    mesh = plan_mesh(document)
    imported = import_function(f, args, parameters=parameters)
    graph = graph_from_json(imported.document, mesh)
    read = read_plan(document, graph, mesh)  # a plan.json document is a contract, here as in the CLI
    problems: list[Problem] = []

    def boundary_spec(tensor: str, sharding: Sharding, what: str) -> Any:
        problem = spec_problem(sharding, mesh, graph.tensors[tensor].shape, True)
        if problem:
            problems.append(Problem(f"{what} {tensor}", problem))
        return to_partition_spec(sharding)

    in_leaves = [boundary_spec(imported.tensors[a.id], read.storage[imported.tensors[a.id]], "input")
                 for a in imported.program.arguments]
    out_leaves = [boundary_spec(t, read.final(t), "output") if t is not None else to_partition_spec(Sharding())
                  for t in imported.outputs]
    if problems:
        raise InputError(problems)
    constraints = {t: to_partition_spec(read.produced(t)) for t in graph.producers
                   if spec_problem(read.produced(t), mesh, graph.tensors[t].shape, False) is None}
    produced = {value: constraints[t] for value, t in imported.tensors.items() if t in constraints}
    delivery = {t: d for t, d in delivered_shardings(read, price or bytes_moved_price(mesh)).items()
                 if d != read.produced(t) and spec_problem(d, mesh, graph.tensors[t].shape, False) is None}
    delivered = {value: to_partition_spec(delivery[t]) for value, t in imported.tensors.items() if t in delivery}
    required = {}
    for index, reads in imported.reads.items():
        for position, op_name, input_index in reads:
            op = graph.op_by_name[op_name]
            tensor = op.inputs[input_index]
            need = read.required(op, input_index)
            if need != delivery.get(tensor, read.produced(tensor)):
                required[(index, position)] = to_partition_spec(need)
    unflatten = jax.tree_util.tree_unflatten
    return JaxShardings(unflatten(imported.program.in_tree, in_leaves), unflatten(imported.program.out_tree, out_leaves),
                        produced, delivered, required, constraints, imported, read)

"""`shard(f, plan, mesh)`: `f` as a jitted function that XLA runs under the plan's shardings.

The function's program (`trace`) is evaluated primitive by primitive inside `jax.jit`, with
`in_shardings` and `out_shardings` from the plan and a `with_sharding_constraint` on every value
the plan shards where it is made, and on every operand the plan reshards before its consumer.
A value the plan reshards once for several uses (its delivered copy, as `partition` makes it) is
constrained once, at its first use, and the uses that read another sharding are resharded from
that copy, as the plan does: a weight gathered for the forward is sliced locally where the
update reads it split, not resharded again from its stored shards. XLA's partitioner then has
nothing left to choose but how to move the data between them.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from autoshard.errors import InputError
from autoshard.frontends.jax.runtime import require_jax
from autoshard.frontends.jax.specs import JaxShardings, partition_specs, plan_document, plan_mesh
from autoshard.frontends.jax.trace import Const
from autoshard.frontends.pipelined import refuse_pipelined
from autoshard.planning.make_plan import PlanResult
from autoshard.planning.plan import Plan
from autoshard.planning.sequence_layout import refuse_balanced
from autoshard.resharding import Price


class ShardedFunction:
    """Call it like `f`, with arrays on any device or none (they are placed as the plan says);
    `lower(*args)` gives jax's `Lowered` (`.compile().as_text()` is the partitioned HLO), and
    `shardings(*args)` the specs used. One jitted function per argument shapes, made on first call."""

    def __init__(self, f: Callable[..., Any], plan: dict[str, Any], mesh: Any, parameters: Sequence[int] | None,
                 price: Price | None):
        self.f, self.plan, self.mesh, self.parameters, self.price = f, plan, mesh, parameters, price
        self._jitted: dict[Any, tuple[Any, Any, JaxShardings]] = {}

    def __call__(self, *args: Any) -> Any:
        jax = require_jax()
        jitted, in_shardings, _ = self._build(args)
        return jitted(*jax.device_put(args, in_shardings))

    def lower(self, *args: Any) -> Any:
        return self._build(args)[0].lower(*args)

    def shardings(self, *args: Any) -> JaxShardings:
        return self._build(args)[2]

    def _build(self, args: Sequence[Any]) -> tuple[Any, Any, JaxShardings]:
        jax = require_jax()
        leaves, tree = jax.tree_util.tree_flatten(tuple(args))
        key = (tree, tuple((tuple(x.shape), str(x.dtype)) for x in leaves))
        if key not in self._jitted:
            specs = partition_specs(self.f, self.plan, *args, parameters=self.parameters, price=self.price)
            in_shardings, out_shardings = specs.named(self.mesh)
            body = _evaluator(specs, lambda spec: jax.sharding.NamedSharding(self.mesh, spec))
            self._jitted[key] = (jax.jit(body, in_shardings=in_shardings, out_shardings=out_shardings), in_shardings,
                                 specs)
        return self._jitted[key]


def _evaluator(specs: JaxShardings, named: Callable[[Any], Any]) -> Callable[..., Any]:
    """The program evaluated equation by equation, constrained as planned (dead equations skipped)."""
    jax = require_jax()
    program = specs.imported.program
    live = specs.imported.reads  # the equations the graph holds

    def constrain(value: Any, spec: Any) -> Any:
        return jax.lax.with_sharding_constraint(value, named(spec))

    def body(*args: Any) -> Any:
        env: dict[int, Any] = {a.id: leaf for a, leaf in zip(program.arguments, jax.tree_util.tree_leaves(args))}

        delivered: dict[int, Any] = {}  # value id -> its delivered copy, made at its first use

        def read(atom: Any) -> Any:
            return atom.value if isinstance(atom, Const) else env[atom]

        def operand(atom: Any) -> Any:
            if isinstance(atom, Const) or atom not in specs.delivered:
                return read(atom)
            if atom not in delivered:
                delivered[atom] = constrain(env[atom], specs.delivered[atom])
            return delivered[atom]

        for index, eqn in enumerate(program.eqns):
            if index not in live:
                continue
            ins = [operand(a) for a in eqn.inputs]
            for position in range(len(ins)):
                if (index, position) in specs.required:
                    ins[position] = constrain(ins[position], specs.required[(index, position)])
            outs = eqn.primitive.bind(*ins, **eqn.params)
            for value_id, value in zip(eqn.outputs, outs if eqn.primitive.multiple_results else [outs]):
                env[value_id] = constrain(value, specs.produced[value_id]) if value_id in specs.produced else value
        return jax.tree_util.tree_unflatten(program.out_tree, [read(a) for a in program.outputs])
    return body


def shard(f: Callable[..., Any], plan: PlanResult | Plan | dict[str, Any], mesh: Any,
          parameters: Sequence[int] | None = None, price: Price | None = None) -> ShardedFunction:
    """`f` jitted under `plan` on `mesh`, a `jax.sharding.Mesh` with the plan's axis names and sizes
    in the plan's order, of either axis type (explicit axes are run as auto ones: the plan fixes
    every sharding XLA would otherwise infer). `parameters` as for `from_function`; `price` as for
    `partition_specs` (the plan's own, `hardware.collective_seconds`, to deliver values as it does)."""
    refuse_pipelined(plan, "autoshard.frontends.jax.shard")
    refuse_balanced(plan, "autoshard.frontends.jax.shard")
    jax = require_jax()
    document = plan_document(plan)
    ours = plan_mesh(document)
    theirs = dict(zip(getattr(mesh, "axis_names", ()), getattr(getattr(mesh, "devices", None), "shape", ())))
    if list(theirs.items()) != list(zip(ours.axis_names, ours.shape)):
        given = ",".join(f"{n}={s}" for n, s in theirs.items()) or repr(mesh)
        raise InputError(f"the plan is for mesh {ours}; got {given}", "mesh")
    auto = jax.sharding.AxisType.Auto
    mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=(auto,) * len(ours.shape))
    return ShardedFunction(f, document, mesh, parameters, price)

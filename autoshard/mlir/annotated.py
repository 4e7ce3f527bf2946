"""The annotated IR: the whole (unpartitioned) program with a sharding on every value.

Every graph op is a real MLIR op (see `lower`); every graph input, parameter and op result is
followed by a `shard` op with its sharding as produced (partial ones included), and an operand
a consumer reads in another sharding goes through a `shard ... annotate_for_users` op first.
This is the input the seeds' materialisation (and upstream's `--shard-partition`) starts from.
"""

from __future__ import annotations

from autoshard.graph.model import topological_order
from autoshard.mlir.dialect import PARTIAL_NOTE, dialect as dialect_named
from autoshard.mlir.linalg import Operand, Spec
from autoshard.mlir.lower import LoweringContext, lower
from autoshard.mlir.module import Annotations, function_name, mesh_comment, module_text
from autoshard.mlir.text import Body
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding
from autoshard.spmd.program import canonical, check_plan


def emit_annotated(plan: Plan, dialect: str = "mesh") -> str:
    """The plan's annotated module in the `mesh` (seed reference) or `shard` (LLVM 22) spelling."""
    check_plan(plan)
    d = dialect_named(dialect)
    graph, mesh = plan.graph, plan.mesh
    b = Body()
    notes = Annotations(b, d, mesh)
    stored = [t for t in graph.tensors.values() if t.role != "intermediate"]
    args = [Operand(b.name(t.name), Spec(t.shape, t.dtype)) for t in stored]
    produced: dict[str, Operand] = {}
    for t, arg in zip(stored, args):
        produced[t.name] = notes.annotate(arg, plan.produced(t.name), False, f"{t.name}_sharded")
    views: dict[tuple[str, Sharding], Operand] = {}

    def read(tensor: str, need: Sharding, user: str) -> Operand:
        need = canonical(mesh, need)
        if need == canonical(mesh, plan.produced(tensor)):
            return produced[tensor]
        if (tensor, need) not in views:
            views[tensor, need] = notes.annotate(produced[tensor], need, True, f"{tensor}_for_{user}")
        return views[tensor, need]

    for op in topological_order(graph):
        option = plan.options[op.name]
        b.comment(f"op {op.name} ({op.kind}), option {option}")
        inputs = tuple(read(t, plan.required(op, i), op.name) for i, t in enumerate(op.inputs))
        specs = tuple(Spec(graph.tensors[t].shape, graph.tensors[t].dtype) for t in op.outputs)
        results = lower(b, LoweringContext(op, inputs, specs, op.nest.extents, lambda loop: None))
        for t, r in zip(op.outputs, results):
            produced[t] = notes.annotate(r, canonical(mesh, plan.produced(t)), False, f"{t}_sharded")
    outputs = [read(t, plan.final(t), "return") for t in graph.outputs]
    comments = [f"autoshard annotated IR: graph {graph.name!r} on mesh {mesh} ({d.name} dialect)", mesh_comment(mesh),
                "every value is annotated as produced; annotate_for_users gives the sharding a consumer reads"]
    if not d.partial_in_sharding and any(plan.produced(t).is_partial for t in graph.tensors):
        comments.append(PARTIAL_NOTE)
    return module_text(d, mesh, comments, function_name(graph.name), args, outputs, b)

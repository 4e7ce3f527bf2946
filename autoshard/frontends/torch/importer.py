"""`torch.export` program -> `autoshard.graph/v1` graph, through the aten table.

Names: parameters and buffers by their fully qualified names (`layers.0.wq.weight`), user inputs
by their argument names, intermediates by FX node names (an aten op lowered to several graph ops
names its helpers `<node>.<role>` and its value `<node>`). Each op keeps the module it was
called in. The names only depend on the module and the example inputs, so a program exported
again imports to the same graph.

The routed experts of a mixture-of-experts layer (tokens sorted by expert, a grouped matmul) are
a chain no single row lowers; `routing` finds it and writes its dense dispatch in its place (every
expert on every token, exact), or, given an `ExpertCapacity`, `capacity` writes the routed dispatch
at a static capacity (k * capacity_factor experts' worth per token, expert-parallel by all-to-alls).

Nodes no row lowers (mask and position bookkeeping, anything new) stay opaque: their values
enter the graph as inputs of their true shapes, pinned replicated, and are computed by PyTorch
itself when a plan runs; the values they read are pinned replicated too. A warning names them;
`strict=True` makes them an error.

Every path imports one canonical form of the program (`canonical_program`): a plain
`torch.export.export(...)` is decomposed by `run_decompositions({})`, a program already decomposed is
taken as it is. So the plan `autoshard import torch` makes applies to the program a user exports.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from autoshard.errors import InputError, Problem
from autoshard.frontends.layering import graph_keeping_what_holds, tag_layers
from autoshard.frontends.torch.aten import ATEN, CHECKS, COMPLEX_ROWS, target_key
from autoshard.frontends.torch.capacity import ExpertCapacity, absorbed_views, lower_capacity_experts
from autoshard.frontends.torch.lowering import Lowering, Step, Unsupported
from autoshard.frontends.torch.routing import GROUPED_MM, RoutedExperts, find_routed_experts, lower_routed_experts
from autoshard.frontends.torch.runtime import require_torch
from autoshard.frontends.torch.values import (as_real, dtype_name, is_complex, is_empty, reads_or_makes_complex,
                                              value_dtype, value_shape)
from autoshard.graph.builder import CONSTANT_VALUE_LIMIT, GraphBuilder, constant_value
from autoshard.graph.model import Graph
from autoshard.models.training import add_training_step, weighted_sum_loss
from autoshard.ops import OpError
from autoshard.ops.differentiate import depends_on

torch = require_torch()
from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402  (after the check above)


@dataclass(frozen=True)
class OpaqueNode:
    """A node kept out of the op table: its value is a replicated graph input."""

    name: str  # the FX node, and the graph input holding its value
    target: str  # the aten op
    module: str  # the module path it was called in ("" at the top level)
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.target}{', in ' + self.module if self.module else ''}): {self.reason}"


@dataclass
class ImportedProgram:
    program: Any  # the canonical ExportedProgram the graph was imported from, whose nodes the steps call
    document: dict[str, Any]  # the graph, `autoshard.graph/v1`
    graph: Graph
    steps: list[Step]  # program order; opaque nodes are steps too
    opaque: list[OpaqueNode]
    user_inputs: list[str]  # the graph inputs the module's arguments become, in order
    parameters: dict[str, str] = field(default_factory=dict)  # graph tensor -> placeholder (parameters and buffers)
    scalars: dict[str, tuple[Any, str]] = field(default_factory=dict)  # rank-0 inputs standing for numbers
    outputs: list[str] = field(default_factory=list)  # graph tensors of the module's outputs, in order

    @property
    def warnings(self) -> list[str]:
        return [f"opaque op {n}" for n in self.opaque]


def import_program(exported_program: Any, strict: bool = False, training: bool = False,
                   name: str | None = None, batch_dim: int | None = None,
                   expert_capacity: ExpertCapacity | None = None) -> ImportedProgram:
    """The graph of an `ExportedProgram`, plain or decomposed, in its canonical form
    (`canonical_program`).

    `training=True` adds the loss `sum(output * labels)` on the first output, the backward pass
    and Adam, by autoshard's own differentiation (as `autoshard generate --training`).
    `batch_dim` is the dim of every tensor argument (and of the labels) that carries the batch,
    so that a plan can split the step into microbatches; torch.distributed.pipelining splits
    arguments along dim 0 by default.
    `expert_capacity` plans every routed-experts chain at that static capacity instead of as the
    dense dispatch; a program whose experts are not in the recognised form is then refused.
    """
    ep = canonical_program(exported_program)
    _check_static(ep)
    signature = ep.graph_signature
    builder = GraphBuilder(name or "exported_program", "f32")
    lw = Lowering(builder)
    user_inputs, parameters = _add_placeholders(ep, lw, batch_dim)

    opaque: list[OpaqueNode] = []
    nodes = list(ep.graph.nodes)
    routed = {m.anchor.name: m for m in find_routed_experts(nodes)}
    rewritten = {n.name for m in routed.values() for n in m.covered}
    if expert_capacity is not None:
        _check_all_routed(nodes, rewritten)
        rewritten |= {name for m in routed.values() for name in absorbed_views(m)}
    for node in nodes:
        if node.op != "call_function" or target_key(node.target) in CHECKS:
            continue
        if node.name in routed and expert_capacity is not None:
            _lower_capacity(lw, routed[node.name], expert_capacity)
        elif node.name in routed:
            _lower_routed(lw, routed[node.name], opaque)
        elif node.name not in rewritten:  # a rewritten chain is lowered at its last node
            _lower_node(lw, node, opaque)
    builder.module = ""
    tag_layers(builder)

    outputs = [lw.tensor(n) for n, spec in zip(_output_nodes(ep), signature.output_specs)
               if spec.kind.name == "USER_OUTPUT" and n is not None and getattr(n, "name", None) in lw.values]
    if strict and opaque:
        raise InputError([Problem(f"/nodes/{n.name}", f"opaque op {n}") for n in opaque])
    if opaque:
        warnings.warn(f"{len(opaque)} op(s) outside the aten table are kept opaque and replicated: "
                      + "; ".join(str(n) for n in opaque), stacklevel=2)
    if training:
        _add_training(lw, opaque, outputs, batch_dim)
    else:
        builder.mark_outputs(*outputs)
    document = builder.document()
    # Opaque values are computed replicated, so are the values opaque ops read (the plan does not
    # see those reads: a sharded one would be gathered outside it); numbers are rank 0.
    read = [t for step in lw.steps if step.opaque for t in step.inputs if builder.tensors[t].role == "intermediate"]
    produced = [t for step in lw.steps if step.opaque for t in step.outputs if t]
    pinned = list(dict.fromkeys(produced + read + list(lw.scalars)))
    if pinned:
        document["constraints"] = [{"tensor": t, "split_axes": [], "required": True} for t in pinned]
    return ImportedProgram(ep, document, graph_keeping_what_holds(document), lw.steps, opaque, user_inputs, parameters,
                           lw.scalars, outputs)


def canonical_program(exported_program: Any) -> Any:
    """The program decomposed by `run_decompositions({})`, so that no in-place op survives while
    `linear`, `silu` and attention stay whole. A program already in ATen form (decomposed) is
    returned as it is: decomposing again would renumber its nodes, whose names the plan's ops
    carry. (`_disable_current_modes` is private to torch, whose version is pinned.)"""
    if not isinstance(exported_program, torch.export.ExportedProgram):
        raise InputError(f"expected a torch.export.ExportedProgram, got {type(exported_program).__name__}",
                         "exported_program")
    if exported_program.dialect == "ATEN":
        return exported_program
    # Decomposing traces the program: a dispatch mode the caller runs under (DTensor's simulated
    # ranks, a communication log) must not see that tracing, which it would break or miscount.
    with _disable_current_modes():
        return exported_program.run_decompositions({})


def _add_placeholders(ep: Any, lw: Lowering, batch_dim: int | None) -> tuple[list[str], dict[str, str]]:
    """The program's arguments, parameters and buffers as graph inputs and parameters; returns the
    user inputs in order and the parameters and buffers (graph tensor -> qualified name).

    A frozen parameter (`requires_grad=False`, as Whisper's position table) is an input, as a
    buffer is: a training step neither differentiates nor updates it.

    A tied weight (one tensor under two names, as a language model's embedding and head) is one
    graph parameter under its first name, read by both uses: its gradient sums both, and it is
    updated once. torch.export gives it a placeholder per name and may read it through either."""
    builder = lw.builder
    parameters: dict[str, str] = {}
    user_inputs: list[str] = []
    tied: dict[int, str] = {}  # id of a parameter's stored tensor -> its graph tensor
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for spec in ep.graph_signature.input_specs:
        node = placeholders[spec.arg.name]
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue  # a constant argument, specialised into the program
        kind = spec.kind.name
        graph_name = spec.target if kind != "USER_INPUT" else spec.arg.name
        if is_empty(value):
            raise InputError(f"{kind.lower().replace('_', ' ')} {graph_name!r} has shape {_shape(node)}, with a "
                             "zero-size dim: export with example inputs of the sizes to plan for",
                             f"/inputs/{graph_name}")
        if kind == "PARAMETER" and ep.state_dict[spec.target].requires_grad:  # a frozen one is never trained
            stored = id(ep.state_dict[spec.target])
            if stored in tied:
                lw.values[node.name] = tied[stored]
                continue
            lw.values[node.name] = tied[stored] = builder.parameter(graph_name, _shape(node), _dtype(node))
        else:  # buffers, frozen parameters and constants hold no batch
            known = _constant_value(ep.constants[spec.target]) if kind == "CONSTANT_TENSOR" else None
            lw.values[node.name] = builder.input(graph_name, _shape(node), _dtype(node),
                                                 batch_dim=batch_dim if kind == "USER_INPUT" else None, value=known)
            if kind == "CONSTANT_TENSOR":
                lw.constants[lw.values[node.name]] = ep.constants[spec.target]
        if kind == "USER_INPUT":
            user_inputs.append(graph_name)
        else:
            parameters[graph_name] = spec.target
    return user_inputs, parameters


def _constant_value(constant: Any) -> list[float | int | bool] | None:
    """The contents the graph carries for a constant tensor of the program (small, real ones only:
    a complex constant is imported as real pairs)."""
    if not isinstance(constant, torch.Tensor) or constant.is_complex() or constant.numel() > CONSTANT_VALUE_LIMIT:
        return None  # a closed-over weight is not widened only to be refused
    wide = constant.detach().cpu()
    return constant_value((wide.double() if wide.is_floating_point() else wide).numpy())


def _lower_node(lw: Lowering, node: Any, opaque: list[OpaqueNode]) -> None:
    """The node through its row of the aten table, or kept opaque if it has none that fits."""
    key, module = target_key(node.target), _module_path(node)
    value = node.meta.get("val")
    if is_empty(value):
        lw.empty[node.name] = value
        return
    lw.builder.module = module
    lower = ATEN.get(key)
    reason = "no row in the aten table" if lower is None else ""
    if lower is not None and key not in COMPLEX_ROWS and reads_or_makes_complex(node):
        lower, reason = None, "complex values go through view_as_real, view_as_complex, reshapes and mul only"
    if lower is not None:
        undo = _undo_point(lw)
        try:
            lw.values[node.name] = lower(lw, node)
            _check_shape(lw, node)
            return
        except (Unsupported, OpError) as error:
            reason = str(error)
            undo()  # an opaque node leaves no half-lowered ops
    opaque.append(OpaqueNode(node.name, key, module, reason))
    _keep_opaque(lw, node)


def _lower_routed(lw: Lowering, match: RoutedExperts, opaque: list[OpaqueNode]) -> None:
    """A routed-experts chain as its dense dispatch; if that fails, its nodes one by one."""
    lw.builder.module = _module_path(match.anchor)
    undo = _undo_point(lw)
    try:
        lw.values[match.anchor.name] = lower_routed_experts(lw, match)
        _check_shape(lw, match.anchor)
        return
    except (Unsupported, OpError):
        undo()
        names = {n.name for n in match.covered}
        for value in [v for v in lw.values if v.split("#")[0] in names]:
            del lw.values[value]
    for node in match.covered:
        if target_key(node.target) not in CHECKS:
            _lower_node(lw, node, opaque)


def _check_all_routed(nodes: list[Any], rewritten: set[str]) -> None:
    """Capacity was asked for: every grouped matmul must be in a recognised routed-experts chain."""
    grouped = [n.name for n in nodes if n.op == "call_function" and target_key(n.target) in GROUPED_MM]
    outside = [n for n in grouped if n not in rewritten]
    if not grouped or outside:
        found = f"grouped matmuls {outside} outside it" if outside else "no grouped matmul"
        raise InputError("expected the routed experts of transformers' experts implementation (expert ids sorted, "
                         "histc offsets, two grouped matmuls, the weighted slots restored and summed over the "
                         f"top-k) to plan at a capacity, found {found}", "expert_capacity")


def _lower_capacity(lw: Lowering, match: RoutedExperts, option: ExpertCapacity) -> None:
    """A routed-experts chain at `option`'s capacity; a chain that does not lower is refused."""
    lw.builder.module = _module_path(match.anchor)
    try:
        lw.values[match.anchor.name] = lower_capacity_experts(lw, match, option)
        _check_shape(lw, match.anchor)
    except (Unsupported, OpError) as error:
        raise InputError(f"the routed experts ending at {match.anchor.name} do not lower at a capacity: {error}",
                         f"/nodes/{match.anchor.name}") from None


def _undo_point(lw: Lowering) -> Any:
    """A function dropping what lowering adds from now on (ops, steps, scalar inputs)."""
    steps, mark = len(lw.steps), lw.builder.mark()

    def undo() -> None:
        lw.builder.rollback(mark)
        del lw.steps[steps:]
        for scalar in [s for s in lw.scalars if s not in lw.builder.tensors]:
            del lw.scalars[scalar]
    return undo


def _add_training(lw: Lowering, opaque: list[OpaqueNode], outputs: list[str], batch_dim: int | None) -> None:
    """The loss, backward and Adam. An opaque op reading a value computed from the parameters
    would stop their gradients there (its result is an input to the graph), so it is refused."""
    builder = lw.builder
    if not outputs:
        raise InputError("the program has no tensor output to train on", "training")
    trained = depends_on(builder, set(builder.tensors_with_role("parameter")))
    steps = [step for step in lw.steps if step.opaque]  # one per opaque node, in the same order
    blocking = [(node, sorted(trained.intersection(step.inputs))) for node, step in zip(opaque, steps)
                if trained.intersection(step.inputs)]
    if blocking:
        raise InputError([Problem(f"/nodes/{node.name}", f"cannot differentiate through opaque op {node}: it reads "
                                  f"{read}, computed from parameters") for node, read in blocking])
    loss, seeds = weighted_sum_loss(builder, outputs[0], batch_dim=batch_dim)
    try:
        add_training_step(builder, loss, seeds)
    except ValueError as error:  # a parameter no gradient reaches, or an op without a gradient
        raise InputError(f"cannot differentiate the imported program: {error}", "training") from None


def _keep_opaque(lw: Lowering, node: Any) -> None:
    """The node's tensor values become replicated graph inputs; PyTorch computes them."""
    value = node.meta.get("val")
    values = value if isinstance(value, (tuple, list)) else [value]
    outputs = []
    for i, v in enumerate(values):
        if not isinstance(v, torch.Tensor) or is_empty(v):
            outputs.append("")
            continue
        name = node.name if len(values) == 1 and not isinstance(value, (tuple, list)) else f"{node.name}.{i}"
        try:
            dtype = value_dtype(v)
        except Unsupported as error:
            raise InputError(f"opaque op {node.name} ({target_key(node.target)}): {error}", f"/nodes/{node.name}") from None
        tensor = lw.builder.input(name, value_shape(v), dtype)
        outputs.append(tensor)
        if isinstance(value, (tuple, list)):
            lw.values[f"{node.name}#{i}"] = tensor
        else:
            lw.values[node.name] = tensor
    lw.steps.append(Step(tuple(outputs), tuple(_node_inputs(lw, node)), _opaque_call(lw, node), opaque=True))


def _node_inputs(lw: Lowering, node: Any) -> list[str]:
    return [lw.values[n.name] for n in node.all_input_nodes if n.name in lw.values]


def _opaque_call(lw: Lowering, node: Any) -> Any:
    """Call the node's target with its tensor arguments replaced, in order, by the given values
    (an empty argument, which no graph tensor holds, by an empty tensor of its shape)."""
    known = {n.name for n in node.all_input_nodes if n.name in lw.values}
    empty = {n.name: lw.empty[n.name] for n in node.all_input_nodes if n.name in lw.empty}
    complex_ = {n.name for n in node.all_input_nodes if is_complex(n.meta.get("val"))}

    def call(*values: Any) -> Any:
        supplied = iter(values)

        def substitute(a: Any) -> Any:
            if hasattr(a, "name") and a.name in known:
                value = next(supplied)
                return torch.view_as_complex(value.contiguous()) if a.name in complex_ else value
            if hasattr(a, "name") and a.name in empty:
                return torch.empty(empty[a.name].shape, dtype=empty[a.name].dtype)
            if isinstance(a, (list, tuple)):
                return type(a)(substitute(x) for x in a)
            return a
        result = node.target(*substitute(tuple(node.args)), **{k: substitute(v) for k, v in node.kwargs.items()})
        if isinstance(result, (tuple, list)):
            return type(result)(as_real(r) for r in result)
        return as_real(result)
    return call


def _output_nodes(ep: Any) -> list[Any]:
    (output,) = [n for n in ep.graph.nodes if n.op == "output"]
    return list(output.args[0])


def _module_path(node: Any) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else ""


def _shape(node: Any) -> list[int]:
    return value_shape(node.meta["val"])


def _dtype(node: Any) -> str:
    try:
        return dtype_name(node.meta["val"].dtype)
    except Unsupported as error:
        raise InputError(f"input {node.name}: {error}", f"/inputs/{node.name}") from None


def _check_shape(lw: Lowering, node: Any) -> None:
    """The op table's shape for the node's value must be the one torch.export recorded."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return
    ours = list(lw.shape(lw.values[node.name]))
    if ours != _shape(node):
        raise Unsupported(f"the op table gives shape {ours}, torch {_shape(node)}")


def _check_static(ep: Any) -> None:
    problems = []
    for node in ep.graph.nodes:
        value = node.meta.get("val")
        values = value if isinstance(value, (tuple, list)) else [value]
        for v in values:
            if isinstance(v, torch.Tensor):
                symbolic = [str(s) for s in v.shape if not isinstance(s, int)]
                if symbolic:
                    problems.append(Problem(f"/nodes/{node.name}", f"shape {[str(s) for s in v.shape]} has symbolic sizes "
                                            f"{symbolic}; export with static shapes (no dynamic_shapes), at the size to plan for"))
                    break
    if problems:
        raise InputError(problems)

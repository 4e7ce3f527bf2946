"""Activation recomputation: a training step rewritten so that a layer's backward reads values
computed again from what the forward kept, instead of values held from the forward.

- `full`: a layer keeps only what it reads from outside itself (its input, the masks and other
  step inputs); its whole forward runs again just before its backward, as Megatron-LM's and
  PyTorch's checkpointed layers do (ops whose values the backward does not read included: the
  rerun is one call of the layer).
- `selective` (Korthikanti et al.'s): only the attention core is computed again, the values
  between a contraction of two activations (Q·Kᵀ) and the contraction of two activations that
  reads them (the probabilities times V): scores, masking, softmax, dropout. Layers whose
  attention is one fused `attention` op have none (its backward already recomputes the scores).
- `routed`: in layers with routed experts, as `full` but the experts' inputs and outputs are kept:
  the tokens dispatched to the experts and what the experts give back to the combine, the values
  between the experts' contractions (an activation times a stack of weights, one per expert,
  sharing a parallel loop with it) and the contractions routing tokens to and from them. The
  recomputed forward reads them instead of dispatching and combining again, so under expert
  parallelism its experts run again without the all-to-alls that move their tokens (as
  DeepSeek-V3 keeps them); only the ops the backward's values need are copied. Layers without
  routed experts have none.
- `none`: the step as it is.

A mode may also be given per layer (`{layer: mode}`, layers not named keep everything): a plan
that recomputes some layers of a stage and keeps others, as `plan --recompute auto` chooses
under a pipeline's memory (`planning.recompute_choice`).

The copies are ops of their own (`recompute.<op>`, results `recompute.<value>`), in the layer,
listed right before its first backward op: the order that lists them there runs them after the
layers after it are done, so a kept value's live range ends in the forward and the copies' time
and collectives count in the backward, where a plan prices them (`Graph.phases` calls them
backward: no output needs them but the gradients). A copy runs with its forward op's option (the
formulation ties the two), so the recomputed forward moves what the forward moved.
"""

from __future__ import annotations

from typing import Mapping, Union

from autoshard.errors import InputError, Problem
from autoshard.graph.model import Graph, Op
from autoshard.graph.schema import graph_from_json, graph_to_json
from autoshard.mesh import Mesh
from autoshard.ops.loops import PARALLEL

MODES = ("none", "selective", "full", "routed")
PREFIX = "recompute."
CONTRACTIONS = ("matmul", "batch_matmul", "dot_general")

# One mode for every layer, or a mode per layer (layers not named: none)
Recompute = Union[str, Mapping[int, str]]


def with_recomputation(graph: Graph, mode: Recompute, mesh: Mesh | None = None) -> Graph:
    """`graph` with every layer's backward reading recomputed values as `mode` says (one mode,
    or one per layer)."""
    per_layer = _checked(mode)
    if not per_layer:
        return graph
    if not graph.gradients:
        raise InputError("recomputation rewrites a training step's backward; this graph has no gradients "
                         "(generate or import it with --training)", "recompute")
    phases = graph.phases
    by_layer: dict[int, dict[str, list[Op]]] = {}
    for op in graph.order:
        if op.layer is not None and phases[op.name] in ("forward", "backward"):
            by_layer.setdefault(op.layer, {"forward": [], "backward": []})[phases[op.name]].append(op)
    if not by_layer:
        raise InputError("recomputation works layer by layer; no op of this graph names its layer", "recompute")
    parameters = {t.name for t in graph.tensors.values() if t.role == "parameter"}
    copies: dict[str, list[Op]] = {}  # first backward op of a layer -> the copies listed before it
    renamed: dict[str, dict[str, str]] = {}  # backward op -> its input -> the recomputed value
    if isinstance(per_layer, dict) and set(per_layer) - set(by_layer):
        raise InputError(f"names layers the graph does not have: {sorted(set(per_layer) - set(by_layer))[:5]} "
                         f"(its layers: {min(by_layer)} to {max(by_layer)})", "recompute")
    for layer in sorted(by_layer):
        forward, backward = by_layer[layer]["forward"], by_layer[layer]["backward"]
        layer_mode = per_layer.get(layer, "none") if isinstance(per_layer, dict) else per_layer
        if not forward or not backward or layer_mode == "none":
            continue
        chosen = _recomputed(forward, backward, parameters, layer_mode)
        if not chosen:
            continue
        made = {t for op in chosen for t in op.outputs}
        copies[backward[0].name] = chosen
        for op in backward:
            if any(t in made for t in op.inputs):
                renamed[op.name] = {t: PREFIX + t for t in op.inputs if t in made}
    if not copies:
        return graph
    _check_names(graph, copies)
    return graph_from_json(_rewritten(graph, copies, renamed), mesh)


def _checked(mode: Recompute) -> str | dict[int, str]:
    """The mode as one string, or as {layer: mode} without the layers that keep everything; ""
    when nothing is recomputed."""
    if isinstance(mode, str):
        if mode not in MODES:
            raise InputError(f"must be one of {list(MODES)}, got {mode!r}", "recompute")
        return "" if mode == "none" else mode
    if not isinstance(mode, Mapping):
        raise InputError(f"expected a mode ({list(MODES)}) or one per layer, got {mode!r}", "recompute")
    problems = [Problem(f"recompute[{layer!r}]", f"expected a layer number and one of {list(MODES)}, got {value!r}")
                for layer, value in mode.items()
                if isinstance(layer, bool) or not isinstance(layer, int) or value not in MODES]
    if problems:
        raise InputError(problems)
    return {layer: value for layer, value in mode.items() if value != "none"}


def _check_names(graph: Graph, copies: dict[str, list[Op]]) -> None:
    """The copies' names are free: a value or op already named like one would be taken over."""
    taken = [PREFIX + name for ops in copies.values() for op in ops for name in (op.name, *op.outputs)
             if PREFIX + name in graph.tensors or PREFIX + name in graph.op_by_name]
    if taken:
        raise InputError(f"the graph already has {taken[:3]}{' ...' if len(taken) > 3 else ''}, names that "
                         f"recomputation gives its copies ({PREFIX}<name>): was it recomputed before?", "recompute")


def _recomputed(forward: list[Op], backward: list[Op], parameters: set[str], mode: str) -> list[Op]:
    """The forward ops of one layer to copy, in order: those producing the values its backward
    reads (all of them, or the attention core's), and the ops of the layer these need again."""
    if mode == "full":
        return list(forward)  # the layer's forward runs again whole, as a checkpointed layer does
    own = {t for op in forward for t in op.outputs}
    read = {t for op in backward for t in op.inputs if t in own}
    kept: set[str] = set()
    if mode == "selective":
        read &= _attention_core(forward, parameters)
    elif mode == "routed":
        kept = _experts_boundary(forward, parameters)
        if not kept:
            return []
        read -= kept
    needed: set[str] = set()
    pending = list(read)
    producer = {t: op for op in forward for t in op.outputs}
    while pending:
        op = producer[pending.pop()]
        if op.name in needed:
            continue
        needed.add(op.name)
        if mode == "selective" and op.kind in CONTRACTIONS:
            continue  # the core starts at its first contraction, whose operands stay kept
        pending.extend(t for t in op.inputs if t in producer and t not in kept)
    return [op for op in forward if op.name in needed]


def _experts_boundary(forward: list[Op], parameters: set[str]) -> set[str]:
    """The routed experts' inputs made by another contraction (the dispatched tokens) and their
    outputs read by another contraction (the combine's): the values an expert-parallel plan moves
    between devices around the experts."""
    experts = [op for op in forward if _is_expert_contraction(op, parameters)]
    names = {op.name for op in experts}
    producer = {t: op for op in forward for t in op.outputs}
    readers: dict[str, list[Op]] = {}
    for op in forward:
        for t in op.inputs:
            readers.setdefault(t, []).append(op)
    inputs = {t for op in experts for t in op.inputs
              if t in producer and producer[t].kind in CONTRACTIONS and producer[t].name not in names}
    outputs = {t for op in experts for t in op.outputs
               if any(r.kind in CONTRACTIONS and r.name not in names for r in readers.get(t, ()))}
    return inputs | outputs


def _is_expert_contraction(op: Op, parameters: set[str]) -> bool:
    """An activation times a stack of weights sharing a parallel loop with it: each expert's
    weights applied to its own tokens (a dense layer's weights share only the contracted loop)."""
    if op.kind not in CONTRACTIONS or len(op.inputs) != 2 or sum(t in parameters for t in op.inputs) != 1:
        return False
    weights = 0 if op.inputs[0] in parameters else 1
    loops = [{loop for expr in m.results for loop in expr.loops} for m in op.nest.input_maps]
    return any(op.nest.iterator_types[loop] == PARALLEL for loop in loops[weights] & loops[1 - weights])


def _attention_core(forward: list[Op], parameters: set[str]) -> set[str]:
    """Values of the layer on a path from a contraction of two activations to a contraction of
    two activations reading them, the first one's result included."""
    producer = {t: op for op in forward for t in op.outputs}
    core: set[str] = set()
    for end in forward:
        if end.kind in CONTRACTIONS and not parameters & set(end.inputs):
            for start in end.inputs:
                core |= _path_to_contraction(start, producer, parameters, set())
    return core


def _path_to_contraction(tensor: str, producer: dict[str, Op], parameters: set[str], seen: set[str]) -> set[str]:
    """The values from `tensor` back to the result of a contraction of two activations, through
    ops that are not contractions (masking, softmax, dropout); their other inputs (a mask made in
    the layer) are not on the path. Empty if no such contraction is reached."""
    op = producer.get(tensor)
    if op is None or tensor in seen:
        return set()
    seen.add(tensor)
    if op.kind in CONTRACTIONS:
        return {tensor} if not parameters & set(op.inputs) else set()
    path: set[str] = set()
    for source in op.inputs:
        path |= _path_to_contraction(source, producer, parameters, seen)
    return path | {tensor} if path else set()


def _rewritten(graph: Graph, copies: dict[str, list[Op]], renamed: dict[str, dict[str, str]]) -> dict:
    document = graph_to_json(graph)
    entries = {entry["name"]: entry for entry in document["ops"]}
    ops = []
    for entry in document["ops"]:
        chosen = copies.get(entry["name"], ())
        copied = {t for op in chosen for t in op.outputs}
        for op in chosen:
            for t in op.outputs:
                document["tensors"][PREFIX + t] = {key: document["tensors"][t][key] for key in ("shape", "dtype")}
            ops.append(dict(entries[op.name], name=PREFIX + op.name, outputs=[PREFIX + t for t in op.outputs],
                            inputs=[PREFIX + t if t in copied else t for t in op.inputs]))
        if entry["name"] in renamed:
            entry = dict(entry, inputs=[renamed[entry["name"]].get(t, t) for t in entry["inputs"]])
        ops.append(entry)
    document["ops"] = ops
    return document


def stated_recompute(document: object) -> Recompute:
    """The recomputation a plan document was made with (`recompute`, default none: one mode, or
    an object of layer number -> mode for the layers recomputed): the graph it plans is the one
    given, rewritten so (`with_recomputation`)."""
    stated = document.get("recompute", "none") if isinstance(document, dict) else "none"
    if isinstance(stated, dict):
        problems = [Problem(f"/recompute/{layer}", f"expected a layer number naming one of {list(MODES)}, "
                                                   f"got {layer!r}: {mode!r}")
                    for layer, mode in stated.items() if not _is_layer_number(layer) or mode not in MODES]
        if problems:
            raise InputError(problems)
        return {int(layer): mode for layer, mode in stated.items()}
    if stated not in MODES:
        raise InputError(f"expected one of {list(MODES)} or an object of layer number -> mode, got {stated!r}",
                         "/recompute")
    return stated


def _is_layer_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def record_recompute(document: dict, recompute: Recompute) -> None:
    """A plan document says the recomputation its graph was rewritten with (none says nothing;
    per layer: the layers recomputed, by number)."""
    if isinstance(recompute, str):
        if recompute != "none":
            document["recompute"] = recompute
    elif any(mode != "none" for mode in recompute.values()):
        document["recompute"] = {str(layer): mode for layer, mode in sorted(recompute.items()) if mode != "none"}

"""Activation recomputation: a training step rewritten so that a layer's backward reads values
computed again from what the forward kept, instead of values held from the forward.

- `full`: a layer keeps only what it reads from outside itself (its input, the masks and other
  step inputs); every value its backward reads from its own forward is computed again, by copies
  of the forward ops that lead to it, just before the layer's backward.
- `selective` (Korthikanti et al.'s): only the attention core is computed again, the values
  between a contraction of two activations (Q·Kᵀ) and the contraction of two activations that
  reads them (the probabilities times V): scores, masking, softmax, dropout. Layers whose
  attention is one fused `attention` op have none (its backward already recomputes the scores).
- `none`: the step as it is.

The copies are ops of their own (`recompute.<op>`, results `recompute.<value>`), in the layer,
listed right before its first backward op: the order that lists them there runs them after the
layers after it are done, so a kept value's live range ends in the forward and the copies' time
and collectives count in the backward, where a plan prices them (`Graph.phases` calls them
backward: no output needs them but the gradients). The plan chooses their shardings as any op's.
"""

from __future__ import annotations

from typing import Iterable

from autoshard.errors import InputError
from autoshard.graph.model import Graph, Op
from autoshard.graph.schema import graph_from_json, graph_to_json
from autoshard.mesh import Mesh

MODES = ("none", "selective", "full")
PREFIX = "recompute."
CONTRACTIONS = ("matmul", "batch_matmul", "dot_general")


def with_recomputation(graph: Graph, mode: str, mesh: Mesh | None = None) -> Graph:
    """`graph` with every layer's backward reading recomputed values as `mode` says."""
    if mode not in MODES:
        raise InputError(f"must be one of {list(MODES)}, got {mode!r}", "recompute")
    if mode == "none":
        return graph
    if not graph.gradients:
        raise InputError("recomputation rewrites a training step's backward; this graph has no gradients "
                         "(generate or import it with --training)", "recompute")
    phases = graph.phases
    layers = sorted({op.layer for op in graph.ops if op.layer is not None})
    if not layers:
        raise InputError("recomputation works layer by layer; no op of this graph names its layer", "recompute")
    copies: dict[str, list[Op]] = {}  # first backward op of a layer -> the copies listed before it
    renamed: dict[str, dict[str, str]] = {}  # backward op -> its input -> the recomputed value
    for layer in layers:
        forward = [op for op in graph.order if op.layer == layer and phases[op.name] == "forward"]
        backward = [op for op in graph.order if op.layer == layer and phases[op.name] == "backward"]
        if not forward or not backward:
            continue
        chosen = _recomputed(graph, forward, backward, mode)
        if not chosen:
            continue
        made = {t for op in chosen for t in op.outputs}
        copies[backward[0].name] = chosen
        for op in backward:
            if any(t in made for t in op.inputs):
                renamed[op.name] = {t: PREFIX + t for t in op.inputs if t in made}
    if not copies:
        return graph
    return graph_from_json(_rewritten(graph, copies, renamed), mesh)


def _recomputed(graph: Graph, forward: list[Op], backward: list[Op], mode: str) -> list[Op]:
    """The forward ops of one layer to copy, in order: those producing the values its backward
    reads (all of them, or the attention core's), and the ops of the layer these need again."""
    own = {t for op in forward for t in op.outputs}
    read = {t for op in backward for t in op.inputs if t in own}
    if mode == "selective":
        read &= _attention_core(graph, forward)
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
        pending.extend(t for t in op.inputs if t in producer)
    return [op for op in forward if op.name in needed]


def _attention_core(graph: Graph, forward: list[Op]) -> set[str]:
    """Values of the layer on a path from a contraction of two activations to a contraction of
    two activations reading them, the first one's result included."""
    producer = {t: op for op in forward for t in op.outputs}
    parameters = {t.name for t in graph.tensors.values() if t.role == "parameter"}
    between = [op for op in forward if op.kind in CONTRACTIONS and not parameters & set(op.inputs)]
    core: set[str] = set()
    for end in between:
        # walk back from the second contraction's operands to a first contraction
        for start in end.inputs:
            path = _path_to_contraction(start, producer, parameters)
            core |= path
    return core


def _path_to_contraction(tensor: str, producer: dict[str, Op], parameters: set[str]) -> set[str]:
    """The values from `tensor` back to the result of a contraction of two activations, if every
    op on the way has one input from the layer (a chain: masking, softmax, dropout)."""
    path: set[str] = set()
    while tensor in producer:
        path.add(tensor)
        op = producer[tensor]
        if op.kind in CONTRACTIONS:
            return path if not parameters & set(op.inputs) else set()
        inside = [t for t in op.inputs if t in producer]
        if len(inside) != 1:
            return set()
        tensor = inside[0]
    return set()


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


def recomputed_ops(graph: Graph) -> Iterable[Op]:
    """The ops a recomputation added."""
    return (op for op in graph.ops if op.name.startswith(PREFIX))


def stated_recompute(document: object) -> str:
    """The recomputation a plan document was made with (`recompute`, default none): the graph it
    plans is the one given, rewritten so (`with_recomputation`)."""
    stated = document.get("recompute", "none") if isinstance(document, dict) else "none"
    if stated not in MODES:
        raise InputError(f"expected one of {list(MODES)}, got {stated!r}", "/recompute")
    return stated

"""Layers of a step: which repeated layer each op belongs to, numbered from module paths, and the
checks that hold any layering a pipeline can cut: each layer's forward ops contiguous, the
backward ranges in reverse layer order, and the optimizer ops after every other op (phases from
`Graph.phases`).
"""

from __future__ import annotations

import re
from typing import Iterable

from autoshard.errors import Problem
from autoshard.graph.model import Graph


def layer_problems(graph: Graph) -> list[Problem]:
    """Where the declared layers cannot be cut into stages, each problem naming the op (none when
    no op declares a layer)."""
    if all(op.layer is None for op in graph.ops):
        return []
    phases = graph.phases
    where = {op.name: f"/ops/{i}/layer" for i, op in enumerate(graph.ops)}
    problems = []
    forward = [op for op in graph.order if phases[op.name] == "forward"]
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for position, op in enumerate(forward):
        if op.layer is not None:
            first.setdefault(op.layer, position)
            last[op.layer] = position
    for layer, start in first.items():
        for op in forward[start:last[layer] + 1]:
            if op.layer != layer:
                problems.append(Problem(where[op.name], f"op {op.name!r} ({_named(op.layer)}) runs between forward ops of "
                                                        f"layer {layer}; a layer's forward ops must be contiguous"))
                break
    backward = [op for op in graph.order if phases[op.name] == "backward" and op.layer is not None]
    for before, op in zip(backward, backward[1:]):
        if op.layer > before.layer:
            problems.append(Problem(where[op.name], f"backward op {op.name!r} of layer {op.layer} runs after backward op "
                                                    f"{before.name!r} of layer {before.layer}; backward runs layers in "
                                                    f"reverse order"))
            break
    seen_tail = None
    for op in graph.order:
        if phases[op.name] == "optimizer":
            seen_tail = seen_tail or op
        elif seen_tail is not None:
            problems.append(Problem(where[op.name], f"{phases[op.name]} op {op.name!r} runs after optimizer op "
                                                    f"{seen_tail.name!r}; the optimizer ops must come last, once per step"))
            break
    return problems


def _named(layer: int | None) -> str:
    return "no layer" if layer is None else f"layer {layer}"


_INDEX = re.compile(r"^(?:(.*?)\.)?(\d+)(?:\.|$)")


def layers_of_module_paths(paths: Iterable[str]) -> dict[str, int]:
    """Module path -> layer number, for the paths inside a repeated stack: a prefix followed by an
    index (`layers.3.`, `transformer.h.3.`, `encoder.layer.3.`) that appears with at least two
    indices. Each (prefix, index) gets its own number in order of first appearance, so an
    encoder's and a decoder's stacks do not share numbers."""
    found: dict[str, tuple[str, int]] = {}
    indices: dict[str, set[int]] = {}
    for path in dict.fromkeys(paths):
        match = _INDEX.match(path)
        if match:
            prefix = match.group(1) or ""
            found[path] = (prefix, int(match.group(2)))
            indices.setdefault(prefix, set()).add(int(match.group(2)))
    numbers: dict[tuple[str, int], int] = {}
    out = {}
    for path, key in found.items():
        if len(indices[key[0]]) >= 2:
            out[path] = numbers.setdefault(key, len(numbers))
    return out


def layer_ops(graph: Graph) -> dict[int, list[str]]:
    """Layer -> its ops' names in topological order."""
    out: dict[int, list[str]] = {}
    for op in graph.order:
        if op.layer is not None:
            out.setdefault(op.layer, []).append(op.name)
    return dict(sorted(out.items()))


"""Layers of an imported program, from where its ops were called: the module paths (PyTorch) or
the named scopes (JAX) with a repeated index (`layers.3.`, `transformer.h.3.`)."""

from __future__ import annotations

import warnings
from typing import Any

from autoshard.errors import InputError
from autoshard.graph.builder import GraphBuilder
from autoshard.graph.layers import layers_of_module_paths
from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_from_json


def tag_layers(builder: GraphBuilder) -> None:
    """Give every op built so far inside a repeated module its layer (ops added later, such as the
    backward and optimizer of a training step, take theirs by data flow)."""
    numbered = layers_of_module_paths(builder.modules.values())
    builder.layers.update((op, numbered[path]) for op, path in builder.modules.items() if path in numbered)


def graph_keeping_what_holds(document: dict[str, Any]) -> Graph:
    """The graph of an imported program. Layers read off its module paths are kept only when they
    can be cut into stages (a program may run a module's ops out of their layer's order);
    otherwise they are dropped with a warning naming why."""
    try:
        return graph_from_json(document)
    except InputError as error:
        if not error.problems or not all(p.where.endswith("/layer") for p in error.problems):
            raise
        for op in document["ops"]:
            op.pop("layer", None)
        warnings.warn(f"the program's layers are not kept: {error.problems[0]}", stacklevel=3)
        return graph_from_json(document)

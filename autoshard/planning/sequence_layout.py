"""The load-balanced causal layout on any graph: where the sequence enters, and whether the graph
may take it in the stored order.

`ops.nn` defines the layout (attention's attribute `balanced_over` = n: the sequence in 2n chunks
stored 0, 2n - 1, 1, 2n - 2, ..., the causal mask at the true positions). A graph computes the
same values in that order, permuted, when every op but causal attention treats the sequence as an
unordered set of rows: it reads each sequence index at that index (no shift, stride, window or
merge with another dim) and, for the kinds whose result depends on where an index sits (iota,
scans, top-k, scatters, reversal, opaque ops), it does not run along the sequence. Then feeding
every input that carries the sequence in the stored order (token ids, labels, position ids,
masks on both axes, rotary tables) and storing every parameter that does (a learned position
table) in it gives the contiguous model's loss and gradients, and its per-token outputs in the
stored order.

Which dims carry the sequence is found by the roles' labels (`planning.roles.dim_labels`: the
query and key dims of every attention op, spread through the ops' indexing maps), so the
generators' graphs and imported ones are read alike.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

import numpy as np

from autoshard.errors import InputError, Problem
from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_from_json
from autoshard.ops.loops import PARALLEL
from autoshard.ops.nn import BALANCED, KEY_LOOP, QUERY_LOOP, block_pair_counts, chunk_at, layout_order
from autoshard.planning.plan import Plan
from autoshard.planning.roles import dim_labels

# Kinds whose result depends on the position of an index along a loop that is not parallel (or,
# for iota, along its `dimension`): run along the sequence, the stored order would change them.
ORDER_DEPENDENT = frozenset({"cumulative", "top_k_indices", "top_k_values", "scatter", "scatter_add", "reverse"})


def sequence_dims(graph: Graph) -> dict[str, list[int]]:
    """Every tensor's dims that carry the sequence (the roles' `sequence` label)."""
    labels = dim_labels(graph)
    return {name: [d for d, label in enumerate(found) if label == "sequence"]
            for name, found in labels.items() if "sequence" in found}


def sequence_entries(graph: Graph) -> dict[str, list[int]]:
    """The inputs and parameters that carry the sequence, with its dims: what a run feeds (or
    stores) in the layout's order."""
    return {name: dims for name, dims in sequence_dims(graph).items()
            if graph.tensors[name].role in ("input", "parameter")}


def layout_problems(graph: Graph) -> list[Problem]:
    """Why `graph` cannot take its sequence in the balanced order, each at the op (JSON pointer)
    or tensor it is about; empty when it can."""
    dims = sequence_dims(graph)
    causal = [op for op in graph.ops if op.kind == "attention" and op.attrs.get("causal", False)]
    if not causal:
        return [Problem("balanced_over", "the graph has no causal attention: the layout balances its mask")]
    already = sorted({op.attrs[BALANCED] for op in causal if BALANCED in op.attrs})
    if already:
        return [Problem("balanced_over", f"the graph is already in the layout balanced over {already[0]}")]
    length = causal[0].nest.extents[QUERY_LOOP]
    problems = []
    index = {op.name: i for i, op in enumerate(graph.ops)}
    for op in causal:
        s, t = op.nest.extents[QUERY_LOOP], op.nest.extents[KEY_LOOP]
        if (s, t) != (length, length):
            problems.append(Problem(f"/ops/{index[op.name]}", f"op {op.name!r}: causal attention of {s} queries over "
                                    f"{t} keys; the layout permutes one sequence of {length} (self-attention)"))
    for name, found in dims.items():
        t = graph.tensors[name]
        for d in found:
            if t.shape[d] != length:
                problems.append(Problem(name, f"tensor {name!r} dim {d} ({t.shape[d]}) is linked to the sequence "
                                              f"but is not its {length} positions"))
    for op in graph.ops:
        where = f"/ops/{index[op.name]}"
        loops = set()
        for i, name in enumerate(op.operands):
            for d in dims.get(name, ()):
                expr = op.nest.maps[i].results[d]
                loop = expr.single_loop()
                if loop is None:
                    problems.append(Problem(where, f"op {op.name!r} ({op.kind}) reads the sequence of {name!r} "
                                                   f"shifted, strided, windowed or merged with another dim"))
                else:
                    loops.add(loop)
        for loop in sorted(loops):
            mixed = [e for m in op.nest.maps for e in m.results if loop in e.loops and e.single_loop() != loop]
            if mixed:
                problems.append(Problem(where, f"op {op.name!r} ({op.kind}) merges the sequence with another dim "
                                               f"(a reshape of it into or out of a wider dim)"))
            elif op.kind == "opaque" or (op.kind in ORDER_DEPENDENT and op.nest.iterator_types[loop] != PARALLEL):
                problems.append(Problem(where, f"op {op.name!r} ({op.kind}) runs along the sequence: its result "
                                               f"depends on the order"))
        if op.kind == "iota" and op.attrs.get("dimension", 0) in dims.get(op.outputs[0], ()):
            problems.append(Problem(where, f"op {op.name!r} (iota) counts positions along the sequence; give them as "
                                           f"an input, fed in the layout's order"))
    return problems


def balance_layout(document: Mapping[str, Any], n: Any) -> dict[str, Any]:
    """A graph document in the load-balanced causal layout for `n` devices: every causal
    attention op with the attribute `balanced_over` = n, after checking the graph may take its
    sequence in that order (`layout_problems`); the inputs and parameters to feed and store in
    it are `sequence_entries` of the result. Raises an InputError naming each problem."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InputError(f"must be a positive integer (the devices the layout balances), got {n!r}", "balanced_over")
    graph = graph_from_json(dict(document))
    problems = layout_problems(graph)
    length = next((op.nest.extents[QUERY_LOOP] for op in graph.ops if op.kind == "attention"
                   and op.attrs.get("causal", False)), None)
    if not problems and length % (2 * n):
        problems.append(Problem("balanced_over", f"the layout stores the sequence in 2 x {n} equal chunks, which "
                                                 f"must divide its {length} positions"))
    if problems:
        raise InputError(problems)
    out = copy.deepcopy(dict(document))
    for op in out["ops"]:
        if op["kind"] == "attention" and op.get("causal", False):
            op[BALANCED] = n
        elif op["kind"] == "grad" and op.get("of") == "attention" and op.get("forward", {}).get("causal", False):
            op["forward"] = dict(op["forward"], **{BALANCED: n})
    graph_from_json(out)  # every attribute read again as the ops take it
    return out


def to_stored_order(values: Mapping[str, np.ndarray], entries: Mapping[str, list[int]], n: int
                    ) -> dict[str, np.ndarray]:
    """`values` with every entry's sequence dims permuted into the stored order."""
    out = dict(values)
    for name, dims in entries.items():
        if name in out:
            for d in dims:
                out[name] = np.take(out[name], layout_order(out[name].shape[d], n), axis=d)
    return out


def sequence_layout(plan: Plan) -> dict[str, Any] | None:
    """plan.json's `roles.sequence_layout` for a plan whose attention stores the sequence in the
    balanced order (None for one in the sequence's own order): the devices it balances, its
    chunks and the two each device's contiguous block of the stored order holds; the inputs and
    parameters fed and stored in that order with their sequence dims; per attention op the axes
    splitting its queries and keys and the busiest device's causal work over the least busy's
    (1.0 where balanced; 2n - 1 for n contiguous query blocks)."""
    graph = plan.graph
    ops = [op for op in graph.ops if op.kind == "attention" and BALANCED in op.attrs]
    if not ops:
        return None
    n = ops[0].attrs[BALANCED]
    per_op = {}
    for op in ops:
        option = plan.options[op.name]
        splits = tuple(plan.mesh.group_size(axes) if axes else 1 for axes in option.loop_axes)
        counts = [c for c in block_pair_counts(op.nest, op.attrs, splits) if c]
        per_op[op.name] = {"query_axes": list(option.loop_axes[QUERY_LOOP]),
                           "key_axes": list(option.loop_axes[KEY_LOOP]),
                           "busiest_over_least_work": max(counts) / min(counts) if counts else 1.0}
    return {"layout": "load-balanced causal", "balanced_over": n, "chunks": 2 * n,
            "device_chunks": [[chunk_at(2 * i, n), chunk_at(2 * i + 1, n)] for i in range(n)],
            "stored_in_layout_order": sequence_entries(graph), "attention": per_op}


def refuse_balanced(plan: Any, entry: str) -> None:
    """Raise naming `entry` (a framework's runner) when `plan` was made for a graph in the
    balanced layout: the framework runs the program's own attention, which masks by index, so
    inputs fed in the stored order would be computed as if in their own. `plan`: a Plan, a
    PlanResult or a plan document (its `roles.sequence_layout`)."""
    if isinstance(plan, Mapping):
        roles = plan.get("roles")
        layout = roles.get("sequence_layout") if isinstance(roles, Mapping) else None
        n = layout.get("balanced_over") if isinstance(layout, Mapping) else None
    else:
        graph = getattr(getattr(plan, "plan", plan), "graph", None)
        n = next((op.attrs[BALANCED] for op in getattr(graph, "ops", ()) if BALANCED in op.attrs), None)
    if n is not None:
        raise InputError(f"the plan is for the graph in the load-balanced causal layout over {n}; {entry} runs the "
                         f"program's own attention, whose causal mask reads indices as positions: plan the program "
                         f"in its own order (without --balanced-over) to run it here", "plan")

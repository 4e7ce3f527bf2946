"""Human-readable numbers and one-line graph summaries for the CLI."""

from __future__ import annotations

from autoshard.graph.model import Graph


def si(value: float, unit: str = "") -> str:
    """1234567 -> '1.23 M' (decimal prefixes, as FLOP and bandwidth figures are quoted)."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def size(num_bytes: float) -> str:
    """Bytes with binary prefixes, as memory capacities are quoted."""
    for factor, prefix in ((2 ** 40, "TiB"), (2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if num_bytes >= factor:
            return f"{num_bytes / factor:.3g} {prefix}"
    return f"{num_bytes:.0f} B"


def graph_summary(graph: Graph) -> str:
    params = graph.tensors_with_role("parameter")
    inputs = graph.tensors_with_role("input")
    param_count = sum(t.bytes // t.itemsize for t in params)
    layers = len({op.layer for op in graph.ops if op.layer is not None})
    return (f"{graph.name}: {len(graph.ops)} ops, {len(graph.tensors)} tensors "
            f"({len(inputs)} inputs, {len(params)} parameters, {si(param_count)} parameter elements, "
            f"{size(sum(t.bytes for t in params))}), {si(graph.total_flops(), 'FLOP')}"
            + (f", {layers} layers" if layers else ""))

"""A finished search as the user reads it: the ranking document (`ranking.json`), its table on the
terminal, and the winning candidate's plan rebuilt for delivery."""

from __future__ import annotations

from typing import Any

from autoshard.graph.schema import load_graph
from autoshard.graph.summary import size
from autoshard.phases import PhaseTimes
from autoshard.planning.formulation import PICOSECONDS
from autoshard.planning.make_plan import PlanResult
from autoshard.planning.plan import plan_from_json
from autoshard.planning.report import estimate
from autoshard.search.run import Entry, SearchOptions, SearchResult
from autoshard.search.tasks import SearchInputs, bind_candidate
from autoshard.search.throughput import Throughput

FORMAT = "autoshard.ranking/v1"


def entry_json(rank: int | None, entry: Entry, rates: Throughput, devices: int) -> dict[str, Any]:
    candidate, solved = entry.candidate, entry.solved
    row: dict[str, Any] = {
        "rank": rank,
        "mesh": {"axes": [{"name": n, "size": s} for n, s in zip(candidate.axis_names, candidate.axis_sizes)]},
        "placement": {"mapping": candidate.mapping_json, "links": entry.links, "nodes": candidate.nodes,
                      "slice": list(candidate.slice_shape) if candidate.slice_shape else None},
        "outcome": entry.outcome,
        "lower_bound_s": entry.bound_ps / PICOSECONDS if entry.bound else None,
        # "formulation": from the candidate's formulation; "analytic": from its FLOPs and stored bytes alone
        "lower_bound_from": ("analytic" if entry.bound.get("analytic") else "formulation") if entry.bound else None,
        "least_peak_memory_bytes": entry.bound["least_peak_bytes"] if entry.bound else None,
        "bound_s_spent": entry.bound["bound_s"] if entry.bound else None,
    }
    if solved is not None:
        row.update({
            "objective_s": solved["objective_ps"] / PICOSECONDS,
            "step_s": solved["step_s"], "compute_s": solved["compute_s"],
            "communication_s": solved["communication_s"],
            # beside the step the candidates are ranked by, with a parameter's gradient reductions and
            # all_gathers run behind compute (`planning.overlap`)
            "overlapped_step_s": solved["overlapped_step_s"],
            "communication_s_per_axis": solved["communication_s_per_axis"],
            "communication_bytes_per_axis": solved["communication_bytes_per_axis"],
            "peak_memory_bytes": solved["peak_memory_bytes"],
            "gap": solved["gap"], "status": solved["status"], "solve_s": solved["solve_s"],
            **rates.of(solved["step_s"], devices),
        })
    if entry.reason:
        row["reason"] = entry.reason
    return row


def ranking_document(result: SearchResult, options: SearchOptions, graph_name: str, rates: Throughput
                     ) -> dict[str, Any]:
    solved = [e for e in result.entries if e.outcome == "solved"]
    devices = options.devices
    return {
        "format": FORMAT,
        "graph": graph_name,
        "topology": options.topology,
        "devices": options.devices,
        "options": {"max_axes": options.max_axes, "fix": options.fixed, "jobs": options.jobs, "ray": options.ray,
                    "time_budget_s": options.time_budget_s, "deterministic": options.settings.deterministic,
                    "time_limit_s": options.settings.time_limit_s,
                    "memory_budget_bytes": options.settings.memory_budget_bytes},
        "counts": result.counts,
        # MFU's numerator and the tokens behind tokens_per_s_per_device (`search.throughput`)
        "model_flops_per_step": rates.model_flops, "tokens_per_step": rates.tokens,
        "best": entry_json(1, result.best, rates, devices) if result.best else None,
        # no plan on any candidate has a lower objective (solver bounds of the solved, own bounds of the pruned)
        "certified_lower_bound_s": result.certified_bound_ps / PICOSECONDS,
        "gap": result.gap,
        "ran_on": result.where,
        "wall_s": result.wall_s,
        "ranking": [entry_json(solved.index(e) + 1 if e in solved else None, e, rates, devices)
                    for e in result.entries],
    }


def ranking_table(document: dict[str, Any]) -> list[str]:
    """The ranking as aligned text lines: one per candidate, times in ms."""
    header = (f"{'#':>3} {'mesh':<22} {'placement':<34} {'step ms':>9} {'compute':>9} {'comm per axis (ms)':<30} "
              f"{'peak mem':>10} {'MFU':>6} {'gap':>7} {'solve s':>7}  outcome")
    lines = [header]
    for row in document["ranking"]:
        mesh = ",".join(f"{a['name']}={a['size']}" for a in row["mesh"]["axes"])
        placement = " ".join(f"{axis}:{'+'.join(dims)}" for axis, dims in row["placement"]["mapping"].items())
        if row["placement"]["slice"]:
            placement += " on " + "x".join(map(str, row["placement"]["slice"]))
        if row["outcome"] == "solved":
            comm = " ".join(f"{a}={s * 1e3:.3g}" for a, s in row["communication_s_per_axis"].items()) or "-"
            lines.append(f"{row['rank']:>3} {mesh:<22} {placement:<34} {row['step_s'] * 1e3:>9.4g} "
                         f"{row['compute_s'] * 1e3:>9.4g} {comm:<30} {size(row['peak_memory_bytes']):>10} "
                         f"{_percent(row['mfu']):>6} {100 * row['gap']:>6.2f}% {row['solve_s']:>7.2f}  solved")
        else:
            bound = f">= {row['lower_bound_s'] * 1e3:.4g}" if row["lower_bound_s"] is not None else "-"
            lines.append(f"{'-':>3} {mesh:<22} {placement:<34} {bound:>9} {'':>9} {'':<30} {'':>10} {'':>6} {'':>7} "
                         f"{'':>7}  "
                         f"{row['outcome']}: {row.get('reason', '')}")
    return lines


def _percent(share: float | None) -> str:
    return f"{100 * share:.1f}%" if share is not None else "-"


def best_plan(result: SearchResult, inputs: SearchInputs) -> tuple[PlanResult, Any]:
    """The winner's plan as `make_plan` returned it in its worker (priced again here, where the
    graph is), with the hardware it was bound to."""
    entry = result.best
    assert entry is not None and entry.solved is not None
    mesh = entry.candidate.mesh
    graph = load_graph(inputs.graph_document, mesh)
    hardware = bind_candidate(inputs, entry.candidate)
    plan = plan_from_json(entry.solved["plan"], graph, mesh)
    return PlanResult(plan, estimate(plan, hardware), entry.solved["solver"], PhaseTimes()), hardware

"""`search --by-layer` as the user reads it: ranking.json's `by_layer` section and its table, each
configuration in the words runs are described by (stages, sub-mesh and the roles its axes play,
microbatches, schedule, recomputation), with what makes it slower than the one above it."""

from __future__ import annotations

import math
from typing import Any

from autoshard.graph.summary import size
from autoshard.search.layered import LayeredSearch, PricedLayered
from autoshard.search.throughput import Throughput

TABLE_ROWS = 12  # the terminal's table; ranking.json has every configuration


def configuration_json(rank: int | None, priced: PricedLayered, roles: dict[str, Any] | None,
                       rates: Throughput) -> dict[str, Any]:
    c, task, parts = priced.configuration, priced.configuration.task, priced.parts
    row: dict[str, Any] = {
        "rank": rank, "stages": task.stages, "microbatches": task.microbatches, "schedule": c.schedule,
        "virtual_stages_per_stage": c.chunks, "recompute": task.recompute,
        "sub_mesh": {"axes": [{"name": n, "size": s} for n, s in zip(task.candidate.axis_names,
                                                                      task.candidate.axis_sizes)],
                     "placement": task.candidate.mapping_json, "roles": roles},
        "outcome": priced.outcome, "lower_bound_step_s": priced.bound_s,
        "peak_memory_bytes_per_stage": [m.peak_bytes for m in parts.memory],
        "layers_per_part": _layers_per_part(parts.part_at),
    }
    if priced.pipeline is not None:
        timeline = priced.pipeline.timeline
        row.update({"step_s": timeline.step_s, "overlapped_step_s": priced.pipeline.overlapped.step_s,
                    "bubble_fraction": timeline.bubble_fraction, "busiest_stage_s": step_terms(priced),
                    **rates.of(timeline.step_s, task.devices)})
    return row


def step_terms(priced: PricedLayered) -> dict[str, float]:
    """The step as the stage with the most work spends it: its compute, its communication (both
    over every microbatch), its tails (gradient reduction, optimizer) and the rest of the step,
    waiting (the bubble, transfers from the other stages, and the end of the slowest stage). The
    terms add up to the step."""
    assert priced.pipeline is not None
    parts, timeline = priced.pipeline.parts, priced.pipeline.timeline
    stages, microbatches = parts.orders.stages, parts.orders.microbatches
    mine = [[part for part in range(parts.orders.virtual_stages) if part % stages == s] for s in range(stages)]
    tails = {name: list(values) for name, values in parts.tail_s.items()}
    work = [timeline.busy_s[s] + sum(values[s] for values in tails.values()) for s in range(stages)]
    s = max(range(stages), key=lambda stage: work[stage])
    compute = microbatches * float(parts.compute[mine[s]].sum())
    terms = {"compute_s": compute, "communication_s": timeline.busy_s[s] - compute,
             **{f"{name.replace(' ', '_')}_s": values[s] for name, values in tails.items()}}
    return {**terms, "waiting_s": timeline.step_s - sum(terms.values())}


def behind(row: dict[str, Any], above: dict[str, Any]) -> dict[str, float]:
    """Why a configuration is slower than one ranked above it, term by term (`step_terms`)."""
    return {"step_s": row["step_s"] - above["step_s"],
            **{term: seconds - above["busiest_stage_s"][term] for term, seconds in row["busiest_stage_s"].items()}}


def layered_section(found: LayeredSearch, rates: Throughput) -> dict[str, Any]:
    """The chosen configuration, the certified bound over every configuration of the space, the
    counts (keys, formulations) and every configuration priced, ranked."""
    roles = {(k.task.stages, k.task.candidate, k.task.microbatches, k.task.recompute): k.solved["roles"]
             for k in found.keys if k.solved}
    rows, rank = [], 0
    for priced in found.priced:
        task = priced.configuration.task
        rank += priced.fits
        variants = roles.get((task.stages, task.candidate, task.microbatches, task.recompute))
        row = configuration_json(rank if priced.fits else None, priced,
                                 variants[priced.variant] if variants else None, rates)
        if priced.fits and rows:
            row["behind_previous"] = behind(row, rows[-1])
        rows.append(row)
    return {
        "method": "layer sample",
        "chosen": rows[0] if rows and rows[0]["outcome"] == "priced" else None,
        # no plan of any configuration of the space has a shorter step (search/layered.py)
        "certified_lower_bound_step_s": found.certified_bound_s,
        "gap": found.gap,
        "counts": {**found.counts, "formulations": found.formulations},
        "wall_s": found.wall_s,
        "keys": [{"stages": k.task.stages, "sub_mesh": k.task.candidate.mesh_text,
                  "placement": k.task.candidate.placement_text, "microbatches": k.task.microbatches,
                  "recompute": k.task.recompute, "outcome": k.outcome, "lower_bound_step_s":
                  k.bound_s if k.outcome == "solved" else k.analytic_bound_s,
                  **({"reason": k.reason} if k.reason else {})} for k in found.keys],
        "configurations": rows,
    }


def layered_table(section: dict[str, Any]) -> list[str]:
    """The best configurations, times in seconds, and the sentence the bound allows."""
    lines = [f"{'#':>3} {'S':>3} {'M':>4} {'schedule':<15} {'sub-mesh':<22} {'recompute':<9} {'step s':>9} "
             f"{'bubble':>7} {'peak mem':>10} {'MFU':>6} {'tok/s/dev':>9}"]
    for row in [r for r in section["configurations"] if r["outcome"] == "priced"][:TABLE_ROWS]:
        mesh = ",".join(f"{a['name']}={a['size']}" for a in row["sub_mesh"]["axes"])
        schedule = row["schedule"] + (f":{row['virtual_stages_per_stage']}" if row["schedule"] == "interleaved" else "")
        tokens = row["tokens_per_s_per_device"]
        lines.append(f"{row['rank'] or '-':>3} {row['stages']:>3} {row['microbatches']:>4} {schedule:<15} {mesh:<22} "
                     f"{row['recompute']:<9} {row['step_s']:>9.4g} {100 * row['bubble_fraction']:>6.1f}% "
                     f"{size(max(row['peak_memory_bytes_per_stage'])):>10} "
                     f"{'-' if row['mfu'] is None else format(100 * row['mfu'], '.1f') + '%':>6} "
                     f"{'-' if tokens is None else format(tokens, '.4g'):>9}")
    counts = section["counts"]
    lines.append(f"{counts['keys']} keys (stage count, sub-mesh, microbatches, recomputation): "
                 f"{counts['solved']} solved, {counts['pruned']} pruned, {counts['infeasible']} infeasible, "
                 f"{counts['unsolved']} unsolved; "
                 f"{counts['formulations']} formulations; configurations: "
                 + ", ".join(f"{n} {outcome}" for outcome, n in counts["configurations"].items())
                 + f"; {section['wall_s']:.1f} s")
    compared = section.get("compared")
    if compared is not None:
        lines.append(f"compared: {compared['layout']}: " + (
            f"step {compared['step_s']:.4g} s, peak {size(max(compared['peak_memory_bytes_per_stage']))}, rank "
            f"{compared['rank']}" if compared.get("outcome") == "priced" else
            f"{compared['outcome']}" + (f" (peak {size(max(compared['peak_memory_bytes_per_stage']))})"
                                        if "peak_memory_bytes_per_stage" in compared else "")))
    if compared is not None and "behind_chosen" in compared:
        lines.append(_explained(compared["behind_chosen"], section["chosen"]))
    if section["chosen"] is not None:
        bound = section["certified_lower_bound_step_s"]
        faster = section["chosen"]["step_s"] / bound - 1 if bound > 0 else math.inf
        lines.append(f"no configuration has a plan with a step under {bound:.4g} s"
                     + (f": none is more than {100 * faster:.1f}% faster than the chosen one" if bound > 0 else ""))
    return lines


def _explained(behind_chosen: dict[str, float], chosen: dict[str, Any]) -> str:
    """The compared layout against the chosen configuration, term by term (`step_terms`)."""
    terms = ", ".join(f"{name[:-2].replace('_', ' ')} {seconds:+.3g} s" for name, seconds in behind_chosen.items()
                      if name != "step_s")
    step_s = behind_chosen["step_s"]
    return (f"  the compared layout's step is {step_s:+.4g} s ({100 * step_s / chosen['step_s']:+.1f}%) against the "
            f"chosen one's, on the stage with most work: {terms}")


def _layers_per_part(part_at: tuple[int, ...]) -> list[int]:
    counts = [0] * (max(part_at) + 1)
    for part in part_at:
        counts[part] += 1
    return counts

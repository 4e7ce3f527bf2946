"""`search --pipeline auto` as the user reads it: ranking.json's `pipeline` section and its table."""

from __future__ import annotations

import math
from typing import Any

from autoshard.graph.summary import size
from autoshard.search.throughput import Throughput
from autoshard.search.pipelined import PipelineSearch, Priced


def priced_json(rank: int | None, priced: Priced, rates: Throughput) -> dict[str, Any]:
    c, pipelined = priced.configuration, priced.pipelined
    row: dict[str, Any] = {
        "rank": rank, "stages": c.stages, "microbatches": c.microbatches, "schedule": c.schedule,
        "virtual_stages_per_stage": c.chunks,
        "sub_mesh": {"axes": [{"name": n, "size": s} for n, s in zip(c.candidate.axis_names, c.candidate.axis_sizes)]},
        "placement": priced.placement.mapping if priced.placement else None,
        "outcome": priced.outcome, "lower_bound_step_s": priced.bound_s,
    }
    if pipelined is not None:
        row.update({"step_s": pipelined.timeline.step_s, "overlapped_step_s": pipelined.overlapped.step_s,
                    "bubble_fraction": pipelined.timeline.bubble_fraction,
                    "peak_memory_bytes_per_stage": [m.peak_bytes for m in pipelined.memory],
                    **rates.of(pipelined.timeline.step_s, c.stages * math.prod(c.candidate.axis_sizes))})
    if priced.reason:
        row["reason"] = priced.reason
    return row


def pipeline_section(found: PipelineSearch, rates: Throughput) -> dict[str, Any]:
    """Which configuration won (S = 1: the plain search's `best`), the certified step bound over
    every configuration, and every pipelined configuration ranked."""
    ranked = [p for p in found.priced if p.outcome == "priced"]
    return {
        "chosen": priced_json(1, found.best, rates) if found.best else {"stages": 1, "step_s": found.plain_step_s},
        "plain_step_s": found.plain_step_s,
        # no plan of any configuration (S = 1 included) has a shorter step; see search/pipelined.py
        "certified_lower_bound_step_s": found.certified_bound_s,
        "configurations": [priced_json(ranked.index(p) + 1 if p in ranked else None, p, rates) for p in found.priced],
    }


def pipeline_table(section: dict[str, Any]) -> list[str]:
    """One line per pipelined configuration, times in ms."""
    lines = [f"{'#':>3} {'S':>2} {'M':>3} {'schedule':<14} {'sub-mesh':<18} {'step ms':>9} {'bubble':>7} "
             f"{'peak mem':>10} {'MFU':>6}  outcome"]
    for row in section["configurations"]:
        mesh = ",".join(f"{a['name']}={a['size']}" for a in row["sub_mesh"]["axes"])
        schedule = row["schedule"] + (f":{row['virtual_stages_per_stage']}" if row["schedule"] == "interleaved" else "")
        head = f"{row['rank'] or '-':>3} {row['stages']:>2} {row['microbatches']:>3} {schedule:<14} {mesh:<18}"
        if row["outcome"] == "priced":
            lines.append(f"{head} {row['step_s'] * 1e3:>9.4g} {100 * row['bubble_fraction']:>6.1f}% "
                         f"{size(max(row['peak_memory_bytes_per_stage'])):>10} "
                         f"{'-' if row['mfu'] is None else format(100 * row['mfu'], '.1f') + '%':>6}  priced")
        else:
            lines.append(f"{head} {'>= ' + format(row['lower_bound_step_s'] * 1e3, '.4g'):>9} {'':>7} {'':>10} {'':>6}  "
                         f"{row['outcome']}: {row.get('reason', '')[:120]}")
    return lines

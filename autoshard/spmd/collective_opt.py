"""Collective optimisations on an `SpmdProgram`, as small (pattern, rewrite) pairs (`rewrites`).

A pattern yields the sites where its rewrite could apply; the rewrite returns the changed
program (or None). `optimize` applies rewrites one at a time, keeping a change only when it
lowers the program's cost: communication seconds (as priced by the program's own price), then
per-device FLOPs. Every rewrite keeps the program's meaning (the simulator runs the result):

- `drop_unused`: a collective whose result nobody reads;
- `fold_all_reduce`: `all_reduce(B, all_reduce(A, x))` -> `all_reduce(A + B, x)`;
- `reassociate_all_reduce`: `add(all_reduce(x), all_reduce(y))` -> `all_reduce(add(x, y))`
  (also `sub` for sums, and `max`/`min` on max/min-partial values): the op runs on the partial
  pieces, which is exact because it is linear in them;
- `reassociate_reduce_scatter`: the same with two reduce_scatters along the same dim;
- `decompose_all_reduce`: `all_reduce` before an elementwise op -> `reduce_scatter`, the op on
  the scattered shards, then `all_gather` (the gather moved down past the op);
- `move_all_gather_down`: an `all_gather` before an elementwise op moves past it;
- `merge_reshardings`: two consecutive collectives replanned as one resharding when that is
  cheaper (an all_gather followed by the all_slice it undoes disappears).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from autoshard.spmd.program import SpmdProgram
from autoshard.spmd.rewrites import REWRITES, Rewrite
from autoshard.spmd.surgery import local_flops


@dataclass(frozen=True, slots=True)
class Change:
    """One applied rewrite: where, and the program's communication seconds before and after."""

    rewrite: str
    detail: str
    seconds_before: float
    seconds_after: float


def _better(new: SpmdProgram, old: SpmdProgram) -> bool:
    a, b = new.communication_seconds(), old.communication_seconds()
    if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-18):
        return local_flops(new) < local_flops(old) * (1 - 1e-12)
    return a < b


def optimize(program: SpmdProgram, rewrites: Sequence[Rewrite] = REWRITES,
             max_changes: int = 1000) -> tuple[SpmdProgram, list[Change]]:
    """Apply `rewrites` until none lowers the cost; returns the program and the changes made."""
    changes: list[Change] = []
    progress = True
    while progress and len(changes) < max_changes:
        progress = False
        for rule in rewrites:
            for site in rule.pattern(program):
                result = rule.rewrite(program, site)
                if result is None or not _better(result[0], program):
                    continue
                changes.append(Change(rule.name, result[1], program.communication_seconds(),
                                      result[0].communication_seconds()))
                program, progress = result[0], True
                break
            if progress:
                break
    return program, changes

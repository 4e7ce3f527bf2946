"""Collective optimisations on an `SpmdProgram`, as small (site, rewrite) pairs (`rewrites`).

`optimize` applies rewrites one at a time to a `Draft` of the program, keeping a change only when it
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

import heapq
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Sequence

from autoshard.spmd.draft import Draft
from autoshard.spmd.program import SpmdProgram
from autoshard.spmd.rewrites import REWRITES, Rewrite


@dataclass(frozen=True, slots=True)
class Change:
    """One applied rewrite: where, and the program's communication seconds before and after."""

    rewrite: str
    detail: str
    seconds_before: float
    seconds_after: float


def _better(new: tuple[float, float], old: tuple[float, float]) -> bool:
    """Less communication time; at equal time, fewer FLOPs per device."""
    if math.isclose(new[0], old[0], rel_tol=1e-9, abs_tol=1e-18):
        return new[1] < old[1] * (1 - 1e-12)
    return new[0] < old[0]


class _Worklist:
    """One rewrite's candidate sites not looked at since they last changed, visited in program order."""

    def __init__(self, draft: Draft):
        self.draft = draft
        self.heap: list[tuple[Fraction | int, int]] = [(draft.label(key), key) for key in draft.keys_in_order()]
        self.queued = {key for _, key in self.heap}

    def add(self, keys: Iterable[int]) -> None:
        for key in keys:
            if key not in self.queued:
                self.queued.add(key)
                heapq.heappush(self.heap, (self.draft.label(key), key))

    def pop(self) -> int | None:
        while self.heap:
            _, key = heapq.heappop(self.heap)
            self.queued.discard(key)
            if key in self.draft.body:
                return key
        return None


def optimize(program: SpmdProgram, rewrites: Sequence[Rewrite] = REWRITES,
             max_changes: int = 1000) -> tuple[SpmdProgram, list[Change]]:
    """Apply `rewrites` until none lowers the cost; returns the program and the changes made.

    Each change is the first site, in program order, of the first rewrite that lowers the cost
    there, as if every site were tried again from the start after each change; but a site tried
    and refused is tried again only once an edit touches it, as nothing else can change its
    answer (`rewrites`), so the time grows with the program plus the changes, not their product."""
    draft = Draft(program)
    worklists = [_Worklist(draft) for _ in rewrites]
    changes: list[Change] = []
    rule = 0
    while rule < len(rewrites) and len(changes) < max_changes:
        key = worklists[rule].pop()
        if key is None:
            rule += 1
            continue
        if not rewrites[rule].site(draft, key):
            continue
        before, mark = draft.cost(), draft.mark()
        what = rewrites[rule].rewrite(draft, key)
        if what is None or not _better(draft.cost(), before):
            draft.rollback(mark)
            continue
        changes.append(Change(rewrites[rule].name, what, before[0], draft.communication_s))
        touched = draft.keep(mark)
        for worklist in worklists:
            worklist.add(touched)
        rule = 0
    return draft.program(), changes

"""Recomputation chosen per layer for a pipelined training step (`plan --recompute auto`).

A stage holds the saved activations of every microbatch it has in flight, so the first stages of
a 1F1B pipeline hold S microbatches where the last holds one: a mode that fits the last stage
may overflow the first, and recomputing every layer everywhere pays for memory the late stages
never needed. Megatron-LM exposes this as recomputing only some layers of a stage.

From the plans of the uniform modes (`none`, `selective`, `full`), each priced on its pipeline
whether or not it fits, every layer position gets per plan the seconds one microbatch spends in it (its
forward, backward and weight-gradient ops, the recomputed forward included), the activation
bytes it saves for its backward and the state it stores. On a cut (position -> stage and chunk)
each stage then picks a mode per position: the least seconds whose memory fits the budget,

    stored + sum over chunks c of (most microbatches of c in flight) x (bytes c's layers save)

which bounds the schedule's activation peak from above (exact with one chunk a stage). Each stage
is a multiple-choice knapsack over at most a few dozen positions of three options; it is solved
exactly on its Pareto frontier of (bytes, seconds). The choice is priced from the uniform plans;
the caller plans the mixed graph and keeps it only if its own pricing wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


from autoshard.pipeline import StageOrders
from autoshard.pipeline.schedules import chunk_inflight
from autoshard.planning.pipeline_plan import PipelinedPlan, StageWork, positions_cut
from autoshard.planning.pipeline_stages import layer_order, position_seconds
from autoshard.planning.pipeline_values import PartValues

FRONTIER_POINTS = 4096  # a stage's Pareto frontier is thinned to this many points (never hit on repeated layers)


@dataclass(frozen=True)
class PositionCosts:
    """One mode's plan read per layer position, per device and per microbatch."""

    seconds: tuple[float, ...]  # F + B + W of the position's ops, recomputation included
    saved_bytes: tuple[int, ...]  # activations kept from its forward for its backward
    stored_bytes: tuple[int, ...]  # parameters, gradients and optimizer state of its ops


@dataclass(frozen=True)
class Choice:
    modes: tuple[str, ...]  # per position
    part_at: tuple[int, ...]  # per position, the virtual stage of the cut the modes were fitted to
    stage_seconds: tuple[float, ...]  # per stage, one microbatch through all its positions
    stage_bytes: tuple[float, ...]  # per stage, the memory bound above

    def per_layer(self, layers: tuple[int, ...]) -> dict[int, str]:
        return dict(zip(layers, self.modes))


def position_costs(pipelined: PipelinedPlan) -> PositionCosts:
    """A priced pipelined plan's seconds and bytes per layer position (each position its own part)."""
    result = pipelined.result
    work = StageWork.of(result)
    count = len(layer_order(result.plan.graph))
    seconds = position_seconds(work.positions, {name: s for name, s in work.seconds.items()
                                                if work.kinds[name] != "tail"}, count)
    values = PartValues(result.plan, work.positions, work.kinds, work.produced)
    accumulated = result.microbatching.accumulated if result.microbatching is not None else {}
    stored = values.stored_bytes({p: p for p in range(count)}, count, accumulated)
    return PositionCosts(tuple(seconds), tuple(values.saved_bytes(count)),
                         tuple(s.parameter_bytes + s.gradient_bytes + s.optimizer_state_bytes for s in stored))


def placements(pipelined: PipelinedPlan) -> list[tuple[int, int]]:
    """Per layer position, the (stage, chunk) its part runs on in this plan's cut."""
    return [pipelined.orders.placement(part) for part in positions_cut(pipelined)]


def choose_modes(costs: Sequence[tuple[str, PositionCosts]], orders: StageOrders, placed: list[tuple[int, int]],
                 budget_bytes: float) -> Choice | None:
    """Per position the mode of least seconds with every stage's memory within the budget, on
    the cut `placed`; None when some stage overflows whatever its positions recompute. `costs`:
    (mode, its costs) per plan read, several plans of one mode each offering their prices."""
    inflight = chunk_inflight(orders)
    chosen = [""] * len(placed)
    stage_seconds, stage_bytes = [], []
    for stage in range(orders.stages):
        positions = [p for p, (s, _) in enumerate(placed) if s == stage]
        options = [[(c.stored_bytes[p] + inflight[stage, placed[p][1]] * c.saved_bytes[p], c.seconds[p], mode)
                    for mode, c in costs] for p in positions]
        best = _least_seconds_within(options, budget_bytes)
        if best is None:
            return None
        used_bytes, seconds, picks = best
        for position, mode in zip(positions, picks):
            chosen[position] = mode
        stage_seconds.append(seconds)
        stage_bytes.append(used_bytes)
    part_at = tuple(orders.virtual_stage(stage, chunk) for stage, chunk in placed)
    return Choice(tuple(chosen), part_at, tuple(stage_seconds), tuple(stage_bytes))


def _least_seconds_within(options: list[list[tuple[float, float, str]]], budget_bytes: float
                          ) -> tuple[float, float, tuple[str, ...]] | None:
    """Exact multiple-choice knapsack: one option (bytes, seconds, mode) per item, least total
    seconds with total bytes within the budget, by merging Pareto frontiers item by item."""
    frontier: list[tuple[float, float, tuple[str, ...]]] = [(0.0, 0.0, ())]
    for item in options:
        merged = sorted((b + ob, s + os, picks + (mode,)) for b, s, picks in frontier for ob, os, mode in item
                        if b + ob <= budget_bytes)
        frontier = []
        for point in merged:  # by bytes ascending: keep the points that lower the seconds
            if not frontier or point[1] < frontier[-1][1]:
                frontier.append(point)
        if len(frontier) > FRONTIER_POINTS:
            step = len(frontier) / FRONTIER_POINTS
            frontier = [frontier[int(i * step)] for i in range(FRONTIER_POINTS - 1)] + [frontier[-1]]
        if not frontier:
            return None
    return min(frontier, key=lambda point: point[1])

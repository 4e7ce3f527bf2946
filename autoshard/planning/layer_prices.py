"""A pipeline priced from a layer sample's plan: what each sampled layer costs, stretched over the
whole stack, cut, scheduled and simulated.

`layer_prices` reads a plan of a three-layer sample (`layer_sample`) as `price_cut` reads a
whole plan, one part per sample position: per position, one microbatch's compute, communication
and hideable communication of its `F`, `B` and `W` ops, the bytes it saves for its backward, the
state it stores, and its tail (gradient reduction and optimizer, once per step); per boundary
between positions, the bytes crossing it. `price_layers` then prices a pipeline of the whole
stack: each layer takes the prices of the sample position standing for it, the layers are cut
into S x V parts balanced on their seconds (`balanced_cuts`), and each part's seconds, each
stage's tail, state and activations in flight, and each boundary's transfer are summed as
`price_cut` sums them for a plan of the whole graph. The plan priced is the sample's with its
middle layer's shardings repeated over the middle layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from autoshard.pipeline.step import StepOrders, StepSummary, pipeline_step, step_activation_peaks
from autoshard.pipeline.seconds import DIRECTIONS
from autoshard.planning.costs import Hardware
from autoshard.planning.make_plan import PlanResult
from autoshard.planning.pipeline_plan import STAGE_AXIS, TRANSFER, StageMemory, StageWork
from autoshard.planning.pipeline_stages import balanced_cuts, layer_order
from autoshard.planning.pipeline_values import PartValues, StoredBytes

KINDS = ("F", "B", "W")
PARTS = ("compute", "communication", "hideable")


@dataclass(frozen=True)
class LayerPrices:
    """Per sample position: `work[p, kind, part]` seconds of one microbatch (kinds `KINDS`, parts
    `PARTS`), `tail[p]` (gradient reduction, optimizer, hideable) seconds once per step,
    `saved_bytes[p]` per microbatch and `stored[p]` per device; per direction and sample
    boundary, the bytes of each value a microbatch sends across it."""

    work: np.ndarray
    tail: np.ndarray
    saved_bytes: tuple[int, ...]
    stored: tuple[StoredBytes, ...]
    sent_bytes: dict[str, tuple[tuple[int, ...], ...]]

    def serial_s(self, represented_by: Sequence[int], microbatches: int) -> float:
        """The whole stack's seconds one after another: every layer's F, B and W for every
        microbatch, and its tail once (the busiest of S stages has at least 1/S of them)."""
        rep = np.asarray(represented_by)
        return float(microbatches * self.work[rep][..., :2].sum() + self.tail[rep][:, :2].sum())


def layer_prices(result: PlanResult) -> LayerPrices:
    """The prices of a sample's plan (or of any plan with layers), one per layer position."""
    work = StageWork.of(result)
    graph = result.plan.graph
    count = len(layer_order(graph))
    part_of = work.positions
    values = PartValues(result.plan, part_of, work.kinds, work.produced)
    sums = np.zeros((count, len(KINDS), len(PARTS)))
    tail = np.zeros((count, 3))
    for name, entry in work.per_run.items():
        kind, position = work.kinds[name], part_of[name]
        if kind == "tail":
            tail[position] += (entry["communication"], entry["compute"], entry["hideable"])
        else:
            sums[position, KINDS.index(kind)] += [entry[part] for part in PARTS]
    accumulated = result.microbatching.accumulated if result.microbatching is not None else {}
    stored = values.stored_bytes({p: p for p in range(count)}, count, accumulated)
    sent = {direction: tuple(tuple(values.bytes_of(t) for t in crossing) for crossing in boundaries)
            for direction, boundaries in values.crossing(count).items()}
    return LayerPrices(sums, tail, tuple(values.saved_bytes(count)), tuple(stored), sent)


@dataclass(frozen=True)
class LayeredParts:
    """A stack cut for a schedule, before its simulation: per part (virtual stage) and kind its
    seconds as priced and with the hideable communication hidden, per stage its tails, per
    boundary its transfers, and each stage's memory."""

    orders: StepOrders
    part_at: tuple[int, ...]  # per layer of the whole, its virtual stage
    plain: np.ndarray  # (parts, kinds)
    compute: np.ndarray  # (parts, kinds): the part of `plain` that is compute, the rest communication
    hidden: np.ndarray  # (parts, kinds)
    tail_s: dict[str, list[float]]
    overlapped_tail_s: dict[str, list[float]]
    transfers: list[list[float]] | None
    memory: tuple[StageMemory, ...]

    @property
    def peak_bytes(self) -> int:
        return max(m.peak_bytes for m in self.memory)

    def busy_floor_s(self) -> float:
        """No schedule of these parts takes less: the busiest stage runs its items and its tail
        one at a time."""
        busy = np.zeros(self.orders.stages)
        for part in range(self.orders.virtual_stages):
            busy[part % self.orders.stages] += self.orders.microbatches * self.plain[part].sum()
        return float((busy + np.sum([v for v in self.tail_s.values()], axis=0)).max())


@dataclass(frozen=True)
class LayeredPipeline:
    """A pipeline of the whole stack priced from its sample's prices."""

    parts: LayeredParts
    timeline: StepSummary
    overlapped: StepSummary  # with the communication that can run behind compute hidden

    @property
    def step_s(self) -> float:
        return self.timeline.step_s

    @property
    def part_at(self) -> tuple[int, ...]:
        return self.parts.part_at

    @property
    def memory(self) -> tuple[StageMemory, ...]:
        return self.parts.memory

    @property
    def peak_bytes(self) -> int:
        return self.parts.peak_bytes


def price_layers(prices: LayerPrices, represented_by: Sequence[int], orders: StepOrders,
                 hw: Hardware | None) -> LayeredPipeline:
    """The pipeline `orders` of a stack whose layer `i` costs what sample position
    `represented_by[i]` does; `hw` (bound with the stage axis) prices the transfers (None: one stage)."""
    return simulate_parts(layered_parts(prices, represented_by, orders, hw))


def simulate_parts(parts: LayeredParts) -> LayeredPipeline:
    orders = parts.orders
    timeline = pipeline_step(orders, *_chunked(parts.plain, orders), transfer_s=parts.transfers, tail_s=parts.tail_s)
    overlapped = pipeline_step(orders, *_chunked(parts.hidden, orders), transfer_s=parts.transfers,
                               tail_s=parts.overlapped_tail_s)
    return LayeredPipeline(parts, timeline, overlapped)


def layered_parts(prices: LayerPrices, represented_by: Sequence[int], orders: StepOrders,
                  hw: Hardware | None) -> LayeredParts:
    """The stack's layers cut into `orders`' parts, balanced on their seconds, and summed."""
    rep = np.asarray(represented_by)
    per_layer = prices.work[rep]  # (layers, kinds, parts)
    seconds = per_layer[:, :, 0] + per_layer[:, :, 1]
    cuts = balanced_cuts(seconds.sum(axis=1).tolist(), orders.virtual_stages)
    part_at = tuple(part for part, (start, end) in enumerate(cuts) for _ in range(start, end))
    parts = np.zeros((orders.virtual_stages, len(KINDS), len(PARTS)))
    np.add.at(parts, list(part_at), per_layer)
    compute, communication, hide = parts[..., 0], parts[..., 1], parts[..., 2]
    plain = compute + communication
    hidden = np.maximum(compute, hide) + communication - hide
    stage_of = [part % orders.stages for part in range(orders.virtual_stages)]  # looped: v on stage v mod S
    layer_stage = [stage_of[part] for part in part_at]
    tails = np.zeros((orders.stages, 3))
    np.add.at(tails, layer_stage, prices.tail[rep])
    tail_s = {"gradient reduction": tails[:, 0].tolist(), "optimizer": tails[:, 1].tolist()}
    # the gradient reduction behind the backward of each stage's last part to run (its chunk 0)
    last = {stage_of[part]: part for part in range(orders.stages)}  # chunk 0 of each stage
    free = np.maximum(compute - hide, 0.0)
    behind = [min(tails[s, 2], float(free[last[s], 1] + free[last[s], 2])) for s in range(orders.stages)]
    overlapped_tail = dict(tail_s, **{"gradient reduction": [max(0.0, r - h) for r, h in
                                                              zip(tail_s["gradient reduction"], behind)]})
    transfers = _transfer_seconds(prices, rep, part_at, hw) if orders.virtual_stages > 1 else None
    saved = np.zeros(orders.virtual_stages)
    np.add.at(saved, list(part_at), np.asarray(prices.saved_bytes, dtype=float)[rep])
    held = step_activation_peaks(orders, saved.reshape(orders.chunks, orders.stages).T)
    inflight = orders.inflight_peak
    stored = np.zeros((orders.stages, 3))
    np.add.at(stored, layer_stage, [(prices.stored[p].parameter_bytes, prices.stored[p].gradient_bytes,
                                     prices.stored[p].optimizer_state_bytes) for p in rep])
    memory = tuple(StageMemory(StoredBytes(*(int(v) for v in stored[s])), int(held[s]), inflight[s])
                   for s in range(orders.stages))
    return LayeredParts(orders, part_at, plain, compute, hidden, tail_s, overlapped_tail, transfers, memory)


def _transfer_seconds(prices: LayerPrices, rep: np.ndarray, part_at: Sequence[int], hw: Hardware | None
                      ) -> list[list[float]]:
    """Per direction, per boundary between parts: one microbatch's values crossing it. The
    boundary after layer `i` carries what the sample's boundary after position `rep[i]` does."""
    assert hw is not None, "a pipeline of several parts sends between stages"
    ends = [i for i in range(len(part_at) - 1) if part_at[i] != part_at[i + 1]]
    return [[sum(hw.collective_seconds(TRANSFER, [STAGE_AXIS], sent) for sent in prices.sent_bytes[direction][rep[i]])
             for i in ends] for direction in DIRECTIONS]


def _chunked(table: np.ndarray, orders: StepOrders) -> list[np.ndarray]:
    """(parts, kinds) seconds as one (stages, chunks) table per kind (part v is chunk v div S of
    stage v mod S)."""
    return [np.ascontiguousarray(table[:, kind].reshape(orders.chunks, orders.stages).T) for kind in range(len(KINDS))]

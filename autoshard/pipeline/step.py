"""The step of a pipeline schedule without its timeline: `simulate_pipeline`'s step seconds, busy
and idle seconds, bubble fraction and in-flight peaks, for a search that ranks thousands of
schedules and seconds and reads nothing else.

The numbers are `simulate_pipeline`'s to the last bit. Its event loop only ever starts an item or
a transfer at the latest of the times it waits for: an item when its stage's previous item ended
and its input arrived, a transfer when its item ended and the transfer before it on its link
(all of which leave the link's source stage, in that stage's order, so first ready first sent is
the stage's order) ended. Events at one time wait for each other through zero-second items and
transfers, never past that time, so the order the event loop takes them in changes no number. Here
each stage runs its items in order as far as their inputs have arrived, and a stage whose input
arrives is run on from where it waited: every start is the same `max` of the same ends and every
end the same sum, without an event heap and without per-event objects (compiled with numba).

`step_orders` gives a schedule's orders as the arrays this reads, without building `WorkItem`s;
`pipeline_step` also takes `stage_orders`' `StageOrders` (read once and kept for the next calls).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter
from typing import Mapping

import numpy as np
from numba import njit

from autoshard.errors import InputError
from autoshard.pipeline.events import checked_seconds, stuck_error
from autoshard.pipeline.schedules import KINDS, StageOrders, WorkItem, _shape_problems
from autoshard.pipeline.seconds import Seconds, TransferSeconds


@dataclass(frozen=True, slots=True)
class StepSummary:
    """One predicted step as a search ranks it: `PipelineTimeline`'s `step_s`, `busy_s`,
    `idle_s`, `bubble_fraction` and `inflight_peak`, equal to the simulation's."""

    step_s: float
    busy_s: tuple[float, ...]
    idle_s: tuple[float, ...]
    bubble_fraction: float
    inflight_peak: tuple[int, ...]


@dataclass(frozen=True, slots=True, eq=False)
class StepOrders:
    """A schedule's stage orders as arrays: item `i` of stage `s` is kind `KINDS[kinds[s, i]]`,
    microbatch `microbatches_of[s, i]`, chunk `chunks_of[s, i]` (each stage runs `3 * M * V`
    items). `inflight_peak` is `inflight_peaks` of the orders."""

    schedule: str
    stages: int
    microbatches: int
    chunks: int
    split_backward: bool
    kinds: np.ndarray
    microbatches_of: np.ndarray
    chunks_of: np.ndarray
    inflight_peak: tuple[int, ...]

    @property
    def virtual_stages(self) -> int:
        return self.stages * self.chunks

    def item(self, stage: int, position: int) -> WorkItem:
        """The work item at `position` of stage `stage`'s order."""
        return WorkItem(KINDS[self.kinds[stage, position]], int(self.microbatches_of[stage, position]),
                        int(self.chunks_of[stage, position]))


def pipeline_step(orders: StageOrders | StepOrders, forward_s: Seconds, backward_s: Seconds, weight_s: Seconds, *,
                  transfer_s: TransferSeconds = None,
                  tail_s: Seconds | Mapping[str, Seconds] = 0.0) -> StepSummary:
    """`simulate_pipeline(orders, ...)`'s step, busy, idle, bubble and in-flight peaks, the same
    numbers, without the timeline. The arguments are `simulate_pipeline`'s, checked the same way
    (the same `InputError`s, also for orders that wait forever); `orders` may also be `step_orders`'."""
    seconds, transfers, tails = checked_seconds(orders, forward_s, backward_s, weight_s, transfer_s, tail_s)
    encoded = orders if isinstance(orders, StepOrders) else _encoded(orders)
    table = np.stack([seconds[kind] for kind in KINDS]).astype(np.float64, copy=False)
    plain_sum = sys.version_info < (3, 12)  # from 3.12 on `sum` of floats compensates its rounding
    position, last_end, busy, spans = _run(encoded.kinds, encoded.microbatches_of, encoded.chunks_of, table,
                                           np.array(transfers, dtype=np.float64, order="C"),
                                           encoded.microbatches, encoded.split_backward, plain_sum)
    length = encoded.kinds.shape[1]
    if (position < length).any():
        raise stuck_error([(stage, orders.orders[stage][int(position[stage])] if isinstance(orders, StageOrders)
                            else encoded.item(stage, int(position[stage])))
                           for stage in range(encoded.stages) if position[stage] < length])
    busy_s = busy.tolist() if plain_sum else [float(sum(row)) for row in spans.tolist()]
    ends = last_end.tolist()
    span_s = max(ends)
    idle_s = [span_s - b for b in busy_s]
    step_s = span_s
    if tails:
        ends_s = last_end
        for part in tails.values():  # each stage's parts one after the other, from its last item's end
            ends_s = ends_s + np.asarray(part, dtype=np.float64)
        step_s = max(span_s, float(ends_s.max()))
    total_busy = sum(busy_s)
    return StepSummary(step_s, tuple(busy_s), tuple(idle_s), sum(idle_s) / total_busy if total_busy else 0.0,
                       encoded.inflight_peak)


def step_orders(schedule: str, stages: int, microbatches: int, chunks: int = 1) -> StepOrders:
    """`stage_orders(schedule, stages, microbatches, chunks)` as `StepOrders`, the same items in
    the same orders, built as arrays (and kept: the same arguments give the same object)."""
    problems = _shape_problems(schedule, stages, microbatches, chunks)
    if problems:
        raise InputError(problems)
    return _step_orders(schedule, stages, microbatches, chunks)


# --- StageOrders read into arrays, kept by identity (a StageOrders is frozen) ---

_KEPT: OrderedDict[int, tuple[StageOrders, StepOrders]] = OrderedDict()
_KEPT_MAX = 8
_KEPT_LOCK = threading.Lock()
_KIND_CODE = {kind: code for code, kind in enumerate(KINDS)}


def _encoded(orders: StageOrders) -> StepOrders:
    key = id(orders)
    with _KEPT_LOCK:
        kept = _KEPT.get(key)
        if kept is not None and kept[0] is orders:
            _KEPT.move_to_end(key)
            return kept[1]
    encoded = _read(orders)
    with _KEPT_LOCK:
        _KEPT[key] = (orders, encoded)  # holding `orders` keeps its id from being reused
        _KEPT.move_to_end(key)
        while len(_KEPT) > _KEPT_MAX:
            _KEPT.popitem(last=False)
    return encoded


def _read(orders: StageOrders) -> StepOrders:
    stages = orders.stages
    length = 3 * orders.microbatches * orders.chunks  # a StageOrders holds every item of every stage once
    flat = [item for order in orders.orders for item in order]
    count = stages * length
    kinds = np.fromiter(map(_KIND_CODE.__getitem__, map(attrgetter("kind"), flat)), np.int8, count).reshape(stages, -1)
    microbatches = np.fromiter(map(attrgetter("microbatch"), flat), np.int64, count).reshape(stages, -1)
    chunks = np.fromiter(map(attrgetter("chunk"), flat), np.int64, count).reshape(stages, -1)
    return _arrays(orders.schedule, orders.stages, orders.microbatches, orders.chunks, orders.split_backward,
                   kinds, microbatches, chunks)


def _arrays(schedule, stages, microbatches, chunks, split_backward, kinds, microbatches_of, chunks_of) -> StepOrders:
    held = np.cumsum(np.array([1, 0, -1], dtype=np.int64)[kinds], axis=1)  # F takes a pair's activations, W frees them
    peaks = tuple(int(p) for p in np.maximum(held.max(axis=1), 0))
    for array in (kinds, microbatches_of, chunks_of):
        array.flags.writeable = False
    return StepOrders(schedule, stages, microbatches, chunks, split_backward, kinds, microbatches_of, chunks_of,
                      peaks)


# --- the schedules' orders as arrays (schedules.py's generators, item for item) ---

_F, _B, _W = 0, 1, 2


@lru_cache(maxsize=64)
def _step_orders(schedule: str, stages: int, microbatches: int, chunks: int) -> StepOrders:
    build = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved": _interleaved, "zb-h1": _zb_h1}[schedule]
    length = 3 * microbatches * chunks
    kinds = np.empty((stages, length), dtype=np.int8)
    microbatches_of = np.empty((stages, length), dtype=np.int64)
    chunks_of = np.zeros((stages, length), dtype=np.int64)
    for stage in range(stages):
        build(stage, stages, microbatches, chunks, kinds[stage], microbatches_of[stage], chunks_of[stage])
    return _arrays(schedule, stages, microbatches, chunks, schedule == "zb-h1", kinds, microbatches_of, chunks_of)


def _place(kinds, microbatches_of, chunks_of, at, kind, microbatch, chunk=0) -> None:
    kinds[at] = kind
    microbatches_of[at] = microbatch
    chunks_of[at] = chunk


def _gpipe(stage, stages, microbatches, chunks, kinds, microbatches_of, chunks_of) -> None:
    m = np.arange(microbatches)
    _place(kinds, microbatches_of, chunks_of, slice(0, microbatches), _F, m)
    _place(kinds, microbatches_of, chunks_of, slice(microbatches, None, 2), _B, m)
    _place(kinds, microbatches_of, chunks_of, slice(microbatches + 1, None, 2), _W, m)


def _one_f_one_b(stage, stages, microbatches, chunks, kinds, microbatches_of, chunks_of) -> None:
    warmup = min(stages - stage, microbatches)
    steady = microbatches - warmup
    _place(kinds, microbatches_of, chunks_of, slice(0, warmup), _F, np.arange(warmup))
    end = warmup + 3 * steady  # steady state: B, W of m, then F of warmup + m
    _place(kinds, microbatches_of, chunks_of, slice(warmup, end, 3), _B, np.arange(steady))
    _place(kinds, microbatches_of, chunks_of, slice(warmup + 1, end, 3), _W, np.arange(steady))
    _place(kinds, microbatches_of, chunks_of, slice(warmup + 2, end, 3), _F, np.arange(warmup, microbatches))
    _place(kinds, microbatches_of, chunks_of, slice(end, None, 2), _B, np.arange(steady, microbatches))
    _place(kinds, microbatches_of, chunks_of, slice(end + 1, None, 2), _W, np.arange(steady, microbatches))


def _interleaved(stage, stages, microbatches, chunks, kinds, microbatches_of, chunks_of) -> None:
    total = microbatches * chunks
    k = np.arange(total)
    chunk = (k // stages) % chunks
    microbatch = (k // (stages * chunks)) * stages + k % stages  # the k-th forward's (and backward's)
    forward_chunk, backward_chunk = chunk, chunks - 1 - chunk
    warmup = min((chunks - 1) * stages + 2 * (stages - 1 - stage), total)
    steady = total - warmup
    _place(kinds, microbatches_of, chunks_of, slice(0, warmup), _F, microbatch[:warmup], forward_chunk[:warmup])
    end = warmup + 3 * steady  # steady state: F of warmup + k, then B, W of k
    _place(kinds, microbatches_of, chunks_of, slice(warmup, end, 3), _F, microbatch[warmup:], forward_chunk[warmup:])
    _place(kinds, microbatches_of, chunks_of, slice(warmup + 1, end, 3), _B, microbatch[:steady],
           backward_chunk[:steady])
    _place(kinds, microbatches_of, chunks_of, slice(warmup + 2, end, 3), _W, microbatch[:steady],
           backward_chunk[:steady])
    _place(kinds, microbatches_of, chunks_of, slice(end, None, 2), _B, microbatch[steady:], backward_chunk[steady:])
    _place(kinds, microbatches_of, chunks_of, slice(end + 1, None, 2), _W, microbatch[steady:],
           backward_chunk[steady:])


def _zb_h1(stage, stages, microbatches, chunks, kinds, microbatches_of, chunks_of) -> None:
    warmup = min(stages - 1 - stage, microbatches)
    _place(kinds, microbatches_of, chunks_of, slice(0, warmup), _F, np.arange(warmup))
    at = warmup
    weight = 0
    for m in range(microbatches):  # B of m, after the forward of warmup + m while any is left
        if warmup + m < microbatches:
            _place(kinds, microbatches_of, chunks_of, at, _F, warmup + m)
            at += 1
        _place(kinds, microbatches_of, chunks_of, at, _B, m)
        at += 1
        if m >= stage:  # stage s leaves s weight gradients pending: its W's fill the cool-down
            _place(kinds, microbatches_of, chunks_of, at, _W, weight)
            weight += 1
            at += 1
    left = microbatches - weight
    _place(kinds, microbatches_of, chunks_of, slice(at, at + left), _W, np.arange(weight, microbatches))


# --- the run ---

@njit(cache=True, nogil=True)
def _run(kinds, microbatches_of, chunks_of, seconds, transfers, microbatches, split_backward, plain_sum):
    """Run every stage as far as its inputs have arrived, and a stage again when one arrives.

    Returns per stage the position it stopped at (its length when it ran everything), its last
    item's end and its busy seconds (the sum, left to right, of its items' end - start), and
    every item's end - start (for a compensated `sum`) unless `plain_sum`."""
    stages, length = kinds.shape
    chunks = seconds.shape[2]
    virtual = stages * chunks
    activation = np.full((virtual, microbatches), -1.0)  # arrival at virtual stage v of microbatch m's; -1 not yet
    gradient = np.full((virtual, microbatches), -1.0)
    link_free = np.zeros((stages, stages))  # (from stage, to stage): when its last transfer ends
    position = np.zeros(stages, dtype=np.int64)
    free = np.zeros(stages)
    busy = np.zeros(stages)
    spans = np.empty((stages, length) if not plain_sum else (0, 0))
    waiting = np.empty(stages, dtype=np.int64)  # stages to run on, a stack
    queued = np.ones(stages, dtype=np.bool_)
    top = 0
    for stage in range(stages - 1, -1, -1):
        waiting[top] = stage
        top += 1
    while top > 0:
        top -= 1
        stage = waiting[top]
        queued[stage] = False
        at = position[stage]
        now = free[stage]
        total = busy[stage]
        while at < length:
            kind = kinds[stage, at]
            microbatch = microbatches_of[stage, at]
            chunk = chunks_of[stage, at]
            v = chunk * stages + stage
            start = now
            if kind == 0:
                if v > 0:
                    ready = activation[v, microbatch]
                    if ready < 0.0:
                        break
                    if ready > start:
                        start = ready
            elif kind == 1:  # its F ran before it on this stage
                if v < virtual - 1:
                    ready = gradient[v, microbatch]
                    if ready < 0.0:
                        break
                    if ready > start:
                        start = ready
            end = start + seconds[kind, stage, chunk]
            total += end - start
            if not plain_sum:
                spans[stage, at] = end - start
            now = end
            at += 1
            if kind == 0 and v < virtual - 1:
                target = v + 1
                direction = 0
                boundary = v
            elif v > 0 and ((kind == 1 and split_backward) or (kind == 2 and not split_backward)):
                target = v - 1
                direction = 1
                boundary = v - 1
            else:
                continue
            to = target % stages
            arrival = end
            if to != stage:  # the link sends one at a time, in this stage's order
                begin = link_free[stage, to]
                if end > begin:
                    begin = end
                arrival = begin + transfers[direction, boundary]
                link_free[stage, to] = arrival
                if not queued[to]:
                    queued[to] = True
                    waiting[top] = to
                    top += 1
            if direction == 0:
                activation[target, microbatch] = arrival
            else:
                gradient[target, microbatch] = arrival
        position[stage] = at
        free[stage] = now
        busy[stage] = total
    return position, free, busy, spans


def step_activation_peaks(orders: StepOrders, activation_bytes: np.ndarray) -> tuple[float, ...]:
    """`activation_peaks(orders, activation_bytes)` for a (stages, chunks) table of bytes, the
    same sums in the same order, without walking the items one by one."""
    table = np.asarray(activation_bytes, dtype=np.float64)
    sign = np.array([{"F": 1.0, "B": 0.0, "W": -1.0}[kind] for kind in KINDS])[orders.kinds]
    held = np.cumsum(sign * table[np.arange(orders.stages)[:, None], orders.chunks_of], axis=1)
    return tuple(float(peak) for peak in np.maximum(held.max(axis=1), 0.0))

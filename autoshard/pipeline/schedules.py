"""The order in which every pipeline stage runs its work items, for the four schedules.

A work item is one microbatch through one chunk (virtual stage) of one stage: `F` its forward,
`B` its input-gradient backward, `W` its weight-gradient backward (Qi et al., "Zero Bubble
(Almost) Pipeline Parallelism", ICLR 2024). Stage `s` holds chunks `0 .. V-1`; chunk `c` of
stage `s` is virtual stage `c*S + s` (Megatron-LM's and torch.distributed.pipelining's looped
placement), so a microbatch's forward runs stage 0 .. S-1 for chunk 0, then again for chunk 1.

- `gpipe`: every forward, then every backward (Huang et al., 2019).
- `1f1b`: stage `s` warms up with `min(S - s, M)` forwards, then alternates one backward and one
  forward, then cools down with the backwards left (Narayanan et al., PipeDream-Flush, 2021;
  torch's `Schedule1F1B`).
- `interleaved`: `V >= 2` chunks per stage, `M` a multiple of `S`; the forwards go round the chunks
  in groups of `S` microbatches, the backwards round them in reverse; stage `s` warms up with
  `min((V-1)*S + 2*(S-1-s), M*V)` forwards, then alternates one forward and one backward, then
  cools down (Narayanan et al., SC'21, Megatron-LM; torch's `ScheduleInterleaved1F1B`).
- `zb-h1`: 1F1B's forwards and input-gradient backwards with the weight-gradient backward split
  off: stage `s` warms up with `min(S-1-s, M)` forwards, alternates forward and `B`, and runs the
  oldest pending `W` after each `B` from its `(s+1)`-th on, the rest at the end. Every stage so
  holds at most `S` microbatches, 1F1B's peak (the first stage's), and the `W`s fill the
  cool-down's bubble (Qi et al. section 2.1; torch's zero-bubble rank orders with one chunk).

Only `zb-h1` splits the backward: in the other three `W` follows its `B` at once and the two are
one backward (torch's FULL_BACKWARD), whose input gradient leaves the stage when `W` ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard.errors import InputError, Problem

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
KINDS = ("F", "B", "W")


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One microbatch's forward (`F`), input-gradient (`B`) or weight-gradient (`W`) pass
    through one chunk of a stage."""

    kind: str
    microbatch: int
    chunk: int = 0

    def __repr__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f"/{self.chunk}" if self.chunk else "")


@dataclass(frozen=True, slots=True)
class StageOrders:
    """The work items of every stage in the order it runs them.

    `orders[s]` holds each (kind, microbatch, chunk) of stage `s` once, a `B` after its `F`
    and a `W` after its `B`. `split_backward` says whether `B` hands its input gradient to the
    stage before when it ends (`zb-h1`) or only once its `W` has run too (one fused backward)."""

    schedule: str
    stages: int
    microbatches: int
    chunks: int
    split_backward: bool
    orders: tuple[tuple[WorkItem, ...], ...]

    def __post_init__(self):
        problems = _count_problems(self.stages, self.microbatches, self.chunks)
        if problems:
            raise InputError(problems)
        problems = [Problem(f"orders[{stage}]", message) for stage, order in enumerate(self.orders)
                    for message in _order_problems(order, self.microbatches, self.chunks)]
        if len(self.orders) != self.stages:
            problems.insert(0, Problem("orders", f"has {len(self.orders)} stages' orders, expected {self.stages}"))
        if problems:
            raise InputError(problems)

    @property
    def virtual_stages(self) -> int:
        return self.stages * self.chunks

    def virtual_stage(self, stage: int, chunk: int) -> int:
        """Chunk `chunk` of stage `stage` in the forward order of all virtual stages."""
        return chunk * self.stages + stage

    def placement(self, virtual: int) -> tuple[int, int]:
        """(stage, chunk) running virtual stage `virtual`."""
        return virtual % self.stages, virtual // self.stages


def parse_schedule(text: str) -> tuple[str, int]:
    """`"1f1b"` -> ("1f1b", 1); `"interleaved:3"` -> ("interleaved", 3): the CLI's spelling."""
    name, _, chunks = text.strip().lower().partition(":")
    if name not in SCHEDULES:
        raise InputError(f"unknown schedule {text!r}; expected one of gpipe, 1f1b, interleaved:V, zb-h1", "schedule")
    if name != "interleaved":
        if chunks:
            raise InputError(f"{name} takes no virtual stage count (got {text!r})", "schedule")
        return name, 1
    if not chunks.isdigit():
        raise InputError(f"interleaved needs its virtual stages per device, e.g. interleaved:2 (got {text!r})",
                         "schedule")
    return name, int(chunks)


def stage_orders(schedule: str, stages: int, microbatches: int, chunks: int = 1) -> StageOrders:
    """The orders of `schedule` on `stages` stages of `chunks` chunks each for `microbatches`."""
    problems = _shape_problems(schedule, stages, microbatches, chunks)
    if problems:
        raise InputError(problems)
    order_of = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved": _interleaved, "zb-h1": _zb_h1}[schedule]
    orders = tuple(tuple(order_of(stage, stages, microbatches, chunks)) for stage in range(stages))
    return StageOrders(schedule, stages, microbatches, chunks, schedule == "zb-h1", orders)


def inflight_peaks(orders: StageOrders) -> tuple[int, ...]:
    """Per stage, the most (microbatch, chunk) pairs whose activations it holds at once.

    A pair is held from its `F`'s start to its `W`'s end: `W` reads the chunk's saved inputs,
    so they live until it has run (for the fused schedules `W` ends the one backward). A stage
    runs its items one at a time, so the peak is the largest count along its order; with `V`
    equal chunks a stage holds `peak / V` of a microbatch's activations of the whole stage."""
    peaks = []
    for order in orders.orders:
        held = peak = 0
        for item in order:
            held += {"F": 1, "B": 0, "W": -1}[item.kind]
            peak = max(peak, held)
        peaks.append(peak)
    return tuple(peaks)


def activation_peaks(orders: StageOrders, activation_bytes) -> tuple[float, ...]:
    """Per stage, the most activation bytes it holds at once, when a microbatch through chunk `c`
    of stage `s` saves `activation_bytes[s][c]` (one number for all, one per stage, or one per
    (stage, chunk)); held as in `inflight_peaks`, from `F`'s start to `W`'s end."""
    table = np.asarray(activation_bytes, dtype=float)
    if table.ndim == 1 and table.shape == (orders.stages,):
        table = np.repeat(table[:, None], orders.chunks, axis=1)
    if table.ndim > 2 or table.ndim == 1 or (table.ndim == 2 and table.shape != (orders.stages, orders.chunks)):
        raise InputError(f"has shape {table.shape}; expected a number, {orders.stages} per-stage numbers or "
                         f"({orders.stages}, {orders.chunks}) per (stage, chunk)", "activation_bytes")
    table = np.broadcast_to(table, (orders.stages, orders.chunks))
    bad = [Problem(f"activation_bytes[{s}][{c}]", f"must be a finite number of bytes >= 0, got {float(table[s, c])!r}")
           for s, c in zip(*np.nonzero(~(np.isfinite(table) & (table >= 0))))]
    if bad:
        raise InputError(bad)
    peaks = []
    for stage, order in enumerate(orders.orders):
        held = peak = 0.0
        for item in order:
            held += {"F": 1, "B": 0, "W": -1}[item.kind] * float(table[stage, item.chunk])
            peak = max(peak, held)
        peaks.append(peak)
    return tuple(peaks)


def chunk_inflight(orders: StageOrders) -> np.ndarray:
    """(stages, chunks): the most microbatches of each chunk a stage holds at once (as in
    `activation_peaks`). Weighting each chunk's saved bytes by these bounds the stage's peak from
    above: the chunks need not peak at the same time (with one chunk it is the peak)."""
    table = np.zeros((orders.stages, orders.chunks))
    for chunk in range(orders.chunks):
        unit = np.zeros((orders.stages, orders.chunks))
        unit[:, chunk] = 1.0
        table[:, chunk] = activation_peaks(orders, unit)
    return table


def _count_problems(stages, microbatches, chunks) -> list[Problem]:
    return [Problem(where, f"must be a whole number of at least 1, got {value!r}")
            for where, value in (("stages", stages), ("microbatches", microbatches), ("chunks", chunks))
            if isinstance(value, bool) or not isinstance(value, int) or value < 1]


def _shape_problems(schedule: str, stages, microbatches, chunks) -> list[Problem]:
    problems = _count_problems(stages, microbatches, chunks)
    if schedule not in SCHEDULES:
        expected = ", ".join(SCHEDULES)
        problems.insert(0, Problem("schedule", f"unknown schedule {schedule!r}; expected one of {expected}"))
    if problems:
        return problems
    if schedule == "interleaved":
        if chunks < 2:
            problems.append(Problem("chunks", f"interleaved 1F1B needs at least 2 virtual stages per device, "
                                              f"got {chunks} (one is the 1f1b schedule)"))
        if microbatches % stages:
            problems.append(Problem("microbatches", f"interleaved 1F1B needs the microbatches to be a multiple of the "
                                                    f"stages ({stages}), got {microbatches}"))
    elif chunks != 1:
        problems.append(Problem("chunks", f"{schedule} runs one chunk per stage, got {chunks}; "
                                          f"only interleaved takes more"))
    return problems


def _order_problems(order: tuple[WorkItem, ...], microbatches: int, chunks: int) -> list[str]:
    """What is wrong with one stage's order: a missing or repeated item, or one before its own
    `F` (for `B`) or `B` (for `W`)."""
    seen: set[tuple[str, int, int]] = set()
    problems = []
    for position, item in enumerate(order):
        key = (item.kind, item.microbatch, item.chunk)
        if item.kind not in KINDS or not 0 <= item.microbatch < microbatches or not 0 <= item.chunk < chunks:
            problems.append(f"item {position} ({item!r}) is not an F, B or W of microbatch 0..{microbatches - 1}, "
                            f"chunk 0..{chunks - 1}")
        elif key in seen:
            problems.append(f"item {position} ({item!r}) runs twice")
        else:
            before = {"B": "F", "W": "B"}.get(item.kind)
            if before and (before, item.microbatch, item.chunk) not in seen:
                problems.append(f"item {position} ({item!r}) runs before its {before}")
        seen.add(key)
    missing = [WorkItem(k, m, c) for m in range(microbatches) for c in range(chunks) for k in KINDS
               if (k, m, c) not in seen]
    if missing:
        problems.append(f"misses {', '.join(map(repr, missing[:5]))}{' ...' if len(missing) > 5 else ''}")
    return problems


def _backward(microbatch: int, chunk: int = 0) -> list[WorkItem]:
    """A fused backward: `B` and its `W` one after the other."""
    return [WorkItem("B", microbatch, chunk), WorkItem("W", microbatch, chunk)]


def _gpipe(stage: int, stages: int, microbatches: int, chunks: int) -> list[WorkItem]:
    order = [WorkItem("F", m) for m in range(microbatches)]
    for m in range(microbatches):
        order += _backward(m)
    return order


def _one_f_one_b(stage: int, stages: int, microbatches: int, chunks: int) -> list[WorkItem]:
    warmup = min(stages - stage, microbatches)
    order = [WorkItem("F", m) for m in range(warmup)]
    for m in range(microbatches - warmup):  # steady state: one backward, then one forward
        order += _backward(m) + [WorkItem("F", warmup + m)]
    for m in range(microbatches - warmup, microbatches):
        order += _backward(m)
    return order


def _interleaved(stage: int, stages: int, microbatches: int, chunks: int) -> list[WorkItem]:
    total = microbatches * chunks

    def nth(k: int, backward: bool) -> tuple[int, int]:
        """The k-th forward (backward) of a stage: groups of `stages` microbatches per chunk,
        chunks ascending for forwards and descending for backwards."""
        chunk = (k // stages) % chunks
        return (k // (stages * chunks)) * stages + k % stages, chunks - 1 - chunk if backward else chunk

    warmup = min((chunks - 1) * stages + 2 * (stages - 1 - stage), total)
    order = [WorkItem("F", *nth(k, False)) for k in range(warmup)]
    for k in range(total - warmup):  # steady state: one forward, then one backward
        order += [WorkItem("F", *nth(warmup + k, False))] + _backward(*nth(k, True))
    for k in range(total - warmup, total):
        order += _backward(*nth(k, True))
    return order


def _zb_h1(stage: int, stages: int, microbatches: int, chunks: int) -> list[WorkItem]:
    warmup = min(stages - 1 - stage, microbatches)
    order = [WorkItem("F", m) for m in range(warmup)]
    weights = iter(range(microbatches))
    for m in range(microbatches):  # B of microbatch m, after the forward of warmup + m while any is left
        if warmup + m < microbatches:
            order.append(WorkItem("F", warmup + m))
        order.append(WorkItem("B", m))
        if m >= stage:  # stage s leaves s weight gradients pending: its W's fill the cool-down
            order.append(WorkItem("W", next(weights)))
    order += [WorkItem("W", m) for m in weights]
    return order

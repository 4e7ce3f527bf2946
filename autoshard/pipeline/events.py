"""The event simulation of one training step of a pipeline schedule: when every work item and
every stage-to-stage transfer starts and ends, and so the step's seconds, its bubble and the
activations each stage holds.

The rules:
- A stage runs its items one at a time, in its schedule order (`StageOrders`); an item starts
  when the stage is free and its inputs are there. `F` of virtual stage `v > 0` needs the
  activation of `F` on `v - 1`; `B` needs its own `F` and, below the last virtual stage, the
  gradient of `v + 1`; `W` needs its own `B`.
- An activation leaves when its `F` ends; a gradient leaves when its backward ends: at `B`'s end
  when the schedule splits the backward (`zb-h1`), at `W`'s end when `B` and `W` are one backward.
- A transfer between virtual stages on two stages takes its boundary's seconds on the link from
  the one stage to the other. Sends do not stop the stage (compute and communication overlap);
  each direction of a link carries one transfer at a time, first ready first sent (two
  activations sent back to back queue for the link rather than sharing it unpriced). Virtual
  stages on one stage (`S = 1`) hand over in place, without a transfer.
- Each stage's tail (gradient reduction and optimizer step, once per step) starts when its last
  item ends, its parts (e.g. a gradient `all_reduce`, then the optimizer) one after the other;
  the step ends when the last tail does.
- The bubble is the time a stage is idle between 0 and the end of the last item of any stage,
  and `bubble_fraction` is the idle time of all stages over their busy time (Megatron-LM's
  t_pb / t_id: (S - 1) / M for 1F1B on equal stages).

The simulation is monotone in the item and transfer seconds: no time goes down when any input
goes up. Each start is a max of ends and each end a start plus seconds, in orders that no
seconds change: a stage's items run in its schedule order, and every transfer on a link leaves
the same stage (the link's source), so the link sends them in that stage's order too. That is
what lets a simulation with per-stage lower bounds bound every plan.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Mapping, NamedTuple

import numpy as np

from autoshard.errors import InputError, Problem
from autoshard.pipeline.schedules import StageOrders, WorkItem, inflight_peaks
from autoshard.pipeline.seconds import DIRECTIONS, TAIL, Seconds, TransferSeconds, per_boundary, per_chunk, per_stage


@dataclass(frozen=True, slots=True)
class ItemEvent:
    """A work item as it ran on its stage."""

    stage: int
    kind: str
    microbatch: int
    chunk: int
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class TransferEvent:
    """An activation (`forward`) or gradient (`backward`) crossing boundary `boundary`, between
    virtual stages `boundary` and `boundary + 1`, from `source` to `target` ((stage, chunk) each).
    It is ready at `ready_s` and waits for its link until `start_s`."""

    direction: str
    microbatch: int
    boundary: int
    source: tuple[int, int]
    target: tuple[int, int]
    ready_s: float
    start_s: float
    end_s: float

    @property
    def link(self) -> tuple[int, int]:
        """(from stage, to stage)."""
        return self.source[0], self.target[0]


@dataclass(frozen=True, slots=True)
class TailEvent:
    """One part of a stage's once-per-step tail as it ran."""

    stage: int
    name: str
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class PipelineTimeline:
    """One predicted step: `items[s]` in the order stage `s` ran them, the transfers by start,
    the tails' parts by stage, and per stage its busy and idle seconds and in-flight peak
    ((microbatch, chunk) pairs whose activations it held at once, `inflight_peaks`)."""

    orders: StageOrders
    items: tuple[tuple[ItemEvent, ...], ...]
    transfers: tuple[TransferEvent, ...]
    tails: tuple[TailEvent, ...]
    step_s: float
    busy_s: tuple[float, ...]
    idle_s: tuple[float, ...]
    bubble_fraction: float
    inflight_peak: tuple[int, ...]


def simulate_pipeline(orders: StageOrders, forward_s: Seconds, backward_s: Seconds, weight_s: Seconds, *,
                      transfer_s: TransferSeconds = None,
                      tail_s: Seconds | Mapping[str, Seconds] = 0.0) -> PipelineTimeline:
    """Run `orders` with these seconds and return the timeline.

    `forward_s`, `backward_s` (input gradient) and `weight_s` (weight gradient): one number, one
    per stage, or one per (stage, chunk). `transfer_s`: None (free), one number, one per virtual
    boundary (`S*V - 1` of them, both directions), a (2, S*V - 1) table (forward row, backward
    row) or a callable `(boundary, direction) -> seconds`. `tail_s`: one number or one per stage,
    or named parts run in their order, each one number or one per stage
    (`{"gradient all_reduce": ..., "optimizer": ...}`)."""
    seconds, transfers, tails = checked_seconds(orders, forward_s, backward_s, weight_s, transfer_s, tail_s)
    items, moves = _run(orders, seconds, transfers)
    return _timeline(orders, items, moves, tails)


def checked_seconds(orders: StageOrders, forward_s: Seconds, backward_s: Seconds, weight_s: Seconds,
                    transfer_s: TransferSeconds = None, tail_s: Seconds | Mapping[str, Seconds] = 0.0
                    ) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, np.ndarray]]:
    """`simulate_pipeline`'s seconds checked and brought to their shapes: per kind (`F`, `B`, `W`)
    a (stages, chunks) table, the (2, S*V - 1) transfer table and the tail's (stages,) parts by
    name, in their order; raises one `InputError` with every problem found."""
    stages, chunks = orders.stages, orders.chunks
    problems: list[Problem] = []
    seconds = {"F": per_chunk("forward_s", forward_s, stages, chunks, problems),
               "B": per_chunk("backward_s", backward_s, stages, chunks, problems),
               "W": per_chunk("weight_s", weight_s, stages, chunks, problems)}
    transfers = per_boundary("transfer_s", transfer_s, orders.virtual_stages - 1, problems)
    parts = tail_s if isinstance(tail_s, Mapping) else {TAIL: tail_s}
    tails = {name: per_stage(f"tail_s[{name}]" if parts is tail_s else "tail_s", value, stages, problems)
             for name, value in parts.items()}
    if problems:
        raise InputError(problems)
    return seconds, transfers, tails


def stuck_error(waiting: list[tuple[int, WorkItem]]) -> InputError:
    """The error of a run whose stages wait forever: (stage, the item it waits at) each."""
    return InputError([Problem("orders", f"stage {stage} waits forever at {item!r}") for stage, item in waiting])


class _Send(NamedTuple):
    """An activation or gradient leaving virtual stage `source` for virtual stage `target`."""

    direction: str
    microbatch: int
    source: int
    target: int


class _Run:
    """The simulation's state: per stage its next item and whether it is busy, the items done,
    the inputs arrived, per link its queue and whether it is busy, and the stages and links
    whose state changed since they were last looked at."""

    def __init__(self, orders: StageOrders, seconds: dict[str, np.ndarray], transfers: np.ndarray):
        self.orders = orders
        self.seconds = {kind: table.tolist() for kind, table in seconds.items()}  # plain floats in every event
        self.transfers = transfers.tolist()
        self.next = [0] * orders.stages
        self.busy = [False] * orders.stages
        self.done: set[tuple[str, int, int]] = set()  # (kind, microbatch, virtual stage)
        self.arrived: set[tuple[str, int, int]] = set()  # ("F" activation | "B" gradient, microbatch, virtual stage)
        self.queues: dict[tuple[int, int], list] = {}
        self.link_busy: set[tuple[int, int]] = set()
        self.changed_stages: set[int] = set(range(orders.stages))
        self.changed_links: set[tuple[int, int]] = set()
        self.clock: list = []  # (time, sequence, event)
        self.sequence = 0
        self.items: list[list[ItemEvent]] = [[] for _ in range(orders.stages)]
        self.moves: list[TransferEvent] = []

    def at(self, time: float, event: tuple) -> None:
        heapq.heappush(self.clock, (time, self.sequence, event))
        self.sequence += 1

    def ready(self, stage: int, item: WorkItem) -> bool:
        virtual = self.orders.virtual_stage(stage, item.chunk)
        if item.kind == "F":
            return virtual == 0 or ("F", item.microbatch, virtual) in self.arrived
        if item.kind == "B":
            last = virtual == self.orders.virtual_stages - 1
            gradient = last or ("B", item.microbatch, virtual) in self.arrived
            return ("F", item.microbatch, virtual) in self.done and gradient
        return ("B", item.microbatch, virtual) in self.done

    def dispatch(self, now: float) -> None:
        """Start every transfer whose link is free and every item whose stage is free and whose
        inputs are there, looking only at the links and stages that changed."""
        for link in sorted(self.changed_links):
            if link not in self.link_busy and self.queues[link]:
                ready_s, _, send = heapq.heappop(self.queues[link])
                self.link_busy.add(link)
                boundary = min(send.source, send.target)
                end_s = now + self.transfers[DIRECTIONS.index(send.direction)][boundary]
                self.moves.append(TransferEvent(send.direction, send.microbatch, boundary,
                                                self.orders.placement(send.source), self.orders.placement(send.target),
                                                ready_s, now, end_s))
                self.at(end_s, ("moved", link, send))
        self.changed_links.clear()
        for stage in sorted(self.changed_stages):
            order = self.orders.orders[stage]
            if not self.busy[stage] and self.next[stage] < len(order) and self.ready(stage, order[self.next[stage]]):
                item = order[self.next[stage]]
                self.busy[stage] = True
                self.at(now + self.seconds[item.kind][stage][item.chunk], ("ran", stage, item, now))
        self.changed_stages.clear()

    def ran(self, now: float, stage: int, item: WorkItem, start_s: float) -> None:
        orders = self.orders
        virtual = orders.virtual_stage(stage, item.chunk)
        self.items[stage].append(ItemEvent(stage, item.kind, item.microbatch, item.chunk, start_s, now))
        self.done.add((item.kind, item.microbatch, virtual))
        self.busy[stage] = False
        self.next[stage] += 1
        self.changed_stages.add(stage)
        if item.kind == "F" and virtual < orders.virtual_stages - 1:
            self.send(now, "forward", item.microbatch, virtual, virtual + 1)
        backward_done = item.kind == ("B" if orders.split_backward else "W")
        if backward_done and virtual > 0:
            self.send(now, "backward", item.microbatch, virtual, virtual - 1)

    def send(self, now: float, direction: str, microbatch: int, source: int, target: int) -> None:
        send = _Send(direction, microbatch, source, target)
        link = (self.orders.placement(source)[0], self.orders.placement(target)[0])
        if link[0] == link[1]:  # virtual stages on one stage: handed over in place
            self.arrive(send)
            return
        heapq.heappush(self.queues.setdefault(link, []), (now, self.sequence, send))
        self.sequence += 1
        self.changed_links.add(link)

    def moved(self, now: float, link: tuple[int, int], send: _Send) -> None:
        self.link_busy.discard(link)
        self.changed_links.add(link)
        self.arrive(send)

    def arrive(self, send: _Send) -> None:
        self.arrived.add(("F" if send.direction == "forward" else "B", send.microbatch, send.target))
        self.changed_stages.add(self.orders.placement(send.target)[0])


def _run(orders: StageOrders, seconds: dict[str, np.ndarray], transfers: np.ndarray):
    run = _Run(orders, seconds, transfers)
    now = 0.0
    while True:
        run.dispatch(now)
        if not run.clock:
            break
        now = run.clock[0][0]
        while run.clock and run.clock[0][0] == now:
            _, _, event = heapq.heappop(run.clock)
            getattr(run, event[0])(now, *event[1:])
    stuck = [(stage, order[run.next[stage]]) for stage, order in enumerate(orders.orders)
             if run.next[stage] < len(order)]
    if stuck:
        raise stuck_error(stuck)
    return run.items, run.moves  # the transfers as they started


def _timeline(orders: StageOrders, items: list[list[ItemEvent]], moves: list[TransferEvent],
              tails: dict[str, np.ndarray]) -> PipelineTimeline:
    span_s = max(stage_items[-1].end_s for stage_items in items)
    busy = [float(sum(e.end_s - e.start_s for e in stage_items)) for stage_items in items]
    idle = [span_s - b for b in busy]
    parts = []
    for stage, stage_items in enumerate(items):
        end_s = stage_items[-1].end_s
        for name, seconds in tails.items():
            parts.append(TailEvent(stage, name, end_s, end_s + float(seconds[stage])))
            end_s = parts[-1].end_s
    total_busy = sum(busy)
    return PipelineTimeline(orders, tuple(tuple(stage_items) for stage_items in items), tuple(moves), tuple(parts),
                            max([span_s] + [part.end_s for part in parts]), tuple(busy), tuple(idle),
                            sum(idle) / total_busy if total_busy else 0.0, inflight_peaks(orders))

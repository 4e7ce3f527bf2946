"""A predicted step as a Trace Event Format file (the JSON Object Format that Perfetto and
chrome://tracing open), so the bubbles can be seen and laid beside a profiler trace of the run.

One process, "autoshard predicted step"; one track (thread) per stage, then one per link
direction that carries a transfer ("link 0->1"). A complete slice (`ph: X`) per work item
(`F`/`B`/`W`, category `compute`, its kind in `args`), per part of a stage's tail (gradient
reduction, optimizer) and per transfer on its link's track. Each transfer is also a flow
(`ph: s` at the start of the item that sent it, `ph: f` with `bp: e` at the start of the item
that received it; one id per transfer), drawn as an arrow between the stages. Perfetto and
chrome://tracing bind a flow event to the slice enclosing its `ts` on its track; Chrome DevTools
groups a flow's events by (cat, name, id) and binds each to the slice of equal pid, tid, ts and
cat, which is why every work item shares the one category its flows carry. Times are
microseconds from the step's start (`ts`, `dur`).

Spec: "Trace Event Format", Google, https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

import json
from pathlib import Path

from autoshard.pipeline.events import ItemEvent, PipelineTimeline

PROCESS = 0
COMPUTE = "compute"  # the category of every work item and of the flows between them
KINDS = {"F": "forward", "B": "backward_input", "W": "backward_weight"}
PAYLOADS = {"forward": "activation", "backward": "gradient"}


def trace_events(timeline: PipelineTimeline) -> dict:
    """The trace of `timeline` as a JSON-ready dict (`traceEvents`, `displayTimeUnit`, `otherData`)."""
    orders = timeline.orders
    links = sorted({move.link for move in timeline.transfers})
    track = {("stage", s): s for s in range(orders.stages)}
    track.update({("link", link): orders.stages + i for i, link in enumerate(links)})
    events: list[dict] = [{"ph": "M", "pid": PROCESS, "tid": 0, "name": "process_name",
                           "args": {"name": "autoshard predicted step"}}]
    for (what, key), tid in track.items():
        name = f"stage {key}" if what == "stage" else f"link {key[0]}->{key[1]}"
        events += [{"ph": "M", "pid": PROCESS, "tid": tid, "name": "thread_name", "args": {"name": name}},
                   {"ph": "M", "pid": PROCESS, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}]
    by_item: dict[tuple[int, str, int, int], ItemEvent] = {}
    for stage_items in timeline.items:
        for item in stage_items:
            by_item[item.stage, item.kind, item.microbatch, item.chunk] = item
            events.append(_slice(_item_name(item, orders.chunks), COMPUTE, item.start_s, item.end_s, item.stage,
                                 {"kind": KINDS[item.kind], "microbatch": item.microbatch, "chunk": item.chunk,
                                              "virtual_stage": orders.virtual_stage(item.stage, item.chunk)}))
    for part in timeline.tails:
        if part.end_s > part.start_s:
            events.append(_slice(part.name, "tail", part.start_s, part.end_s, part.stage, {}))
    sent_by = "B" if orders.split_backward else "W"
    for flow_id, move in enumerate(timeline.transfers, start=1):
        name = f"{PAYLOADS[move.direction]} {move.microbatch}"
        args = {"microbatch": move.microbatch, "boundary": move.boundary, "ready_us": move.ready_s * 1e6}
        events.append(_slice(name, "transfer", move.start_s, move.end_s, track["link", move.link], args))
        forward = move.direction == "forward"
        sender = by_item[move.source[0], "F" if forward else sent_by, move.microbatch, move.source[1]]
        receiver = by_item[move.target[0], "F" if forward else "B", move.microbatch, move.target[1]]
        events += [_flow("s", flow_id, name, sender), {**_flow("f", flow_id, name, receiver), "bp": "e"}]
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedule": orders.schedule, "stages": orders.stages, "microbatches": orders.microbatches,
                          "chunks": orders.chunks, "step_s": timeline.step_s,
                          "bubble_fraction": timeline.bubble_fraction}}


def write_trace(timeline: PipelineTimeline, path: str | Path) -> Path:
    """Write `trace_events(timeline)` to `path` (the `--trace FILE` output)."""
    path = Path(path)
    path.write_text(json.dumps(trace_events(timeline), separators=(",", ":")) + "\n")
    return path


def _item_name(item: ItemEvent, chunks: int) -> str:
    return f"{item.kind}{item.microbatch}" + (f" chunk {item.chunk}" if chunks > 1 else "")


def _flow(phase: str, flow_id: int, name: str, item: ItemEvent) -> dict:
    """A flow's end bound to `item`'s slice: on its track, at its start, in its category."""
    return {"ph": phase, "id": flow_id, "name": name, "cat": COMPUTE, "pid": PROCESS, "tid": item.stage,
            "ts": item.start_s * 1e6}


def _slice(name: str, category: str, start_s: float, end_s: float, tid: int, args: dict) -> dict:
    return {"ph": "X", "name": name, "cat": category, "pid": PROCESS, "tid": tid, "ts": start_s * 1e6,
            "dur": (end_s - start_s) * 1e6, "args": args}

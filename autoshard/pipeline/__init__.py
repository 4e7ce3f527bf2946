"""Pipeline parallelism priced event by event: the per-stage orders of the GPipe, 1F1B,
interleaved 1F1B and ZB-H1 schedules (`schedules`), their event simulation on stages with
their own forward, backward and weight-gradient seconds and the transfers between them
(`events`), and the predicted step as a Trace Event Format file (`trace`).

Nothing here knows graphs or plans: a stage is an index, its work is seconds. The planner
prices each stage and hands the seconds in.

May import: `errors` (and numpy; `step`, the compiled step without its timeline, numba).
"""

from autoshard.pipeline.events import ItemEvent, PipelineTimeline, TailEvent, TransferEvent, simulate_pipeline
from autoshard.pipeline.schedules import (SCHEDULES, StageOrders, WorkItem, activation_peaks, inflight_peaks,
                                          parse_schedule, stage_orders)
from autoshard.pipeline.trace import trace_events, write_trace

__all__ = ["SCHEDULES", "StageOrders", "WorkItem", "activation_peaks", "inflight_peaks", "parse_schedule",
           "stage_orders", "ItemEvent", "PipelineTimeline", "TailEvent", "TransferEvent", "simulate_pipeline",
           "trace_events", "write_trace"]

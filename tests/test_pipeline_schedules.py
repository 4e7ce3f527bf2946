"""The pipeline schedules' orders, their event simulation and its trace, checked against the
closed forms on equal stages, hand-computed timelines on unequal stages and slow links, the
in-flight activation counts the papers state, and torch.distributed.pipelining's own orders."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.errors import InputError
from autoshard.pipeline import (StageOrders, WorkItem, activation_peaks, inflight_peaks, parse_schedule,
                                simulate_pipeline, stage_orders, trace_events, write_trace)


def kinds(order) -> str:
    return "".join(item.kind for item in order)


# --- closed forms on equal stages, transfers free ---------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages, microbatches", [(1, 1), (1, 4), (2, 1), (2, 3), (4, 4), (4, 8), (8, 3)])
def test_gpipe_and_1f1b_bubble_is_s_minus_1_times_f_b_w(schedule, stages, microbatches):
    f, b, w = 1.0, 2.0, 0.5
    timeline = simulate_pipeline(stage_orders(schedule, stages, microbatches), f, b, w)
    assert timeline.step_s == pytest.approx((microbatches + stages - 1) * (f + b + w))
    assert timeline.idle_s == pytest.approx([(stages - 1) * (f + b + w)] * stages)
    assert timeline.bubble_fraction == pytest.approx((stages - 1) / microbatches)


@pytest.mark.parametrize("stages, chunks", [(2, 2), (2, 3), (4, 2), (4, 3), (3, 4)])
@pytest.mark.parametrize("rounds", [1, 2, 4])
def test_interleaved_bubble_fraction_is_s_minus_1_over_v_m(stages, chunks, rounds):
    microbatches = rounds * stages
    f, b, w = 0.5, 1.0, 0.25  # per chunk: a stage's forward is chunks * 0.5
    timeline = simulate_pipeline(stage_orders("interleaved", stages, microbatches, chunks), f, b, w)
    assert timeline.bubble_fraction == pytest.approx((stages - 1) / (chunks * microbatches))
    assert timeline.step_s == pytest.approx((microbatches * chunks + stages - 1) * (f + b + w))


@pytest.mark.parametrize("f, b, w", [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, 0.5)])
@pytest.mark.parametrize("stages, microbatches", [(2, 2), (2, 8), (4, 4), (4, 8), (8, 16)])
def test_zb_h1_bubble_is_s_minus_1_times_f_plus_b_minus_w(f, b, w, stages, microbatches):
    # The paper's assumptions (Qi et al. 2024, section 2.1, drawn with T_F = T_B = T_W): equal stages, free
    # transfers, at least as many microbatches as stages, and W no longer than F or B.
    timeline = simulate_pipeline(stage_orders("zb-h1", stages, microbatches), f, b, w)
    assert timeline.step_s == pytest.approx(microbatches * (f + b + w) + (stages - 1) * (f + b - w))
    assert timeline.idle_s == pytest.approx([(stages - 1) * (f + b - w)] * stages)


def test_zb_h1_closed_form_needs_w_no_longer_than_f():
    # W = 2 > F = 1: the W's no longer fit the gaps, and the simulation says so (33 s, not the form's 32 s).
    timeline = simulate_pipeline(stage_orders("zb-h1", 2, 8), 1.0, 1.0, 2.0)
    assert timeline.step_s == 33.0 > 8 * 4 + 1 * (1 + 1 - 2)


# --- hand-computed unequal stages -------------------------------------------------------------------------------------

def test_unequal_stages_1f1b_by_hand():
    # S = 2, M = 3, F = (1, 2), B = (2, 3), W = (1, 1); B and W are one backward (the gradient leaves after W).
    # stage 0 runs F0 F1 B0W0 F2 B1W1 B2W2, stage 1 runs F0 B0W0 F1 B1W1 F2 B2W2:
    #   stage 0: F0 0-1, F1 1-2
    #   stage 1: F0 1-3 (F0 of stage 0 ends at 1), B0 3-6, W0 6-7 -> gradient at 7
    #   stage 0: B0 7-9, W0 9-10, F2 10-11
    #   stage 1: F1 7-9 (free at 7), B1 9-12, W1 12-13 -> gradient at 13
    #   stage 0: B1 13-15, W1 15-16
    #   stage 1: F2 13-15 (F2 arrived at 11), B2 15-18, W2 18-19 -> gradient at 19
    #   stage 0: B2 19-21, W2 21-22.  Step 22 s (the closed form on the slower stage, 4 * 6 = 24, is wrong).
    timeline = simulate_pipeline(stage_orders("1f1b", 2, 3), (1, 2), (2, 3), (1, 1))
    assert timeline.step_s == 22.0
    assert [(e.kind, e.microbatch, e.start_s, e.end_s) for e in timeline.items[1]] == [
        ("F", 0, 1, 3), ("B", 0, 3, 6), ("W", 0, 6, 7), ("F", 1, 7, 9), ("B", 1, 9, 12), ("W", 1, 12, 13),
        ("F", 2, 13, 15), ("B", 2, 15, 18), ("W", 2, 18, 19)]
    assert timeline.busy_s == (12.0, 18.0) and timeline.idle_s == (10.0, 4.0)
    assert timeline.bubble_fraction == pytest.approx(14 / 30)


def test_unequal_stages_gpipe_and_zb_h1_by_hand():
    # GPipe: stage 0 F 0-1, 1-2, 2-3; stage 1 F 1-3, 3-5, 5-7, then B0W0 7-11, B1W1 11-15, B2W2 15-19, each
    # gradient leaving at 11, 15, 19; stage 0 B0W0 11-14, B1W1 15-18, B2W2 19-22.  Step 22 s.
    assert simulate_pipeline(stage_orders("gpipe", 2, 3), (1, 2), (2, 3), (1, 1)).step_s == 22.0
    # ZB-H1: stage 0 runs F0 F1 B0 W0 F2 B1 W1 B2 W2, stage 1 runs F0 B0 F1 B1 W0 F2 B2 W1 W2; a gradient leaves at
    # B's end.  stage 0: F0 0-1, F1 1-2.  stage 1: F0 1-3, B0 3-6 (-> 6).  stage 0: B0 6-8, W0 8-9, F2 9-10.
    # stage 1: F1 6-8, B1 8-11 (-> 11), W0 11-12, F2 12-14, B2 14-17 (-> 17), W1 17-18, W2 18-19.
    # stage 0: B1 11-13, W1 13-14, B2 17-19, W2 19-20.  Step 20 s.
    timeline = simulate_pipeline(stage_orders("zb-h1", 2, 3), (1, 2), (2, 3), (1, 1))
    assert timeline.step_s == 20.0
    assert [e.end_s for e in timeline.items[0]] == [1, 2, 8, 9, 10, 13, 14, 19, 20]


def test_transfer_dominated_case_by_hand():
    # S = 2, M = 2, F = B = W = 1, 4 s each way on the link.
    # 1F1B: stage 0 runs F0 F1 B0W0 B1W1, stage 1 F0 B0W0 F1 B1W1.
    #   stage 0: F0 0-1 -> link 0->1 1-5; F1 1-2 -> queues for the link: 5-9
    #   stage 1: F0 5-6, B0 6-7, W0 7-8 -> link 1->0 8-12; F1 9-10, B1 10-11, W1 11-12 -> link 1->0 12-16
    #   stage 0: B0 12-13, W0 13-14, B1 16-17, W1 17-18.  Step 18 s.
    # The closed form (M + S - 1)(F + B + W) = 9 s is wrong, and so is it plus one crossing each way, 9 + 8 = 17 s.
    timeline = simulate_pipeline(stage_orders("1f1b", 2, 2), 1.0, 1.0, 1.0, transfer_s=4.0)
    assert timeline.step_s == 18.0
    assert [(t.direction, t.microbatch, t.ready_s, t.start_s, t.end_s) for t in timeline.transfers] == [
        ("forward", 0, 1, 1, 5), ("forward", 1, 2, 5, 9), ("backward", 0, 8, 8, 12), ("backward", 1, 12, 12, 16)]
    assert all(t.link == ((0, 1) if t.direction == "forward" else (1, 0)) for t in timeline.transfers)


def test_transfer_seconds_per_direction_from_a_callable_or_a_table():
    # Activations 4 s, gradients 1 s.  stage 0: F0 0-1 -> 1-5, F1 1-2 -> 5-9.  stage 1: F0 5-6, B0W0 6-8 -> 8-9,
    # F1 9-10, B1W1 10-12 -> 12-13.  stage 0: B0W0 9-11, B1W1 13-15.  Step 15 s.
    orders = stage_orders("1f1b", 2, 2)
    def seconds(boundary: int, direction: str) -> float:
        return 4.0 if direction == "forward" else 1.0

    by_call = simulate_pipeline(orders, 1, 1, 1, transfer_s=seconds)
    by_table = simulate_pipeline(orders, 1, 1, 1, transfer_s=[[4.0], [1.0]])
    assert by_call.step_s == by_table.step_s == 15.0


def test_tails_run_once_after_each_stages_last_item():
    # 1F1B, S = 2, M = 2, F = B = W = 1: stage 0's last item ends at 9, stage 1's at 7.
    orders = stage_orders("1f1b", 2, 2)
    assert simulate_pipeline(orders, 1, 1, 1, tail_s=(3.0, 0.5)).step_s == 12.0
    timeline = simulate_pipeline(orders, 1, 1, 1, tail_s=(0.0, 3.0))
    assert timeline.step_s == 10.0
    assert [(t.stage, t.start_s, t.end_s) for t in timeline.tails] == [(0, 9.0, 9.0), (1, 7.0, 10.0)]
    parts = simulate_pipeline(orders, 1, 1, 1, tail_s={"gradient all_reduce": (1.0, 2.5), "optimizer": 0.5})
    assert [(t.stage, t.name, t.start_s, t.end_s) for t in parts.tails] == [
        (0, "gradient all_reduce", 9.0, 10.0), (0, "optimizer", 10.0, 10.5),
        (1, "gradient all_reduce", 7.0, 9.5), (1, "optimizer", 9.5, 10.0)]
    assert parts.step_s == 10.5
    assert simulate_pipeline(orders, 1, 1, 1, tail_s={}).step_s == 9.0
    assert timeline.idle_s == (3.0, 3.0)  # the bubble is measured up to the last item, tails aside


# --- in-flight activations --------------------------------------------------------------------------------------------

def test_inflight_peaks_per_stage():
    stages = 4
    assert inflight_peaks(stage_orders("1f1b", stages, 8)) == (4, 3, 2, 1)  # stage i holds S - i
    assert inflight_peaks(stage_orders("1f1b", stages, 2)) == (2, 2, 2, 1)  # never more than M
    assert inflight_peaks(stage_orders("gpipe", stages, 8)) == (8,) * 4
    # ZB-H1 delays stage i's first W by i, so every stage holds S: 1F1B's peak, its first stage's (Qi et al. 2.1)
    assert inflight_peaks(stage_orders("zb-h1", stages, 8)) == (4,) * 4
    assert simulate_pipeline(stage_orders("1f1b", stages, 8), 1, 1, 1).inflight_peak == (4, 3, 2, 1)


@pytest.mark.parametrize("stages, chunks", [(2, 2), (4, 2), (4, 3), (8, 4)])
def test_interleaved_first_stage_holds_s_times_1_plus_s_minus_1_over_s_v(stages, chunks):
    # Counted in chunks of 1/V of a stage's microbatch: (V - 1) S + 2 (S - 1 - i) warm-up forwards plus one.
    peaks = inflight_peaks(stage_orders("interleaved", stages, 2 * stages, chunks))
    assert peaks == tuple((chunks - 1) * stages + 2 * (stages - 1 - i) + 1 for i in range(stages))
    assert peaks[0] / chunks == pytest.approx(stages * (1 + (stages - 1) / (stages * chunks)))


def test_activation_peaks_weigh_each_chunk():
    orders = stage_orders("interleaved", 2, 4, 2)
    assert activation_peaks(orders, 1.0) == inflight_peaks(orders) == (5, 3)
    # stage 0 runs F0 F1 F0/1 F1/1 F2 B0/1 W0/1 F3 ...: chunk 0 saves 1 byte, chunk 1 saves 10 (an LM head, say);
    # held after F2: 1 + 1 + 10 + 10 + 1 = 23, then W0/1 frees 10 and F3 brings 1 (14); nothing later holds more
    assert activation_peaks(orders, [[1, 10], [2, 2]]) == (23.0, 6.0)
    assert activation_peaks(stage_orders("1f1b", 2, 4), (3.0, 1.0)) == (6.0, 1.0)
    with pytest.raises(InputError, match="activation_bytes\\[1\\]\\[0\\]"):
        activation_peaks(orders, [[1, 1], [-1, 1]])
    with pytest.raises(InputError, match="activation_bytes: has shape \\(3,\\)"):
        activation_peaks(orders, [1, 2, 3])


# --- the orders themselves --------------------------------------------------------------------------------------------

def test_1f1b_warms_up_with_s_minus_i_forwards_then_alternates():
    stages, microbatches = 4, 6
    orders = stage_orders("1f1b", stages, microbatches)
    for stage, order in enumerate(orders.orders):
        warmup = stages - stage
        assert kinds(order) == "F" * warmup + "BWF" * (microbatches - warmup) + "BW" * warmup
        assert [i.microbatch for i in order if i.kind == "B"] == list(range(microbatches))


def test_gpipe_runs_every_forward_before_any_backward():
    order = stage_orders("gpipe", 3, 4).orders[1]
    assert kinds(order) == "FFFF" + "BW" * 4


def test_zb_h1_stage_i_leaves_i_weight_gradients_pending():
    stages, microbatches = 4, 8
    orders = stage_orders("zb-h1", stages, microbatches)
    assert orders.split_backward and not stage_orders("1f1b", 2, 2).split_backward
    for stage, order in enumerate(orders.orders):
        text = kinds(order)
        assert text.index("B") == stages - stage  # 1F1B's warm-up
        assert text[:text.index("W")].count("B") == stage + 1
        assert text.endswith("W" * (stage + 1))


def test_interleaved_goes_round_the_chunks_in_groups_of_s():
    orders = stage_orders("interleaved", 2, 4, 2)
    forwards = [(i.chunk, i.microbatch) for i in orders.orders[0] if i.kind == "F"]
    assert forwards == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
    backwards = [(i.chunk, i.microbatch) for i in orders.orders[0] if i.kind == "B"]
    assert backwards == [(1, 0), (1, 1), (0, 0), (0, 1), (1, 2), (1, 3), (0, 2), (0, 3)]
    assert orders.virtual_stage(1, 1) == 3 and orders.placement(2) == (0, 1)


def torch_orders(schedule_class, stages: int, chunks: int, microbatches: int) -> list[list[tuple[str, int, int]]]:
    """torch's per-rank orders as (kind, microbatch, virtual stage), its I (input gradient) read as B; its
    schedules only read each stage's rank, group size and index to build them."""
    def stage(rank, chunk):
        index = chunk * stages + rank
        return SimpleNamespace(group_size=stages, group_rank=rank, num_stages=stages * chunks, stage_index=index,
                               is_first=index == 0, is_last=index == stages * chunks - 1, submod=None)

    schedule = schedule_class([stage(0, c) for c in range(chunks)], microbatches)
    names = {"F": "F", "I": "B", "B": "B", "W": "W"}
    return [[(names[a.computation_type.value], a.microbatch_index, a.stage_index) for a in schedule.pipeline_order[rank]
             if a is not None and a.computation_type.value in names] for rank in range(stages)]


def ours(orders: StageOrders, fused_w: bool) -> list[list[tuple[str, int, int]]]:
    return [[(i.kind, i.microbatch, orders.virtual_stage(stage, i.chunk)) for i in order
             if not (fused_w and i.kind == "W")] for stage, order in enumerate(orders.orders)]


@pytest.mark.parametrize("stages, chunks, microbatches", [(2, 2, 4), (4, 2, 8), (4, 3, 4), (3, 2, 12)])
def test_interleaved_orders_are_torchs(stages, chunks, microbatches):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    expected = torch_orders(schedules.ScheduleInterleaved1F1B, stages, chunks, microbatches)
    assert ours(stage_orders("interleaved", stages, microbatches, chunks), fused_w=True) == expected


@pytest.mark.parametrize("stages, microbatches", [(2, 4), (3, 6), (4, 8), (4, 12)])
def test_zb_h1_orders_are_torchs_zero_bubble_on_one_chunk(stages, microbatches):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    expected = torch_orders(schedules.ScheduleInterleavedZeroBubble, stages, 1, microbatches)
    assert ours(stage_orders("zb-h1", stages, microbatches), fused_w=False) == expected


def test_parse_schedule():
    assert parse_schedule("1F1B") == ("1f1b", 1)
    assert parse_schedule("interleaved:3") == ("interleaved", 3)
    for bad in ("pipedream", "interleaved", "interleaved:x", "gpipe:2"):
        with pytest.raises(InputError, match="schedule"):
            parse_schedule(bad)


# --- bad inputs -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, where, message", [
    (("1f1b", 0, 4), "stages", "at least 1, got 0"),
    (("1f1b", 2, 0), "microbatches", "at least 1, got 0"),
    (("1f1b", 2, True), "microbatches", "whole number"),
    (("interleaved", 4, 6, 2), "microbatches", "multiple of the stages \\(4\\), got 6"),
    (("interleaved", 4, 8, 1), "chunks", "at least 2 virtual stages"),
    (("zb-h1", 2, 4, 2), "chunks", "only interleaved"),
    (("dualpipe", 2, 4), "schedule", "unknown schedule"),
])
def test_bad_shapes_are_named(args, where, message):
    with pytest.raises(InputError, match=message) as error:
        stage_orders(*args)
    assert [p.where for p in error.value.problems] == [where]


def test_bad_seconds_are_named_each():
    orders = stage_orders("1f1b", 2, 2)
    with pytest.raises(InputError) as error:
        simulate_pipeline(orders, (1.0, -1.0), 1.0, float("nan"), transfer_s=[[1.0], [-2.0]], tail_s=(1, 2, 3))
    assert [p.where for p in error.value.problems] == ["forward_s[1][0]", "weight_s[0][0]", "weight_s[1][0]",
                                                      "transfer_s[backward][0]", "tail_s"]
    with pytest.raises(InputError) as error:
        simulate_pipeline(orders, 1, 1, 1, tail_s={"optimizer": (1.0, -1.0)})
    assert [p.where for p in error.value.problems] == ["tail_s[optimizer][1]"]
    with pytest.raises(InputError, match="expected a number, 2 per-stage numbers"):
        simulate_pipeline(orders, (1.0, 2.0, 3.0), 1.0, 1.0)


def test_a_hand_made_order_is_checked():
    with pytest.raises(InputError, match="runs before its F") as error:
        StageOrders("custom", 1, 1, 1, False, ((WorkItem("B", 0), WorkItem("F", 0), WorkItem("W", 0)),))
    assert error.value.problems[0].where == "orders[0]"
    with pytest.raises(InputError, match="misses W0"):
        StageOrders("custom", 1, 1, 1, False, ((WorkItem("F", 0), WorkItem("B", 0)),))
    with pytest.raises(InputError, match="microbatches: must be a whole number of at least 1, got 0"):
        StageOrders("custom", 1, 0, 1, False, ((),))
    # each stage's order is valid, but stage 0 waits at B0 for stage 1, which waits at F1 for stage 0
    first, second = (WorkItem(k, m) for k, m in (("F", 0), ("B", 0), ("W", 0))), (WorkItem(k, 1) for k in "FBW")
    stuck = StageOrders("custom", 2, 2, 1, False, (tuple(first) + tuple(second),
                                                   tuple(WorkItem(k, m) for m in (1, 0) for k in "FBW")))
    with pytest.raises(InputError, match="stage 0 waits forever at B0") as error:
        simulate_pipeline(stuck, 1, 1, 1)
    assert [p.where for p in error.value.problems] == ["orders", "orders"]


# --- the trace --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule, stages, microbatches, chunks", [
    ("1f1b", 2, 3, 1), ("gpipe", 4, 4, 1), ("zb-h1", 3, 6, 1), ("interleaved", 2, 4, 2), ("interleaved", 4, 8, 3)])
def test_trace_holds_the_predicted_step(schedule, stages, microbatches, chunks, tmp_path):
    f, b, w = [0.001 * (1 + s) for s in range(stages)], 0.002, 0.0005
    timeline = simulate_pipeline(stage_orders(schedule, stages, microbatches, chunks), f, b, w, transfer_s=0.0003,
                                 tail_s=0.004)
    path = write_trace(timeline, tmp_path / "step.json")
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert max(e["ts"] + e["dur"] for e in slices) == pytest.approx(timeline.step_s * 1e6)
    for stage in range(stages):
        work = sum(e["dur"] for e in slices if e["tid"] == stage and e["cat"] != "tail")
        assert work == pytest.approx(microbatches * chunks * (f[stage] + b + w) * 1e6)
    flows = {}
    for event in events:
        if event["ph"] in ("s", "f"):
            flows.setdefault(event["id"], []).append(event["ph"])
    assert all(sorted(phases) == ["f", "s"] for phases in flows.values())
    # 2 M (S - 1) V on one chunk; with V chunks the last stage also sends chunk c on to stage 0's chunk c + 1 and
    # back, 2 M (S V - 1) in all
    assert len(flows) == 2 * microbatches * (stages * chunks - 1) == len(timeline.transfers)
    if chunks == 1:
        assert len(flows) == 2 * microbatches * (stages - 1) * chunks
    transfers = [e for e in slices if e["cat"] == "transfer"]
    assert len(transfers) == len(flows)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {f"stage {s}" for s in range(stages)} | {"link 0->1", "link 1->0"} <= names


def test_trace_is_trace_event_format():
    timeline = simulate_pipeline(stage_orders("1f1b", 2, 2), 1.0, 1.0, 1.0, transfer_s=0.5, tail_s=0.25)
    trace = json.loads(json.dumps(trace_events(timeline)))
    assert trace["displayTimeUnit"] == "ms" and trace["otherData"]["step_s"] == timeline.step_s
    for event in trace["traceEvents"]:
        assert isinstance(event["name"], str) and isinstance(event["pid"], int) and isinstance(event["tid"], int)
        assert event["ph"] in ("X", "s", "f", "M")
        if event["ph"] == "X":
            assert event["ts"] >= 0 and event["dur"] >= 0 and isinstance(event["cat"], str)
        if event["ph"] in ("s", "f"):
            assert isinstance(event["id"], int) and isinstance(event["ts"], float)
        if event["ph"] == "f":
            assert event["bp"] == "e"  # bound to the slice that encloses it: the receiving item
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    bound_to = {}
    for flow in (e for e in trace["traceEvents"] if e["ph"] in ("s", "f")):
        # bound to one item's slice both ways: it encloses ts, and it has the same pid, tid, ts and cat
        bound = [s for s in slices if (s["pid"], s["tid"], s["ts"], s["cat"]) == (flow["pid"], flow["tid"], flow["ts"],
                                                                                   flow["cat"])]
        assert len(bound) == 1 and bound[0]["dur"] > 0, flow
        bound_to[flow["id"], flow["ph"]] = bound[0]["args"]["kind"]
    # a flow's two ends share cat and name (Chrome DevTools groups them by cat, name and id)
    ends = {}
    for flow in (e for e in trace["traceEvents"] if e["ph"] in ("s", "f")):
        ends.setdefault(flow["id"], set()).add((flow["cat"], flow["name"]))
    assert all(len(found) == 1 for found in ends.values())
    # an activation leaves F and reaches F; a gradient leaves the fused backward's W and reaches B
    kinds_by_name = {(name.split()[0], phase): kind for (flow_id, phase), kind in bound_to.items()
                     for (_, name) in ends[flow_id]}
    assert kinds_by_name == {("activation", "s"): "forward", ("activation", "f"): "forward",
                             ("gradient", "s"): "backward_weight", ("gradient", "f"): "backward_input"}
    tails = [e for e in slices if e["cat"] == "tail"]
    assert [(e["tid"], e["dur"]) for e in tails] == [(0, 0.25e6), (1, 0.25e6)]
    # F0 on stage 0 is 0-1 s: one million microseconds
    assert slices[0]["name"] == "F0" and (slices[0]["ts"], slices[0]["dur"]) == (0.0, 1e6)


def test_the_package_readme_example_runs(tmp_path, monkeypatch):
    readme = (Path(__file__).parent.parent / "autoshard" / "pipeline" / "README.md").read_text()
    example = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(example, "autoshard/pipeline/README.md", "exec"), scope)
    assert json.loads((tmp_path / "step.json").read_text())["otherData"]["step_s"] == scope["timeline"].step_s


# --- properties on random seconds -------------------------------------------------------------------------------------

SHAPES = [("gpipe", 3, 4, 1), ("1f1b", 3, 5, 1), ("1f1b", 4, 2, 1), ("zb-h1", 3, 5, 1), ("zb-h1", 4, 2, 1),
          ("interleaved", 2, 4, 2), ("interleaved", 3, 3, 2), ("interleaved", 1, 2, 3)]


@st.composite
def pipelines(draw):
    schedule, stages, microbatches, chunks = draw(st.sampled_from(SHAPES))
    times = st.floats(0.0, 4.0, allow_nan=False).map(lambda t: round(t, 2))

    def table(rows: int, cols: int) -> list[list[float]]:
        return draw(st.lists(st.lists(times, min_size=cols, max_size=cols), min_size=rows, max_size=rows))

    boundaries = stages * chunks - 1
    return (stage_orders(schedule, stages, microbatches, chunks),
            {"forward_s": table(stages, chunks), "backward_s": table(stages, chunks), "weight_s": table(stages, chunks),
             "transfer_s": table(2, boundaries) if boundaries else None, "tail_s": table(1, stages)[0]})


def events_of(timeline):
    return {(e.kind, e.microbatch, timeline.orders.virtual_stage(e.stage, e.chunk)): e for items in timeline.items
            for e in items}


@settings(max_examples=80, deadline=None, derandomize=True)
@given(pipelines())
def test_every_item_starts_after_its_inputs_and_nothing_overlaps(pipeline):
    orders, seconds = pipeline
    timeline = simulate_pipeline(orders, **seconds)
    done = events_of(timeline)
    arrivals = {(t.direction, t.microbatch, orders.virtual_stage(*t.target)): t.end_s for t in timeline.transfers}
    last = orders.virtual_stages - 1
    for (kind, microbatch, virtual), event in done.items():
        if kind == "F" and virtual > 0:
            before = done["F", microbatch, virtual - 1].end_s
            assert event.start_s >= arrivals.get(("forward", microbatch, virtual), before) >= before
        if kind == "B":
            assert event.start_s >= done["F", microbatch, virtual].end_s
            if virtual < last:
                sent = done["B" if orders.split_backward else "W", microbatch, virtual + 1].end_s
                assert event.start_s >= arrivals.get(("backward", microbatch, virtual), sent) >= sent
        if kind == "W":
            assert event.start_s >= done["B", microbatch, virtual].end_s
    for stage, items in enumerate(timeline.items):
        assert [(e.kind, e.microbatch, e.chunk) for e in items] == [(i.kind, i.microbatch, i.chunk)
                                                                    for i in orders.orders[stage]]
        assert all(a.end_s <= b.start_s for a, b in zip(items, items[1:]))
    for link in {t.link for t in timeline.transfers}:
        moves = [t for t in timeline.transfers if t.link == link]
        assert all(a.end_s <= b.start_s and a.ready_s <= b.ready_s for a, b in zip(moves, moves[1:]))
    assert timeline.step_s == pytest.approx(max(part.end_s for part in timeline.tails))
    assert timeline.step_s >= max(busy + tail for busy, tail in zip(timeline.busy_s, seconds["tail_s"])) - 1e-9


@settings(max_examples=80, deadline=None, derandomize=True)
@given(pipelines(), st.data())
def test_the_step_never_shortens_when_any_seconds_grow(pipeline, data):
    # what lets a simulation with per-stage lower bounds bound every plan
    orders, seconds = pipeline
    before = simulate_pipeline(orders, **seconds)
    name = data.draw(st.sampled_from([k for k, v in seconds.items() if v is not None]))
    grown = json.loads(json.dumps(seconds[name]))
    row = data.draw(st.integers(0, len(grown) - 1))
    if isinstance(grown[row], list):
        grown[row][data.draw(st.integers(0, len(grown[row]) - 1))] += data.draw(st.floats(0.01, 3.0))
    else:
        grown[row] += data.draw(st.floats(0.01, 3.0))
    after = simulate_pipeline(orders, **{**seconds, name: grown})
    assert after.step_s >= before.step_s - 1e-9
    assert all(a.end_s >= b.end_s - 1e-9 for a_items, b_items in zip(after.items, before.items)
               for a, b in zip(a_items, b_items))

"""Checks that `pipeline_step` gives `simulate_pipeline`'s step, busy, idle, bubble and peaks exactly.

On random instances of the four schedules (stages 1-8, chunks 2-4 for interleaved, seconds per
(stage, chunk) with ties and zeros, transfers per boundary and direction from free to slow enough
that the links are the bottleneck, tails per stage or in named parts), on random hand-made orders
(some of which wait forever), and for every argument error: the fast path's numbers are the event
simulation's to the last bit and its errors are the same. `step_orders` builds `stage_orders`'
items in the same orders.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from autoshard.errors import InputError
from autoshard.pipeline import StageOrders, WorkItem, simulate_pipeline, stage_orders
from autoshard.pipeline import step as step_module
from autoshard.pipeline.step import StepOrders, StepSummary, pipeline_step, step_orders

FIELDS = ("step_s", "busy_s", "idle_s", "bubble_fraction", "inflight_peak")


def same(summary: StepSummary, timeline) -> None:
    for field in FIELDS:
        assert getattr(summary, field) == getattr(timeline, field), field  # bit for bit, not only to 1e-12
    assert all(isinstance(x, float) for x in summary.busy_s + summary.idle_s)
    assert isinstance(summary.step_s, float) and isinstance(summary.bubble_fraction, float)


def seconds_like(rng: random.Random, shape, kind: str):
    """Seconds of one style: small whole numbers (many ties), some zeros, or spread floats."""
    if kind == "ties":
        return np.array(rng.choices([0.0, 1.0, 1.0, 2.0, 3.0], k=int(np.prod(shape)))).reshape(shape)
    if kind == "zeros":
        return np.array(rng.choices([0.0, 0.0, 0.25, 0.5], k=int(np.prod(shape)))).reshape(shape)
    return np.array([rng.uniform(0.0, 3.0) for _ in range(int(np.prod(shape)))]).reshape(shape)


def random_instance(rng: random.Random):
    schedule = rng.choice(["gpipe", "1f1b", "interleaved", "zb-h1"])
    stages = rng.randint(1, 8)
    chunks = rng.randint(2, 4) if schedule == "interleaved" else 1
    microbatches = stages * rng.randint(1, 4) if schedule == "interleaved" else rng.randint(1, 12)
    orders = stage_orders(schedule, stages, microbatches, chunks)
    style = rng.choice(["ties", "zeros", "spread"])
    shape = rng.choice([(), (stages,), (stages, chunks)])
    forward, backward, weight = (seconds_like(rng, shape, style) for _ in range(3))
    boundaries = stages * chunks - 1
    link = rng.choice(["none", "zero", "one", "table", "slow", "ties"])
    transfer = {"none": None, "zero": 0.0, "one": rng.uniform(0.0, 1.0),
                "table": seconds_like(rng, (2, boundaries), style),
                "slow": np.array([rng.uniform(0.0, 20.0) for _ in range(2 * boundaries)]).reshape(2, boundaries),
                "ties": seconds_like(rng, (boundaries,), "ties")}[link]
    tail = rng.choice([0.0, rng.uniform(0.0, 5.0), seconds_like(rng, (stages,), style),
                       {"gradient all_reduce": seconds_like(rng, (stages,), style), "optimizer": 0.5}, {}])
    return orders, (forward, backward, weight), {"transfer_s": transfer, "tail_s": tail}


@pytest.mark.parametrize("seed", range(12))
def test_random_schedules_give_the_simulations_numbers(seed):
    rng = random.Random(seed)
    for _ in range(40):
        orders, seconds, keywords = random_instance(rng)
        timeline = simulate_pipeline(orders, *seconds, **keywords)
        same(pipeline_step(orders, *seconds, **keywords), timeline)
        compact = step_orders(orders.schedule, orders.stages, orders.microbatches, orders.chunks)
        same(pipeline_step(compact, *seconds, **keywords), timeline)


@pytest.mark.parametrize("schedule, stages, microbatches, chunks", [
    ("1f1b", 8, 64, 1), ("interleaved", 8, 32, 4), ("zb-h1", 6, 30, 1), ("gpipe", 5, 20, 1), ("interleaved", 2, 6, 3),
    ("interleaved", 1, 3, 2), ("1f1b", 1, 5, 1), ("zb-h1", 2, 1, 1)])
def test_links_as_the_bottleneck_and_one_stage(schedule, stages, microbatches, chunks):
    """Transfers much longer than the work queue on every link; `S = 1` hands over in place."""
    orders = stage_orders(schedule, stages, microbatches, chunks)
    boundaries = stages * chunks - 1
    rng = np.random.default_rng(stages * 100 + microbatches)
    forward = rng.uniform(0.5, 1.5, (stages, chunks))
    for transfer in (rng.uniform(5.0, 50.0, (2, boundaries)), 7.0, (3.0 * np.arange(boundaries) % 4.0)):
        timeline = simulate_pipeline(orders, forward, 2 * forward, 0.5, transfer_s=transfer, tail_s=(1.0,) * stages)
        same(pipeline_step(orders, forward, 2 * forward, 0.5, transfer_s=transfer, tail_s=(1.0,) * stages), timeline)


def test_transfer_seconds_from_a_callable():
    orders = stage_orders("interleaved", 4, 8, 2)

    def transfer(boundary, direction):
        return 0.1 * boundary + (0.5 if direction == "backward" else 0.0)

    same(pipeline_step(orders, 1.0, 2.0, 1.0, transfer_s=transfer),
         simulate_pipeline(orders, 1.0, 2.0, 1.0, transfer_s=transfer))


def random_orders(rng: random.Random, stages: int, microbatches: int, chunks: int) -> StageOrders:
    """Each stage's items in a random order that keeps `F` before `B` before `W`."""
    orders = []
    for _ in range(stages):
        tokens = [(m, c) for m in range(microbatches) for c in range(chunks)] * 3
        rng.shuffle(tokens)
        seen: dict[tuple[int, int], int] = {}
        order = []
        for m, c in tokens:
            order.append(WorkItem("FBW"[seen.get((m, c), 0)], m, c))
            seen[(m, c)] = seen.get((m, c), 0) + 1
        orders.append(tuple(order))
    return StageOrders("custom", stages, microbatches, chunks, rng.random() < 0.5, tuple(orders))


def test_hand_made_orders_give_the_same_numbers_or_the_same_error():
    rng = random.Random(7)
    ran = stuck = 0
    for _ in range(400):
        stages, microbatches, chunks = rng.randint(1, 4), rng.randint(1, 3), rng.randint(1, 2)
        orders = random_orders(rng, stages, microbatches, chunks)
        forward = seconds_like(rng, (stages, chunks), rng.choice(["ties", "spread"]))
        transfer = rng.choice([None, 1.0, seconds_like(rng, (2, stages * chunks - 1), "ties")])
        try:
            timeline = simulate_pipeline(orders, forward, 1.0, 0.5, transfer_s=transfer)
        except InputError as error:
            with pytest.raises(InputError) as fast:
                pipeline_step(orders, forward, 1.0, 0.5, transfer_s=transfer)
            assert fast.value.problems == error.problems
            stuck += 1
        else:
            same(pipeline_step(orders, forward, 1.0, 0.5, transfer_s=transfer), timeline)
            ran += 1
    assert ran > 50 and stuck > 50


def test_orders_that_wait_forever_are_reported_the_same():
    first, second = (WorkItem(k, m) for k, m in (("F", 0), ("B", 0), ("W", 0))), (WorkItem(k, 1) for k in "FBW")
    stuck = StageOrders("custom", 2, 2, 1, False, (tuple(first) + tuple(second),
                                                   tuple(WorkItem(k, m) for m in (1, 0) for k in "FBW")))
    with pytest.raises(InputError) as slow:
        simulate_pipeline(stuck, 1, 1, 1)
    with pytest.raises(InputError, match="stage 0 waits forever at B0") as fast:
        pipeline_step(stuck, 1, 1, 1)
    assert fast.value.problems == slow.value.problems
    assert str(fast.value) == str(slow.value)


@pytest.mark.parametrize("arguments, keywords", [
    (((1.0, -1.0), 1.0, (float("nan"), 1.0)), {"transfer_s": (1.0, 2.0, 3.0), "tail_s": "x"}),
    ((1.0, 1.0, 1.0), {"transfer_s": [[1.0], [-2.0]], "tail_s": {"optimizer": (1.0, -1.0)}}),
    (((1.0, 2.0, 3.0), 1.0, 1.0), {}),
    (([[1.0, 2.0]], object(), 1.0), {"tail_s": (1.0, 2.0, 3.0)}),
    ((1.0, 1.0, 1.0), {"transfer_s": lambda boundary, direction: float("inf")}),
    ((1.0, 1.0, 1.0), {"transfer_s": np.ones((3, 1))}),
])
def test_argument_errors_are_reported_the_same(arguments, keywords):
    for orders in (stage_orders("1f1b", 2, 2), step_orders("1f1b", 2, 2)):
        with pytest.raises(InputError) as slow:
            simulate_pipeline(stage_orders("1f1b", 2, 2), *arguments, **keywords)
        with pytest.raises(InputError) as fast:
            pipeline_step(orders, *arguments, **keywords)
        assert fast.value.problems == slow.value.problems


@pytest.mark.parametrize("arguments", [("gpipe", 0, 2, 1), ("nope", 2, 2, 1), ("interleaved", 2, 3, 2),
                                       ("interleaved", 2, 4, 1), ("1f1b", 2, 4, 2), ("zb-h1", 2, True, 1)])
def test_step_orders_refuses_what_stage_orders_refuses(arguments):
    with pytest.raises(InputError) as slow:
        stage_orders(*arguments)
    with pytest.raises(InputError) as fast:
        step_orders(*arguments)
    assert fast.value.problems == slow.value.problems


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved", "zb-h1"])
def test_step_orders_are_stage_orders_item_for_item(schedule):
    for stages in range(1, 9):
        for microbatches in (range(stages, 5 * stages, stages) if schedule == "interleaved" else range(1, 14)):
            for chunks in ((2, 3, 4) if schedule == "interleaved" else (1,)):
                orders = stage_orders(schedule, stages, microbatches, chunks)
                compact = step_orders(schedule, stages, microbatches, chunks)
                assert (compact.stages, compact.microbatches, compact.chunks, compact.split_backward) == (
                    orders.stages, orders.microbatches, orders.chunks, orders.split_backward)
                assert [[compact.item(s, i) for i in range(compact.kinds.shape[1])] for s in range(stages)] == [
                    list(order) for order in orders.orders]
                assert compact.inflight_peak == simulate_pipeline(orders, 1.0, 1.0, 1.0).inflight_peak
                assert step_orders(schedule, stages, microbatches, chunks) is compact


def test_stage_orders_are_read_once_and_kept_by_identity():
    orders = stage_orders("1f1b", 3, 5)
    first = step_module._encoded(orders)
    assert step_module._encoded(orders) is first
    again = stage_orders("1f1b", 3, 5)  # equal, another object: read again, same arrays
    other = step_module._encoded(again)
    assert other is not first and (other.kinds == first.kinds).all()
    assert isinstance(first, StepOrders) and not first.kinds.flags.writeable


def test_compensated_sum_of_later_pythons_reads_each_items_seconds(monkeypatch):
    """From Python 3.12 `sum` compensates: the busy seconds are then summed in Python, item by item."""
    rng = random.Random(3)
    cases = [random_instance(rng) for _ in range(30)]
    expected = [simulate_pipeline(orders, *seconds, **keywords) for orders, seconds, keywords in cases]

    class Later:
        version_info = (3, 12)

    monkeypatch.setattr(step_module, "sys", Later)
    for (orders, seconds, keywords), timeline in zip(cases, expected):
        same(pipeline_step(orders, *seconds, **keywords), timeline)

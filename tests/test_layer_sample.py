"""A stack of layers sampled as three (`planning/layer_sample.py`) and priced from the sample
(`planning/layer_prices.py`): the sample computes what a three-layer model computes, and the
per-layer prices rebuild a whole plan's pipeline price exactly."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from autoshard.errors import InputError
from autoshard.graph.evaluate import evaluate_graph, random_inputs
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.models.training import training_precision
from autoshard.pipeline import stage_orders
from autoshard.pipeline.step import step_orders
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.layer_kinds import layer_kinds
from autoshard.planning.layer_prices import layer_prices, price_layers
from autoshard.planning.layer_sample import layer_sample
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.pipeline_plan import pipeline_mesh, price_pipeline


def _model(layers: int, style: str | None = "megatron") -> dict:
    config = GPTConfig(layers=layers, hidden=32, heads=4, seq=16, batch=4, vocab=64, **({"style": style} if style else {}))
    with training_precision("bf16-mixed"):
        return gpt(config, training=True)


@pytest.mark.parametrize("style", ["megatron", None])
def test_sample_is_the_three_layer_model(style):
    """Eight layers sampled: the same layer kinds, ops and tensors as the model built with three,
    and the same values everywhere (the first, middle and last layers' names mapped)."""
    sample = layer_sample(_model(8, style))
    assert sample.layers == tuple(range(8))
    assert sample.represented_by == (0, 1, 1, 1, 1, 1, 1, 2) and sample.counts == (1, 6, 1)
    mine, three = graph_from_json(sample.document), graph_from_json(_model(3, style))
    assert [k.signature for k in layer_kinds(mine)] == [k.signature for k in layer_kinds(three)]
    assert [k.layers for k in layer_kinds(mine)] == [(0, 1, 7)]
    assert (len(mine.ops), len(mine.tensors)) == (len(three.ops), len(three.tensors))

    def named(name: str) -> str:
        # the sample keeps layer 7's names where the 3-layer model has layer 2's, and the gradient
        # layer 7 sends back is named after layer 6's output where the model's is after layer 1's
        return name.replace("layer7.", "layer2.").replace("layer6.", "layer1.")
    assert {named(t) for t in mine.tensors} == set(three.tensors)
    inputs = random_inputs(three, seed=3)
    expected = evaluate_graph(three, inputs)
    found = evaluate_graph(mine, {t: inputs[named(t)] for t in mine.tensors if named(t) in inputs})
    for name, value in found.items():
        np.testing.assert_array_equal(value, expected[named(name)], err_msg=name)


def test_short_stack_is_its_own_sample():
    document = _model(3)
    sample = layer_sample(document)
    assert sample.document is document and sample.represented_by == (0, 1, 2)


def test_middle_layers_of_two_kinds_are_refused():
    document = copy.deepcopy(_model(6))
    op = next(op for op in document["ops"] if op.get("layer") == 3 and op["kind"] == "layer_norm")
    op["eps"] = 0.5  # layer 3 now differs from layer 1
    with pytest.raises(InputError) as caught:
        layer_sample(document)
    problem = caught.value.problems[0]
    assert problem.where == "layers" and "layer 3 differs from layer 1" in problem.message


def test_a_middle_layer_read_outside_the_stack_is_refused():
    """An op outside the layers reading one middle layer makes that layer unlike the others."""
    document = copy.deepcopy(_model(6))
    index = next(i for i, op in enumerate(document["ops"]) if op.get("layer") == 4)  # after layer 3's forward
    middle = document["ops"][index - 1]["outputs"][0]
    document["ops"].insert(index, {"name": "peek", "kind": "neg", "inputs": [middle], "outputs": ["peeked"]})
    document["tensors"]["peeked"] = dict(document["tensors"][middle])
    document["tensors"]["peeked"].pop("role", None)
    document["outputs"].append("peeked")
    with pytest.raises(InputError) as caught:
        layer_sample(document)
    assert caught.value.problems[0].where == "layers" and "not all of one kind" in caught.value.problems[0].message


@pytest.mark.parametrize("schedule,stages,chunks", [("1f1b", 2, 1), ("interleaved", 2, 3), ("gpipe", 3, 1),
                                                    ("zb-h1", 2, 1), ("1f1b", 1, 1)])
def test_layer_prices_rebuild_the_pipeline_price(schedule, stages, chunks):
    """Each layer priced on its own (`represented_by` the identity): the step, its overlapped
    form, the cut and every stage's memory are `price_pipeline`'s on the same plan."""
    mesh = Mesh.of(tp=2)
    graph = graph_from_json(_model(6), mesh)
    hw = bind_hardware("dgx-a100", pipeline_mesh(mesh, 2))
    result = make_plan(graph, mesh, hw, SolveSettings(time_limit_s=5, workers=1, microbatches=4, deterministic=True))
    prices = layer_prices(result)
    orders = step_orders(schedule, stages, 4, chunks)
    whole = price_pipeline(result, mesh, hw, stage_orders(schedule, stages, 4, chunks), float("inf"))
    mine = price_layers(prices, range(6), orders, hw)
    assert mine.step_s == pytest.approx(whole.timeline.step_s, rel=1e-12)
    assert mine.overlapped.step_s == pytest.approx(whole.overlapped.step_s, rel=1e-12)
    assert [m.peak_bytes for m in mine.memory] == [m.peak_bytes for m in whole.memory]
    assert [m.stored for m in mine.memory] == [m.stored for m in whole.memory]
    cut = [next(i for i, part in enumerate(whole.parts) if part.layers[0] <= layer <= part.layers[1])
           for layer in range(6)]
    assert list(mine.part_at) == cut

"""Layers: tagged by the generators, inherited by backward and optimizer ops through data flow,
numbered from module paths, shown by `autoshard show`, and checked for what a pipeline cut needs."""

from __future__ import annotations

import copy
import json

import pytest

from autoshard.cli.main import main
from autoshard.errors import InputError
from autoshard.graph.layers import layer_ops, layers_of_module_paths
from autoshard.graph.schema import graph_from_json
from autoshard.models.gpt import GPTConfig, gpt
from autoshard.models.mlp import MLPConfig, mlp
from autoshard.models.moe import MoEConfig, moe
from autoshard.models.unet import UNetConfig, unet

CONFIG = GPTConfig(layers=3, hidden=32, heads=2, seq=8, batch=2, vocab=64, dtype="f32")


@pytest.fixture(scope="module")
def step_doc():
    return gpt(CONFIG, training=True)


def test_every_op_of_a_gpt_layer_carries_its_layer_in_every_phase(step_doc):
    graph = graph_from_json(step_doc)
    phases = graph.phases
    for op in graph.ops:
        if op.name.startswith("layer") and phases[op.name] == "forward":
            assert op.layer == int(op.name.split(".")[0][len("layer"):]), op.name
        if op.name in ("embed", "logits", "final_norm", "loss"):
            assert op.layer is None
    by_phase = {(phases[op.name], op.layer) for op in graph.ops}
    assert {(p, k) for p in ("forward", "backward", "optimizer") for k in range(3)} <= by_phase
    # a parameter's update runs in its layer; its weight gradient's op too
    for param, grad in graph.gradients.items():
        producer = graph.producers[grad]
        if param.startswith("layer"):
            expected = int(param.split(".")[0][len("layer"):])
            assert producer.layer == expected and graph.producers[graph.updated_by[param]].layer == expected, param


def test_backward_ranges_run_in_reverse_layer_order_and_the_optimizer_last(step_doc):
    graph = graph_from_json(step_doc)
    phases = graph.phases
    sequence = [(phases[op.name], op.layer) for op in graph.order]
    forward = [k for p, k in sequence if p == "forward" and k is not None]
    backward = [k for p, k in sequence if p == "backward" and k is not None]
    assert forward == sorted(forward) and backward == sorted(backward, reverse=True)
    first_optimizer = next(i for i, (p, _) in enumerate(sequence) if p == "optimizer")
    assert all(p == "optimizer" for p, _ in sequence[first_optimizer:])
    assert list(layer_ops(graph)) == [0, 1, 2]


@pytest.mark.parametrize("build", [
    lambda: mlp(MLPConfig(layers=3, batch=4, hidden=8, ffn=16, dtype="f32"), training=True),
    lambda: moe(MoEConfig(layers=2, batch=2, seq=4, hidden=8, ffn=16, experts=4, top_k=2, dtype="f32"), training=True),
    lambda: unet(UNetConfig(levels=2, batch=1, height=16, width=16, base=2, dtype="f32"), training=True),
])
def test_every_generator_tags_layers_that_validate(build):
    graph = graph_from_json(build())
    assert len(layer_ops(graph)) >= 2
    assert all(op.layer is not None for op in graph.ops if graph.tensors[op.outputs[0]].updates and
               op.inputs[0].startswith(("layer", "down", "up", "bottleneck")))


def _move(doc: dict, name: str, before: str) -> dict:
    """The document with op `name` listed right before op `before`."""
    doc = copy.deepcopy(doc)
    ops = doc["ops"]
    op = ops.pop(next(i for i, o in enumerate(ops) if o["name"] == name))
    ops.insert(next(i for i, o in enumerate(ops) if o["name"] == before), op)
    return doc


def test_a_layer_interleaved_with_another_is_refused_naming_the_op(step_doc):
    doc = copy.deepcopy(step_doc)
    doc["ops"][next(i for i, o in enumerate(doc["ops"]) if o["name"] == "layer1.attn.q")]["layer"] = 0
    with pytest.raises(InputError) as error:
        graph_from_json(doc)
    problems = error.value.problems
    assert all(p.where.endswith("/layer") and "contiguous" in p.message for p in problems)
    assert any("'layer1.attn.q' (layer 0)" in p.message for p in problems)


def test_backward_ops_out_of_reverse_order_are_refused_naming_the_op(step_doc):
    doc = copy.deepcopy(step_doc)
    graph = graph_from_json(doc)
    phases = graph.phases
    name = next(op.name for op in graph.order if phases[op.name] == "backward" and op.layer == 0)
    doc["ops"][next(i for i, o in enumerate(doc["ops"]) if o["name"] == name)]["layer"] = 2
    with pytest.raises(InputError) as error:
        graph_from_json(doc)
    assert any(name in p.message and "reverse order" in p.message for p in error.value.problems)


def test_a_negative_or_fractional_layer_is_refused(step_doc):
    for value in (-1, 1.5, "1"):
        doc = copy.deepcopy(step_doc)
        doc["ops"][0]["layer"] = value
        with pytest.raises(InputError) as error:
            graph_from_json(doc)
        assert error.value.problems[0].where == "/ops/0/layer"


def test_module_paths_number_each_repeated_stack_apart():
    paths = ["model.embed_tokens", "model.layers.0.self_attn.q_proj", "model.layers.0.mlp", "model.layers.1.mlp",
             "encoder.layer.0.attention", "encoder.layer.1.output", "transformer.h.0.attn", "model.layers.1.mlp.experts.3",
             "conv.0", "lm_head", "0.fc", "1.fc"]
    found = layers_of_module_paths(paths)
    assert found == {"model.layers.0.self_attn.q_proj": 0, "model.layers.0.mlp": 0, "model.layers.1.mlp": 1,
                     "encoder.layer.0.attention": 2, "encoder.layer.1.output": 3, "model.layers.1.mlp.experts.3": 1,
                     "0.fc": 4, "1.fc": 5}


def test_show_prints_each_ops_layer_and_phase(tmp_path, capsys, step_doc):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(step_doc))
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("3 layers")
    row = next(line.split() for line in out.splitlines() if line.startswith("layer2.mlp.fc1 "))
    assert row[1:4] == ["matmul", "2", "forward"]
    row = next(line.split() for line in out.splitlines() if line.startswith("layer2.mlp.fc1.w.new "))
    assert row[2:4] == ["2", "optimizer"]

"""Model generators: graphs validate and evaluate, parameter counts follow the closed forms,
training-step gradients match finite differences, Adam updates as written, the CLI writes
graphs that load."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from autoshard.cli.main import main
from autoshard.errors import InputError
from autoshard.graph.evaluate import evaluate_graph, random_inputs
from autoshard.graph.schema import graph_from_json, load_graph
from autoshard.models import GPTConfig, GraphBuilder, MLPConfig, MoEConfig, UNetConfig, gpt, mlp, moe, unet
from autoshard.models.training import ADAM_SCALARS
from autoshard.ops import OpError
from autoshard.ops.differentiate import add_backward
from autoshard.ops.loops import PARALLEL, REDUCTION

TINY_GPT = GPTConfig(layers=2, hidden=8, heads=2, seq=4, batch=2, vocab=11, dtype="f64")
TINY_LLAMA = GPTConfig(layers=2, hidden=8, heads=2, seq=4, batch=2, vocab=11, ffn=12, dtype="f64", style="llama")
TINY_MOE = MoEConfig(layers=2, batch=2, seq=3, hidden=4, ffn=6, experts=3, top_k=2, dtype="f64")
TINY_MLP = MLPConfig(layers=2, batch=3, hidden=4, ffn=5, dtype="f64")
TINY_UNET = UNetConfig(levels=2, batch=2, height=4, width=8, channels=2, base=2, out_channels=3, dtype="f64")
TINY = [(gpt, TINY_GPT), (gpt, TINY_LLAMA), (moe, TINY_MOE), (mlp, TINY_MLP), (unet, TINY_UNET)]
TINY_IDS = ["gpt", "llama", "moe", "mlp", "unet"]


def gpt_parameters(c: GPTConfig) -> int:
    h, f, v, s, layers = c.hidden, c.ffn_size, c.vocab, c.seq, c.layers
    if c.style == "gpt":  # qkvo weights and biases, mlp weights and biases, two layer norms (gamma, beta)
        per_layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
        return layers * per_layer + v * h + s * h + 2 * h + h * v
    per_layer = 4 * h * h + 3 * h * f + 2 * h  # no biases, SwiGLU, two rms norms
    return layers * per_layer + v * h + h + h * v


def expected_forward_output(generate, c) -> tuple[str, tuple[int, ...]]:
    if generate is gpt:
        return "logits", (c.batch, c.seq, c.vocab)
    if generate is moe:
        return "out", (c.batch, c.seq, c.hidden)
    if generate is unet:
        return "head", (c.batch, c.height, c.width, c.out_channels)
    return f"layer{c.layers - 1}.fc2", (c.batch, c.hidden)


@pytest.mark.parametrize("generate, config", TINY, ids=TINY_IDS)
def test_forward_graph_validates_and_evaluates(generate, config):
    graph = graph_from_json(generate(config))
    name, shape = expected_forward_output(generate, config)
    assert graph.outputs == (name,)
    values = evaluate_graph(graph, random_inputs(graph, seed=1))
    assert values[name].shape == shape
    assert np.isfinite(values[name]).all()


@pytest.mark.parametrize("generate, config", TINY, ids=TINY_IDS)
def test_training_graph_updates_every_parameter_and_its_moments(generate, config):
    forward = graph_from_json(generate(config))
    graph = graph_from_json(generate(config, training=True))
    params = [t.name for t in forward.tensors_with_role("parameter")]
    assert graph.outputs == ("loss", *(name for p in params for name in (f"{p}.new", f"adam.{p}.new_m", f"adam.{p}.new_v")))
    assert {t.name for t in graph.tensors_with_role("input")} >= set(ADAM_SCALARS) | {"labels"}
    values = evaluate_graph(graph, random_inputs(graph, seed=2))
    for name in graph.outputs:
        assert np.isfinite(values[name]).all(), name
        assert values[name].shape == graph.tensors[name].shape
    # every forward contraction has one gradient contraction per input a parameter flows into
    contractions = ("matmul", "batch_matmul", "dot_general")
    trained = set(params)
    for op in forward.ops:
        if any(t in trained for t in op.inputs):
            trained.add(op.outputs[0])
    expected = sum(1 + sum(t in trained for t in op.inputs) for op in forward.ops if op.kind in contractions)
    assert sum(op.kind in contractions for op in graph.ops) == expected
    if generate is gpt:  # the embedding feeds every contraction: each gets both gradients
        assert expected == 3 * sum(op.kind in contractions for op in forward.ops)


@pytest.mark.parametrize("config", [TINY_GPT, TINY_LLAMA, GPTConfig(layers=3, hidden=32, heads=4, seq=16, batch=1, vocab=100)],
                         ids=["gpt", "llama", "gpt-bf16"])
def test_gpt_parameter_count_matches_the_closed_form(config):
    graph = graph_from_json(gpt(config))
    assert sum(math.prod(t.shape) for t in graph.tensors_with_role("parameter")) == gpt_parameters(config)


def test_gpt3_175b_has_175_billion_parameters_and_validates():
    config = GPTConfig(layers=96, hidden=12288, heads=96, seq=2048, batch=8, vocab=50257)
    graph = graph_from_json(gpt(config))
    count = sum(math.prod(t.shape) for t in graph.tensors_with_role("parameter"))
    h = 12288
    assert count == 96 * (12 * h * h + 13 * h) + 2 * 50257 * h + 2048 * h + 2 * h == gpt_parameters(config)
    assert count == pytest.approx(175e9, rel=0.01)
    # forward FLOPs: 2 per parameter per token in the matmuls, plus attention
    tokens = 8 * 2048
    assert graph.total_flops() == pytest.approx(2 * count * tokens, rel=0.05)


def test_mlp_and_moe_parameter_counts():
    c = MLPConfig(layers=3, batch=2, hidden=16, ffn=24)
    graph = graph_from_json(mlp(c))
    assert sum(math.prod(t.shape) for t in graph.tensors_with_role("parameter")) == 3 * 2 * 16 * 24
    m = MoEConfig(layers=2, batch=2, seq=8, hidden=16, ffn=32, experts=4, top_k=2, capacity_factor=1.5)
    graph = graph_from_json(moe(m))
    assert sum(math.prod(t.shape) for t in graph.tensors_with_role("parameter")) == 2 * (16 * 4 + 2 * 4 * 16 * 32)
    # one group per sequence: 2 groups of 8 tokens, each with its own slots
    assert m.capacity == math.ceil(2 * 8 * 1.5 / 4) and graph.tensors["layer0.dispatch"].shape == (2, 8, 4, m.capacity)


def test_unet_levels_halve_the_resolution_and_double_the_channels():
    c = TINY_UNET
    graph = graph_from_json(unet(c))
    shape = {t: graph.tensors[t].shape for t in graph.tensors}
    assert shape["down0.relu2"] == (2, 4, 8, 2) and shape["down1.relu2"] == (2, 2, 4, 4)
    assert shape["bottleneck.relu2"] == (2, 1, 2, 8)
    assert shape["up1.skip"] == (2, 2, 4, 8) and shape["up0.skip"] == (2, 4, 8, 4)
    convs = [op for op in graph.ops if op.kind == "conv2d"]
    assert len(convs) == 2 * 2 + 2 + 2 * 3 + 1
    # every 3x3 convolution's height and width loops split, reading halos of one row and column
    nest = graph.op_by_name["down0.conv1"].nest
    assert [w.halo for w in nest.windows(1) + nest.windows(2)] == [(1, 1), (1, 1)]


def test_moe_experts_are_a_loop_expert_parallelism_can_split():
    graph = graph_from_json(moe(MoEConfig(batch=2, seq=8, hidden=16, experts=4)))
    ops = graph.op_by_name
    for name, dim in (("layer0.dispatch_tokens", 1), ("layer0.experts.fc1", 0), ("layer0.experts.act", 0),
                      ("layer0.experts.fc2", 0)):
        nest = ops[name].nest
        experts = nest.output_maps[0].results[dim].single_loop()  # [G, E, ...] as dispatched, [E, G, ...] after
        assert nest.extents[experts] == 4 and nest.iterator_types[experts] == PARALLEL
        assert experts in nest.splittable_loops()
    combine = ops["layer0.combine"].nest  # summing the experts' outputs: partial over the experts axis
    experts_loop = combine.input_maps[1].results[0].single_loop()
    assert combine.iterator_types[experts_loop] == REDUCTION and experts_loop in combine.splittable_loops()


# --- gradients against finite differences ------------------------------------------------
def loss_only(doc: dict) -> dict:
    """The forward graph up to the loss: the training document's ops before `loss`."""
    ops = doc["ops"][: next(i for i, op in enumerate(doc["ops"]) if op["name"] == "loss") + 1]
    used = {t for op in ops for t in op["inputs"] + op["outputs"]}
    return doc | {"ops": ops, "outputs": ["loss"], "tensors": {n: t for n, t in doc["tensors"].items() if n in used}}


@pytest.mark.parametrize("generate, config", TINY, ids=TINY_IDS)
def test_training_gradients_match_finite_differences(generate, config):
    doc = generate(config, training=True)
    graph, loss_graph = graph_from_json(doc), graph_from_json(loss_only(doc))
    values = random_inputs(graph, seed=5)
    computed = evaluate_graph(graph, values)
    rng = np.random.default_rng(0)
    step = 1e-6
    for param in (t.name for t in loss_graph.tensors_with_role("parameter")):
        grad = computed[graph.op_by_name[f"adam.{param}.grad"].inputs[0]]  # cast to the optimizer dtype
        direction = rng.uniform(-1, 1, grad.shape)

        def loss(sign: float) -> float:
            moved = values | {param: values[param] + sign * step * direction}
            return float(evaluate_graph(loss_graph, moved)["loss"])

        numeric = (loss(1) - loss(-1)) / (2 * step)
        assert float(np.sum(grad * direction)) == pytest.approx(numeric, rel=1e-5, abs=1e-8), param


def _small_graphs():
    """Forward bodies covering every backward rule the generators do not reach."""
    def dot_general_transposed(b, p):
        # lhs [K1, M, K2] . rhs [K2, N, K1] contracting (K1, K2) in swapped orders, with a batch dim
        a = b.op("dot_general", [p((2, 3, 4)), p((4, 5, 2))], "swapped", lhs_contracting_dims=[0, 2], rhs_contracting_dims=[2, 0])
        return b.op("dot_general", [p((2, 6, 3)), p((3, 2, 6))], "batched", lhs_batch_dims=[1], rhs_batch_dims=[2],
                    lhs_contracting_dims=[0], rhs_contracting_dims=[1]), a

    def elementwise(b, p):
        x, y = p((3, 1)), p((4,))
        z = b.op("div", [b.op("sub", [x, y], "sub"), b.op("exp", [b.op("neg", [y], "neg")], "exp")], "div")
        z = b.op("div", [z, b.op("add", [b.op("square", [y], "sq"), p((1, 4))], "positive")], "div2")
        return b.op("cast", [b.op("reduce_sum", [z], "sum", dims=[0], keepdims=True)], "cast", dtype="f64"),

    def data_movement(b, p):
        x = b.op("broadcast_in_dim", [p((3, 1))], "bcast", shape=[2, 3, 4], broadcast_dimensions=[1, 2])
        x = b.op("transpose", [x], "t", perm=[2, 0, 1])
        x = b.op("reduce_sum", [b.op("reshape", [x], "r", shape=[4, 6])], "s", dims=[1])
        x = b.op("concat", [b.op("mul", [x, p((4,))], "m"), p((3,))], "cat", axis=0)
        x = b.op("pad", [b.op("slice", [x], "sl", starts=[2], limits=[6])], "pad", low=[1], high=[2])
        return b.op("softmax", [x], "sm", axis=0),

    def norms(b, p):
        x = p((5, 3))
        return (b.op("layer_norm", [x, p((5,)), p((5,))], "ln", axis=0),
                b.op("rms_norm", [x, p((3,))], "rms"), b.op("reduce_mean", [x], "mean", dims=[1]))
    def windows(b, p):
        # input gradients of padded convolutions (a convolution of dy with the reversed filter),
        # the filters' through the grad row, pooling through its windows
        x = b.op("conv2d", [p((2, 4, 4, 2)), p((3, 3, 2, 3))], "conv", padding=[[1, 1], [2, 0]])
        x = b.op("max_pool2d", [b.op("tanh", [x], "act")], "pool", window=[2, 2])
        y = b.op("conv1d", [b.op("reshape", [x], "rows", shape=[2, 2, 6]), p((2, 6, 2))], "conv1d", padding=[[1, 0]])
        return b.op("avg_pool2d", [b.op("reshape", [y], "grid", shape=[2, 2, 2, 1])], "avg", window=[2, 1]),
    return {"dot_general": dot_general_transposed, "elementwise": elementwise, "data_movement": data_movement, "norms": norms,
            "windows": windows}


@pytest.mark.parametrize("body", sorted(_small_graphs()))
def test_backward_rules_match_finite_differences(body):
    b = GraphBuilder(body, "f64")
    counter = iter(range(100))
    outs = _small_graphs()[body](b, lambda shape: b.parameter(f"p{next(counter)}", shape))
    seeds = {y: b.input(f"dy.{y}", b.shape(y)) for y in outs}
    params = b.tensors_with_role("parameter")
    grads = add_backward(b, seeds, params)
    b.mark_outputs(*grads.values())
    graph = graph_from_json(b.document())
    values = random_inputs(graph, seed=9)
    computed = evaluate_graph(graph, values)
    step = 1e-6
    for p in params:
        numeric = np.zeros_like(values[p])
        for index in np.ndindex(values[p].shape):
            total = 0.0
            for sign in (1, -1):
                moved = values[p].copy()
                moved[index] += sign * step
                result = evaluate_graph(graph, values | {p: moved})
                total += sign * sum(float(np.sum(result[y] * values[seeds[y]])) for y in outs)
            numeric[index] = total / (2 * step)
        np.testing.assert_allclose(computed[grads[p]], numeric, rtol=1e-5, atol=1e-8, err_msg=p)


def test_adam_update_follows_the_folded_formula():
    doc = mlp(MLPConfig(layers=1, batch=2, hidden=3, ffn=4, dtype="f32"), training=True)
    graph = graph_from_json(doc)
    values = random_inputs(graph, seed=3)
    for name in ("layer0.w1", "layer0.w2"):
        values[f"adam.{name}.v"] = np.abs(values[f"adam.{name}.v"])  # a second moment is non-negative
    beta1, beta2, lr, eps, t = 0.9, 0.999, 1e-3, 1e-8, 3
    scalars = [1 - beta1, 1 - beta2, lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t), eps * math.sqrt(1 - beta2 ** t)]
    values |= {name: np.float32(v) for name, v in zip(ADAM_SCALARS, scalars)}
    out = evaluate_graph(graph, values)
    g = out[graph.op_by_name["adam.layer0.w1.m_delta"].inputs[0]].astype(np.float64)
    m = beta1 * values["adam.layer0.w1.m"] + (1 - beta1) * g
    v = beta2 * values["adam.layer0.w1.v"] + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    expected = values["layer0.w1"] - lr * m_hat / (np.sqrt(v_hat) + eps)
    np.testing.assert_allclose(out["adam.layer0.w1.new_m"], m, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out["adam.layer0.w1.new_v"], v, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out["layer0.w1.new"], expected, rtol=1e-5, atol=1e-6)


def test_bf16_training_keeps_adam_state_in_f32_and_casts_the_update():
    graph = graph_from_json(gpt(GPTConfig(layers=1, hidden=8, heads=2, seq=4, batch=1, vocab=8), training=True))
    assert graph.tensors["adam.lm_head.w.m"].dtype == "f32"
    assert graph.tensors["lm_head.w.new"].dtype == "bf16"
    assert graph.op_by_name["adam.lm_head.w.grad"].kind == "cast"


# --- builder and configs ------------------------------------------------------------------
def test_builder_infers_shapes_and_makes_names_unique():
    b = GraphBuilder("g", "f32")
    x = b.input("x", (2, 3))
    w = b.parameter("w", (3, 5))
    y = b.op("matmul", [x, w], "y")
    y2 = b.op("relu", [y], "y")
    assert (y, y2) == ("y", "y.1") and b.shape(y2) == (2, 5)
    with pytest.raises(OpError, match="op 'bad' \\(matmul\\)"):
        b.op("matmul", [x, x], "bad")


@pytest.mark.parametrize("make, field", [
    (lambda: GPTConfig(hidden=10, heads=3), "heads"),
    (lambda: GPTConfig(style="bert"), "style"),
    (lambda: GPTConfig(layers=0), "layers"),
    (lambda: MoEConfig(top_k=9, experts=8), "top_k"),
    (lambda: MLPConfig(dtype="i32"), "dtype"),
    (lambda: UNetConfig(levels=3, height=36), "height"),
])
def test_bad_configs_name_the_field(make, field):
    with pytest.raises(InputError) as error:
        make()
    assert [p.where for p in error.value.problems] == [field]


# --- CLI ----------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["gpt", "--layers", "2", "--hidden", "16", "--heads", "2", "--seq", "8", "--batch", "2", "--vocab", "32", "--training"],
    ["gpt", "--layers", "1", "--hidden", "16", "--heads", "4", "--seq", "8", "--vocab", "32", "--style", "llama", "--dtype", "f32"],
    ["mlp", "--layers", "2", "--hidden", "16", "--ffn", "32"],
    ["moe", "--batch", "2", "--seq", "4", "--hidden", "8", "--experts", "4", "--top-k", "1", "--training"],
    ["unet", "--levels", "2", "--height", "16", "--width", "8", "--base", "4", "--training"],
], ids=["gpt-training", "llama", "mlp", "moe-training", "unet-training"])
def test_generate_writes_a_graph_that_loads(tmp_path, capsys, argv):
    path = tmp_path / "graph.json"
    assert main(["generate", *argv, "-o", str(path)]) == 0
    graph = load_graph(path)
    summary = capsys.readouterr().out
    assert summary.startswith(f"wrote {path}: {graph.name}: {len(graph.ops)} ops")
    assert "FLOP" in summary and "parameter elements" in summary
    assert json.loads(path.read_text())["format"] == "autoshard.graph/v1"


def test_generate_bad_arguments_name_the_flag(tmp_path, capsys):
    path = tmp_path / "graph.json"
    assert main(["generate", "gpt", "--hidden", "10", "--heads", "3", "-o", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--heads: must divide hidden (10), got 3" in err
    assert main(["generate", "moe", "--capacity-factor", "0", "-o", str(path)]) == 2
    assert "--capacity-factor: must be a positive number" in capsys.readouterr().err
    assert not path.exists()


# --- examples -----------------------------------------------------------------------------
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
GENERATED = {
    "mlp.json": (mlp, MLPConfig(layers=2, batch=8, hidden=64, ffn=256, dtype="f32"), False),
    "gpt_tiny.json": (gpt, GPTConfig(layers=2, hidden=64, heads=4, seq=16, batch=2, vocab=128, dtype="f32"), False),
    "gpt_tiny_training.json": (gpt, GPTConfig(layers=2, hidden=64, heads=4, seq=16, batch=2, vocab=128, dtype="f32"), True),
    "moe_tiny.json": (moe, MoEConfig(layers=1, batch=2, seq=8, hidden=32, ffn=64, experts=4, top_k=2, dtype="f32"), False),
    "unet_tiny.json": (unet, UNetConfig(levels=2, batch=2, height=64, width=64, base=4, dtype="f32"), False),
}


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_generated_examples_are_current_and_evaluate(name):
    generate, config, training = GENERATED[name]
    text = (EXAMPLES / name).read_text()
    assert json.loads(text) == generate(config, training=training)
    graph = load_graph(EXAMPLES / name)
    values = evaluate_graph(graph, random_inputs(graph))
    assert all(np.isfinite(values[t]).all() for t in graph.outputs)


def test_weight_stationary_example_is_the_seeds_mlp_with_its_pins():
    graph = load_graph(EXAMPLES / "weight_stationary_mlp.json")
    assert graph.mesh_hint == "x=2,y=2,z=2"
    assert [op.kind for op in graph.ops] == ["matmul", "relu", "matmul"]
    pins = {c.tensor: (c.sharding.split_axes, c.required) for c in graph.constraints}
    assert pins == {"in": (((), (), ("x", "y", "z")), True), "w1": ((("x",), ("y", "z")), True),
                    "w2": ((("y", "z"), ("x",)), True), graph.outputs[0]: (((), (), ("x", "y", "z")), True)}
    values = random_inputs(graph, seed=4)
    out = evaluate_graph(graph, values)[graph.outputs[0]]
    np.testing.assert_allclose(out, np.maximum(values["in"] @ values["w1"], 0) @ values["w2"], rtol=1e-5, atol=1e-6)

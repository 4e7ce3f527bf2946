"""The load-balanced causal layout (issue 34, item 4): the sequence stored in 2n chunks ordered
0, 2n - 1, 1, 2n - 2, ... (`ops.nn`, attention's attribute `balanced_over`), so a contiguous split
over n devices gives device i chunks i and 2n - 1 - i and every device the same causal work.
Proven equal to the contiguous computation in the stored order (op table, simulator, generated
models with grouped-query attention, lowered IR run by mlir-runner), priced per device by its
unmasked area, chosen by the solver where the sequence is split, and named in the plan document."""

from __future__ import annotations

import re

import numpy as np
import pytest

from autoshard.cli.plan import print_roles
from autoshard.errors import InputError
from autoshard.graph.evaluate import evaluate_graph
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.mlir import emit_partitioned, verify
from autoshard.models import GPTConfig, GraphBuilder, gpt
from autoshard.models.gpt import POSITION_IDS, sequence_inputs, to_layout
from autoshard.ops import OP_KINDS, evaluate
from autoshard.ops.nn import (BALANCED, KEY_LOOP, QUERY_LOOP, attention_scores, block_pair_counts, causal_pairs,
                              layout_order, position_segments)
from autoshard.ops.table import Context, OpError
from autoshard.planning.costs import device_flops
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import make_plan
from autoshard.planning.options import ShardingOption as O
from autoshard.planning.plan import Plan
from autoshard.planning.roles import roles_document
from autoshard.planning.sequence_layout import sequence_entries
from autoshard.sharding import Sharding as S
from autoshard.sim.local_op import loop_block
from autoshard.sim.program import simulate_program
from autoshard.spmd.program import partition
from support.mlir_run import run_module, signature

Q_OVER_CP = O(((), (), ("cp",), (), (), ()))
K_OVER_CP = O(((), (), (), (), ("cp",), ()))


def test_the_stored_order_puts_chunks_i_and_2n_minus_1_minus_i_in_the_ith_block():
    assert layout_order(8, 2).tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    assert layout_order(16, 4).tolist() == [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9]
    assert layout_order(6, None).tolist() == layout_order(6, 1).tolist() == list(range(6))
    # a block of stored indices as runs of consecutive positions: one per chunk it touches
    assert position_segments(0, 4, 8, 2) == [(0, 2), (6, 2)]
    assert position_segments(3, 3, 8, 2) == [(7, 1), (2, 2)]
    assert position_segments(2, 3, 8, None) == [(2, 3)]
    for n in (2, 3, 4):
        order = layout_order(12 * n, n)
        assert sorted(order.tolist()) == list(range(12 * n))
        for device in range(n):  # a contiguous split over n: chunks device and 2n - 1 - device
            held = order[12 * device:12 * device + 12]
            assert sorted({int(p) // 6 for p in held}) == sorted({device, 2 * n - 1 - device})


def attention_graph(n: int | None, mask: str | None = None, shape=(2, 3, 16, 4), grads: bool = False):
    """Causal attention in the balanced layout over `n` (None: the own order), a mask [H, S, T]
    and, with `grads`, the gradients of q, k, v (and of an added mask)."""
    b = GraphBuilder("balanced", "f64")
    q, k, v = (b.input(name, shape) for name in "qkv")
    inputs = [q, k, v]
    if mask is not None:
        inputs.append(b.input("mask", (shape[1], shape[2], shape[2]), "bool" if mask == "bool" else "f64"))
    attrs = {"causal": True} | ({BALANCED: n} if n else {})
    outputs = [b.op("attention", inputs, "sdpa", **attrs)]
    if grads:
        dy = b.input("dy", shape)
        wrts = (0, 1, 2, 3) if mask == "f64" else (0, 1, 2)
        outputs += [b.op("grad", [*inputs, dy], f"d{'qkvm'[w]}", of="attention", wrt=w, forward=attrs) for w in wrts]
    b.mark_outputs(*outputs)
    return graph_from_json(b.document())


def random_inputs(graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for t in graph.tensors.values():
        if t.role == "input":
            out[t.name] = rng.random(t.shape) < 0.7 if t.dtype == "bool" else rng.standard_normal(t.shape)
    if "mask" in out and out["mask"].dtype == np.bool_:
        out["mask"][..., 0] = True  # position 0 kept for every query: no row all masked
    return out


def stored(values: dict[str, np.ndarray], order: np.ndarray) -> dict[str, np.ndarray]:
    """Values in the stored order: q, k, v, dy along their sequence dim, a mask [H, S, T] along both."""
    out = {name: x[:, :, order] for name, x in values.items() if name != "mask"}
    if "mask" in values:
        out["mask"] = values["mask"][:, order][:, :, order]
    return out


@pytest.mark.parametrize("mask", [None, "bool", "f64"])
def test_balanced_attention_and_its_gradients_are_the_contiguous_ones_in_the_stored_order(mask):
    n = 2
    plain, balanced = attention_graph(None, mask, grads=True), attention_graph(n, mask, grads=True)
    values = random_inputs(plain)
    order = layout_order(16, n)
    reference = evaluate_graph(plain, values)
    found = evaluate_graph(balanced, stored(values, order))
    for name in ("sdpa", "dq", "dk", "dv"):
        np.testing.assert_allclose(found[name], reference[name][:, :, order], rtol=1e-12, atol=1e-12, err_msg=name)
    if mask == "f64":
        np.testing.assert_allclose(found["dm"], reference["dm"][:, order][:, :, order], rtol=1e-12, atol=1e-12)
    # the same inputs read in the own order differ: the mask follows the positions, not the indices
    assert not np.allclose(evaluate_graph(plain, stored(values, order))["sdpa"], found["sdpa"])


@pytest.mark.parametrize("option", [Q_OVER_CP, K_OVER_CP, O(((), (), ("cp",), (), ("dp",), ())),
                                    O((("dp",), (), (), (), ("cp",), ()))],
                         ids=["queries", "keys", "queries-and-keys", "batch-and-keys"])
def test_the_simulator_runs_a_split_balanced_layout_to_the_unsharded_values(option):
    mesh = Mesh.parse("dp=2,cp=4")
    graph = attention_graph(4, "f64", shape=(2, 3, 24, 4), grads=True)
    stores = {t.name: S() for t in graph.tensors.values() if t.role != "intermediate"}
    plan = Plan(graph, mesh, {op.name: option for op in graph.ops}, stores)
    values = random_inputs(graph, 1)
    verdict = simulate_program(partition(plan), values)
    assert verdict.passed and verdict.max_error < 1e-12, verdict.summary()
    # and the reference it matched is the contiguous attention, permuted
    plain = evaluate_graph(attention_graph(None, "f64", shape=(2, 3, 24, 4), grads=True),
                           stored(values, np.argsort(layout_order(24, 4))))
    found = evaluate_graph(graph, values)
    order = layout_order(24, 4)
    for name in ("sdpa", "dq", "dk", "dv"):
        np.testing.assert_allclose(found[name], plain[name][:, :, order], atol=1e-12, err_msg=name)


def measured_pairs(op, mesh: Mesh, option: O) -> list[int]:
    """Each device's unmasked (query, key) pairs, counted from the mask it applies."""
    counts = []
    for device in mesh.devices():
        block = loop_block(mesh, op.nest, option, device)
        ctx = Context(op.nest, block, op.attrs, ())
        q = np.zeros((1, 1, block.sizes[QUERY_LOOP], 4))
        k = np.zeros((1, 1, block.sizes[KEY_LOOP], 4))
        counts.append(int(np.isfinite(attention_scores([q, k], ctx)).sum()))
    return counts


@pytest.mark.parametrize("n", [2, 4, 8])
def test_per_device_flops_are_equal_in_the_balanced_layout_and_2n_minus_1_apart_in_the_contiguous_one(n):
    chunk = 32
    shape = (1, 1, 2 * n * chunk, 4)
    mesh = Mesh.parse(f"cp={n}")
    per_pair = None
    for layout in (None, n):
        op = attention_graph(layout, shape=shape).op_by_name["sdpa"]
        per_pair = op.flops() / causal_pairs(shape[2], shape[2])
        for option in (Q_OVER_CP, K_OVER_CP):
            pairs = measured_pairs(op, mesh, option)
            splits = (1, 1, n, 1, 1, 1) if option is Q_OVER_CP else (1, 1, 1, 1, n, 1)
            assert pairs == block_pair_counts(op.nest, op.attrs, splits)  # the priced count is the mask's
            assert sum(pairs) == causal_pairs(shape[2], shape[2])
            assert device_flops(op, option, mesh) == pytest.approx(max(pairs) * per_pair)
            if layout is None:  # the last query block (the first key block) does 2n - 1 times the work
                assert max(pairs) / min(pairs) == pytest.approx(2 * n - 1, rel=0.04)
            else:
                # queries: chunk i and 2n - 1 - i see 2n - 1 chunks and two diagonals; keys: seen by as many
                assert pairs == [(2 * n - 1) * chunk * chunk + chunk * (chunk + 1)] * n


def test_the_solver_splits_a_long_balanced_sequence_and_it_prices_below_the_contiguous_split():
    """Three heads over 32k tokens arriving split over cp=4 along the sequence: the solver splits
    the queries in both layouts; the balanced layout's busiest device does the average work, the
    contiguous one's 7/16 of it, and the step follows."""
    mesh = Mesh.parse("cp=4")
    hw = bind_hardware("dgx-h100", mesh)
    shares, options, steps = {}, {}, {}
    for layout in (None, 4):
        b = GraphBuilder("long", "bf16")
        q, k, v = (b.input(name, (1, 3, 32768, 128)) for name in "qkv")
        b.mark_outputs(b.op("attention", [q, k, v], "sdpa", causal=True, **({BALANCED: layout} if layout else {})))
        doc = b.document()
        doc["constraints"] = [{"tensor": name, "split_axes": [[], [], ["cp"]]} for name in "qkv"]
        graph = graph_from_json(doc, mesh)
        result = make_plan(graph, mesh, hw)
        op = graph.op_by_name["sdpa"]
        options[layout], steps[layout] = result.plan.options["sdpa"], result.report.step_s
        shares[layout] = device_flops(op, options[layout], mesh) / op.flops()
    assert options[None].loop_axes[QUERY_LOOP] == options[4].loop_axes[QUERY_LOOP] == ("cp",)
    assert shares[4] == pytest.approx(0.25, rel=1e-6)
    assert shares[None] == pytest.approx(7 / 16, rel=1e-4)  # the last query block
    # contiguous: 0.506 ms as a ring (each of its 4 steps waits for some device's full block below
    # the diagonal; K/V gathered instead, 0.581 ms: 7/4 of the balanced compute); balanced: 0.385 ms,
    # K/V gathered and every device a quarter of the work
    assert (options[None].ring, options[4].ring) == ("cp", None)
    assert steps[None] / steps[4] > 1.3


def test_the_plan_document_and_report_name_the_layout(capsys):
    mesh = Mesh.parse("dp=2,cp=4")
    graph = attention_graph(4, shape=(2, 3, 24, 4))
    stores = {t.name: S() for t in graph.tensors.values() if t.role != "intermediate"}
    layout = roles_document(Plan(graph, mesh, {"sdpa": Q_OVER_CP}, stores))["sequence_layout"]
    assert layout == {"layout": "load-balanced causal", "balanced_over": 4, "chunks": 8,
                      "device_chunks": [[0, 7], [1, 6], [2, 5], [3, 4]],
                      "stored_in_layout_order": {"q": [2], "k": [2], "v": [2]},
                      "attention": {"sdpa": {"query_axes": ["cp"], "key_axes": [], "busiest_over_least_work": 1.0}}}
    roles = roles_document(Plan(graph, mesh, {"sdpa": Q_OVER_CP}, stores))
    print_roles(roles)
    assert ("sequence layout: load-balanced causal over 4 (8 chunks; device i of a contiguous split over 4 holds "
            "chunks i and 7 - i): queries over cp: causal work busiest/least 1") in capsys.readouterr().out
    # a plan in the sequence's own order has no layout entry (its document is as before)
    plain = attention_graph(None, shape=(2, 3, 24, 4))
    assert "sequence_layout" not in roles_document(Plan(plain, mesh, {"sdpa": Q_OVER_CP}, stores))
    # a split over 2 of a layout balanced over 4 is still exact, and reported as what it is
    over_dp = roles_document(Plan(graph, mesh, {"sdpa": O(((), (), ("dp",), (), (), ()))}, stores))
    assert over_dp["sequence_layout"]["attention"]["sdpa"]["busiest_over_least_work"] == 1.0


def small_config(**changes) -> GPTConfig:
    return GPTConfig(**{"layers": 2, "hidden": 16, "heads": 4, "kv_heads": 2, "seq": 8, "batch": 2, "vocab": 11,
                        "dtype": "f64"} | changes)


def step_values(graph, config: GPTConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = {}
    for t in graph.tensors.values():
        if t.role == "intermediate" or t.name == POSITION_IDS:
            continue
        if t.name in ("ids", "labels"):
            values[t.name] = rng.integers(0, config.vocab, t.shape).astype(np.int32)
        elif t.name.endswith(".dispatch"):  # a 0/1 assignment of tokens to expert slots
            values[t.name] = (rng.random(t.shape) < 0.2).astype(np.float64)
        elif t.name == "loss.token_weight":
            values[t.name] = np.array(1.0 / (config.batch * config.seq))
        else:
            values[t.name] = rng.standard_normal(t.shape) * 0.5
    return values


@pytest.mark.parametrize("style, experts", [("gpt", 0), ("llama", 0), ("gpt", 4)], ids=["gpt", "llama", "gpt-moe"])
def test_a_generated_training_step_in_the_balanced_layout_has_the_same_loss_and_gradients(style, experts):
    """Grouped-query attention (4 heads over 2 K/V heads), dense or routed MLPs: token ids,
    labels, (GPT) position ids and routers' assignments fed in the stored order give the
    contiguous model's loss, every parameter's gradient and the logits in the stored order."""
    plain_config = small_config(style=style, moe_experts=experts)
    config = small_config(style=style, moe_experts=experts, balanced_over=2)
    plain, balanced = (graph_from_json(gpt(c, training=True)) for c in (plain_config, config))
    assert all(op.attrs.get(BALANCED) == 2 for op in balanced.ops if op.kind == "attention")
    assert (POSITION_IDS in balanced.tensors) == (style == "gpt")
    fed = ({"ids": 1, "labels": 1} | ({POSITION_IDS: 0} if style == "gpt" else {})
           | ({"layer0.mlp.dispatch": 1, "layer1.mlp.dispatch": 1} if experts else {}))
    assert sequence_inputs(config) == fed
    # the generator's list is what the roles' labels find in its graph
    assert sequence_entries(balanced) == {name: [dim] for name, dim in fed.items()}
    values = step_values(plain, plain_config)
    reference = evaluate_graph(plain, values)
    fed = to_layout(config, values)
    order = layout_order(8, 2)
    assert (fed["ids"] == values["ids"][:, order]).all() and (fed["labels"] == values["labels"][:, order]).all()
    found = evaluate_graph(balanced, fed)
    loss = next(name for name in plain.outputs if "loss" in name)
    assert found[loss] == pytest.approx(float(reference[loss]), rel=1e-12)
    for param, grad in plain.gradients.items():
        np.testing.assert_allclose(found[balanced.gradients[param]], reference[grad], rtol=1e-9, atol=1e-12,
                                   err_msg=param)
    np.testing.assert_allclose(found["logits"], reference["logits"][:, order], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("option", [Q_OVER_CP, K_OVER_CP], ids=["queries", "keys"])
def test_a_generated_llama_training_step_in_the_balanced_layout_simulates_with_attention_split(option):
    """Grouped-query attention and its gradients with the stored sequence split over cp (the
    other ops whole): the simulator's values equal the unsharded step's."""
    mesh = Mesh.parse("cp=2")
    config = small_config(style="llama", balanced_over=2, layers=1)
    graph = graph_from_json(gpt(config, training=True), mesh)
    options = {op.name: option if op.kind == "attention" or op.attrs.get("of") == "attention"
               else O.replicated(op.nest.num_loops) for op in graph.ops}
    assert sum(o is option for o in options.values()) == 4  # the forward and three gradients
    stores = {t.name: S() for t in graph.tensors.values() if t.role != "intermediate"}
    values = to_layout(config, step_values(graph, config))
    verdict = simulate_program(partition(Plan(graph, mesh, options, stores)), values)
    assert verdict.passed and verdict.max_error < 1e-9, verdict.summary()


def test_layout_errors_name_the_field():
    with pytest.raises(OpError, match="'balanced_over' = 3 stores the sequence in 6 equal chunks") as error:
        OP_KINDS["attention"].loops([(1, 1, 16, 4)] * 3, {"causal": True, BALANCED: 3})
    assert error.value.field == BALANCED
    for bad in (0, True, "2", 1.5):
        with pytest.raises(OpError, match="'balanced_over' must be a positive integer") as error:
            OP_KINDS["attention"].loops([(1, 1, 16, 4)] * 3, {"causal": True, BALANCED: bad})
        assert error.value.field == BALANCED
    b = GraphBuilder("bad", "f32")
    q = b.input("q", (1, 1, 12, 4))
    b.mark_outputs(b.op("attention", [q, q, q], "sdpa", causal=True, balanced_over=3))
    doc = b.document()
    (op,) = doc["ops"]
    op[BALANCED] = 4  # a hand-edited document: read with the field named
    with pytest.raises(InputError, match="12 queries do not divide") as error:
        graph_from_json(doc)
    assert [p.where for p in error.value.problems] == ["/ops/0/balanced_over"]
    for changes, message in (({"balanced_over": 3}, "2 x 3 equal chunks, which must divide seq"),
                             ({"balanced_over": 0}, "balanced_over"),
                             ({"balanced_over": 2, "style": "megatron", "kv_heads": None}, "megatron style keeps"),
                             ({"balanced_over": 2, "moe_experts": 4, "moe_group_size": 4}, "moe_group_size 4 would")):
        with pytest.raises(InputError, match=message) as error:
            small_config(**changes)
        assert [p.where for p in error.value.problems] == ["balanced_over"]


def test_the_cli_flag_is_named_in_its_error(tmp_path, capsys):
    from autoshard.cli.main import main
    assert main(["generate", "gpt", "--seq", "12", "--balanced-over", "4", "-o", str(tmp_path / "g.json")]) != 0
    assert ("--balanced-over: the layout stores the sequence in 2 x 4 equal chunks, which must divide seq (12)"
            in capsys.readouterr().err)
    assert main(["generate", "gpt", "--layers", "1", "--hidden", "16", "--heads", "2", "--seq", "16", "--batch", "1",
                 "--vocab", "8", "--balanced-over", "4", "-o", str(tmp_path / "g.json")]) == 0
    graph = graph_from_json(__import__("json").loads((tmp_path / "g.json").read_text()))
    assert graph.op_by_name["layer0.attn.sdpa"].attrs[BALANCED] == 4


def ir_lines(module: str, device: int) -> str:
    """The partitioned module as device `device` runs it: its index a constant."""
    out = []
    for line in module.splitlines():
        if "shard.process_multi_index" in line:
            line = line.split(" = ")[0] + f" = arith.constant {device} : index"
        out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("dialect", ["mesh", "shard"])
def test_the_partitioned_ir_of_a_balanced_split_verifies(dialect):
    mesh = Mesh.parse("dp=2,cp=4")
    graph = attention_graph(4, shape=(2, 3, 24, 4), grads=True)
    stores = {t.name: S() for t in graph.tensors.values() if t.role != "intermediate"}
    for option in (Q_OVER_CP, K_OVER_CP):
        text = emit_partitioned(Plan(graph, mesh, {op.name: option for op in graph.ops}, stores), dialect)
        verify(text, dialect)
        # each causal mask maps its stored index to its position: chunk = slot / 2 or 2n - 1 - slot / 2
        assert len(re.findall(r"arith.select %odd\w*, %late\w*, %half\w* : index", text)) == 2 * 4


def test_each_devices_query_block_run_by_mlir_runner_is_its_rows_of_the_reference():
    """Causal attention balanced over 2, its queries split over cp=2 (f32, each device its stored
    queries, k and v whole): device d's module, its index a constant, returns the reference's stored rows
    [4d, 4d + 4), which hold positions of chunks d and 3 - d."""
    mesh = Mesh.parse("cp=2")
    b = GraphBuilder("balanced_run", "f32")
    q, k, v = (b.input(name, (1, 2, 8, 3)) for name in "qkv")
    b.mark_outputs(b.op("attention", [q, k, v], "sdpa", causal=True, balanced_over=2))
    graph = graph_from_json(b.document())
    storage = {"q": S(((), (), ("cp",))), "k": S(), "v": S()}  # each device its stored queries
    module = emit_partitioned(Plan(graph, mesh, {"sdpa": Q_OVER_CP}, storage), "shard")
    assert "shard.all_" not in module  # nothing moves: the block is the device's own
    names, _, _ = signature(module, graph.name)
    rng = np.random.default_rng(7)
    values = {n: rng.standard_normal((1, 2, 8, 3)).astype(np.float32) for n in "qkv"}
    expected = evaluate_graph(graph, values)["sdpa"]
    plain = evaluate(OP_KINDS["attention"], OP_KINDS["attention"].loops([(1, 2, 8, 3)] * 3, {"causal": True}),
                     {"causal": True}, [x[:, :, np.argsort(layout_order(8, 2))].astype(np.float64)
                                        for x in (values["q"], values["k"], values["v"])])[0]
    np.testing.assert_allclose(expected, plain[:, :, layout_order(8, 2)], rtol=1e-5, atol=1e-5)
    for device in (0, 1):
        held = dict(values, q=values["q"][:, :, 4 * device:4 * device + 4])
        (got,) = run_module(ir_lines(module, device), graph.name, [held[n] for n in names])
        np.testing.assert_allclose(got, expected[:, :, 4 * device:4 * device + 4], rtol=2e-5, atol=2e-5)


def test_the_lowered_forward_and_gradients_of_the_balanced_layout_compute_the_reference():
    """The whole op on one device (f32), run by mlir-runner: the forward and the three gradients
    equal the op table's, which equal the contiguous attention's in the stored order."""
    one = Mesh.of(x=1)
    b = GraphBuilder("balanced_grads", "f32")
    q, k, v = (b.input(name, (1, 2, 12, 3)) for name in "qkv")
    dy = b.input("dy", (1, 2, 12, 3))
    forward = {"causal": True, BALANCED: 3}
    b.mark_outputs(b.op("attention", [q, k, v], "sdpa", **forward),
                   *(b.op("grad", [q, k, v, dy], f"d{n}", of="attention", wrt=w, forward=forward)
                     for w, n in enumerate("qkv")))
    graph = graph_from_json(b.document(), one)
    plan = Plan(graph, one, {op.name: O.replicated(6) for op in graph.ops}, {n: S() for n in ("q", "k", "v", "dy")})
    module = emit_partitioned(partition(plan), "shard")
    names, _, _ = signature(module, graph.name)
    rng = np.random.default_rng(11)
    values = {n: rng.standard_normal((1, 2, 12, 3)).astype(np.float32) for n in names}
    results = run_module(ir_lines(module, 0), graph.name, [values[n] for n in names])
    expected = evaluate_graph(graph, values)
    for output, got in zip(graph.outputs, results):
        np.testing.assert_allclose(got, expected[output], rtol=2e-5, atol=2e-5, err_msg=output)
    order = layout_order(12, 3)
    plain = attention_graph(None, shape=(1, 2, 12, 3), grads=True)
    natural = stored({n: x.astype(np.float64) for n, x in values.items()}, np.argsort(order))
    reference = evaluate_graph(plain, natural)
    for output in ("sdpa", "dq", "dk", "dv"):
        np.testing.assert_allclose(expected[output], reference[output][:, :, order], rtol=1e-4, atol=1e-5)

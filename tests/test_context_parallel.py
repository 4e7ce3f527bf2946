"""Context parallelism: attention's key loop split over a mesh axis, each device computing its
key block's online-softmax state, combined by all_reduce max then sum with the rescaling between
(`ops/nn.py`). Proven by the simulator against the unsharded graph, priced by its collectives,
chosen by the solver where the keys are long, and emitted as IR the real verifiers accept."""

from __future__ import annotations

import re

import numpy as np
import pytest

from autoshard.graph.evaluate import evaluate_graph
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.mlir import emit_partitioned, verify
from autoshard.models import GraphBuilder
from autoshard.ops import OP_KINDS, evaluate
from autoshard.ops.loops import PARALLEL, REDUCTION, map_extent
from autoshard.ops.nn import COMBINED, KEY_LOOP, attention_scores, causal_pairs
from autoshard.ops.table import Context
from autoshard.planning.costs import attention_combine_seconds, device_flops, op_cost
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import make_plan
from autoshard.planning.options import ShardingOption as O
from autoshard.planning.plan import Plan
from autoshard.planning.report import estimate
from autoshard.planning.roles import plan_roles
from autoshard.sharding import Sharding as S
from autoshard.sim.local_op import loop_block
from autoshard.sim.program import simulate_program, verify_plan
from autoshard.spmd.program import Communicate, LocalOp, partition
from support.attention import attention_gradient_graph, attention_inputs, stored_whole
from support.mlir_run import run_module, signature

MESH = Mesh.parse("dp=2,cp=4")
# queries and keys of different lengths; 14 keys over 4 devices leave the last block short
Q, K, V = (2, 4, 16, 8), (2, 4, 14, 8), (2, 4, 14, 6)
KEYS_OVER_CP = O(((), (), ("dp",), (), ("cp",), ()))


def attention_graph(causal: bool = False, mask: str | None = None, shapes=(Q, K, V)):
    b = GraphBuilder("cp", "f32")
    q, k, v = (b.input(n, s) for n, s in zip("qkv", shapes))
    inputs = [q, k, v]
    if mask is not None:  # broadcast over the batch: [H, S, T]
        inputs.append(b.input("mask", (shapes[0][1], shapes[0][2], shapes[1][2]), mask))
    b.mark_outputs(b.op("attention", inputs, "sdpa", causal=causal))
    return graph_from_json(b.document())


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mask", [None, "bool", "f32"])
def test_key_split_attention_equals_unsharded_attention(causal, mask):
    graph = attention_graph(causal, mask)
    plan = Plan(graph, MESH, {"sdpa": KEYS_OVER_CP}, stored_whole(graph))
    program = partition(plan)
    verdict = simulate_program(program, attention_inputs(graph))
    assert verdict.passed, verdict.summary()
    assert verdict.max_error < 1e-12
    (local,) = program.local_ops()
    # keys and values (and a mask) read split over cp along the keys; the result complete, not partial
    assert [v.sharding for v in local.inputs[1:3]] == [S(((), (), ("cp",)))] * 2
    if mask is not None:
        assert local.inputs[3].sharding == S(((), ("dp",), ("cp",)))  # [H, S, T]: queries over dp
    (out,) = local.outputs
    assert out.sharding == S(((), (), ("dp",))) and not out.sharding.partial_axes
    # the combine is the op's own: nothing is communicated after it
    assert [type(i) for i in program.body][-1] is LocalOp


def test_key_split_over_both_axes_and_a_query_split_alongside():
    graph = attention_graph(causal=True)
    for option in (O(((), (), (), (), ("dp", "cp"), ())), O(((), ("dp",), ("cp",), (), (), ())),
                   O((("dp",), (), (), (), ("cp",), ()))):
        verdict = verify_plan(Plan(graph, MESH, {"sdpa": option}, stored_whole(graph)))
        assert verdict.passed and verdict.max_error < 1e-12, (option, verdict.summary())


def test_a_device_without_keys_contributes_nothing_and_still_gets_the_result():
    """5 keys over 4 devices: blocks of 2, 2, 1 and none."""
    shapes = ((2, 4, 16, 8), (2, 4, 5, 8), (2, 4, 5, 6))
    graph = attention_graph(causal=True, shapes=shapes)
    plan = Plan(graph, MESH, {"sdpa": KEYS_OVER_CP}, stored_whole(graph))
    assert loop_block(MESH, graph.op_by_name["sdpa"].nest, KEYS_OVER_CP, (0, 3)).sizes[KEY_LOOP] == 0
    verdict = verify_plan(plan)
    assert verdict.passed and verdict.max_error < 1e-12, verdict.summary()
    b = GraphBuilder("cp_grad_uneven", "f32")
    q, k, v = (b.input(n, s) for n, s in zip("qkv", shapes))
    dy = b.input("dy", (2, 4, 16, 6))
    b.mark_outputs(*(b.op("grad", [q, k, v, dy], f"d{n}", of="attention", wrt=w, forward={"causal": True})
                     for w, n in enumerate("qkv")))
    graph = graph_from_json(b.document())
    plan = Plan(graph, MESH, {op.name: KEYS_OVER_CP for op in graph.ops}, stored_whole(graph))
    verdict = verify_plan(plan)
    assert verdict.passed and verdict.max_error < 1e-12, verdict.summary()
    verify(emit_partitioned(plan, "shard"), "shard")


def test_one_key_block_alone_is_not_the_answer_the_combine_is():
    """A device's softmax over its own keys differs from the whole; the combine is what fixes it."""
    graph = attention_graph(causal=True)
    op = graph.op_by_name["sdpa"]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in (Q, K, V))
    (full,) = evaluate(op.op_kind, op.nest, op.attrs, [q, k, v])
    block = loop_block(MESH, op.nest, KEYS_OVER_CP, (0, 1))  # keys [4, 8)
    assert (block.starts[KEY_LOOP], block.sizes[KEY_LOOP]) == (4, 4)
    ctx = Context(op.nest, block, op.attrs, (map_extent(op.nest.output_maps[0], block.sizes),))
    scores = attention_scores([q[:, :, :8], k[:, :, 4:8], v[:, :, 4:8]], ctx)
    # queries 0..3 see none of keys 4..7 (global positions of both blocks); query 7 sees all four
    assert np.isneginf(scores[:, :, :4]).all() and np.isfinite(scores[:, :, 7]).all()
    weights = np.exp(scores[:, :, 4:] - scores[:, :, 4:].max(-1, keepdims=True))
    alone = np.einsum("bhst,bhte->bhse", weights / weights.sum(-1, keepdims=True), v[:, :, 4:8])
    assert not np.allclose(alone, full[:, :, 4:8])


def test_the_gradient_sums_dq_over_the_key_blocks_and_writes_dk_dv_block_by_block():
    forward = OP_KINDS["attention"].loops([Q, K, V], {})
    assert forward.iterator_types[KEY_LOOP] == COMBINED and KEY_LOOP in forward.splittable_loops()
    kinds = {}
    for wrt in (0, 1, 2):
        nest = OP_KINDS["grad"].loops([Q, K, V, (2, 4, 16, 6)], {"of": "attention", "wrt": wrt, "forward": {}})
        kinds[wrt] = nest.iterator_types[KEY_LOOP]
    assert kinds == {0: REDUCTION, 1: PARALLEL, 2: PARALLEL}


def gradient_graph(causal: bool, mask: str | None = None):
    return attention_gradient_graph("cp_grad", (Q, K, V), causal, mask)


@pytest.mark.parametrize("causal, mask", [(False, None), (True, None), (True, "bool"), (False, "f32")])
def test_key_split_gradients_equal_unsharded_gradients(causal, mask):
    graph = gradient_graph(causal, mask)
    plan = Plan(graph, MESH, {op.name: KEYS_OVER_CP for op in graph.ops}, stored_whole(graph))
    program = partition(plan)
    found = attention_inputs(graph)
    found["dy"] = np.random.default_rng(1).standard_normal((2, 4, 16, 6))
    verdict = simulate_program(program, found)
    assert verdict.passed, verdict.summary()
    assert verdict.max_error < 1e-12
    produced = {op.op.name: op.outputs[0].sharding for op in program.local_ops()}
    # dq: a partial sum over the key blocks (then all-reduced); dk and dv: each device its keys' rows
    assert produced["dq"] == S(((), (), ("dp",)), ("cp",))
    # (the queries split over dp make them partial over dp)
    assert produced["dk"] == produced["dv"] == S(((), (), ("cp",)), ("dp",))
    if mask == "f32":  # the [H, S, T] mask's gradient: queries over dp, keys over cp
        assert produced["dm"] == S(((), ("dp",), ("cp",)))
    reduced = sorted((c.input.tensor, c.step.mesh_axes) for c in program.communicates() if c.step.kind == "all_reduce")
    assert reduced == [("dk", ("dp",)), ("dq", ("cp",)), ("dv", ("dp",))]


def test_per_device_flops_of_a_contiguous_causal_split_are_its_unmasked_area():
    n, block = 4, 256
    shapes = ((1, 1, n * block, 16), (1, 1, n * block, 16), (1, 1, n * block, 16))
    op = attention_graph(causal=True, shapes=shapes).op_by_name["sdpa"]
    mesh = Mesh.parse(f"cp={n}")
    per_pair = op.flops() / causal_pairs(n * block, n * block)
    for loop, first_more in ((2, False), (KEY_LOOP, True)):
        axes = [()] * 6
        axes[loop] = ("cp",)
        option = O(tuple(axes))
        flops = []
        for device in mesh.devices():
            b = loop_block(mesh, op.nest, option, device)
            ctx = Context(op.nest, b, op.attrs, ())
            q = np.zeros((1, 1, b.sizes[2], 16))
            k = np.zeros((1, 1, b.sizes[KEY_LOOP], 16))
            unmasked = np.isfinite(attention_scores([q, k], ctx)).sum()  # the mask the device really applies
            assert unmasked == causal_pairs(b.sizes[2], b.sizes[KEY_LOOP], b.starts[2], b.starts[KEY_LOOP])
            flops.append(unmasked * per_pair)
        # queries: the last block sees 2n - 1 times the first's keys; keys: the first block is seen that much more
        ratio = flops[0] / flops[-1] if first_more else flops[-1] / flops[0]
        assert ratio == pytest.approx(2 * n - 1, rel=1e-2)
        assert sum(flops) == pytest.approx(op.flops())
        assert device_flops(op, option, mesh) == pytest.approx(max(flops))


def test_a_value_feature_split_still_computes_every_score():
    op = attention_graph().op_by_name["sdpa"]
    b, h, s, e, t, d = op.nest.extents
    features = O(((), (), (), ("cp",), (), ()))
    # each device computes all the scores and the softmax, a quarter of the weighted values
    assert device_flops(op, features, MESH) == pytest.approx(b * h * s * t * (2 * d + 5 + 2 * 2))  # 6 features: blocks of 2


def test_the_combine_is_priced_as_two_all_reduces_over_the_key_axes():
    graph = attention_graph()
    op = graph.op_by_name["sdpa"]
    hw = bind_hardware("dgx-h100", MESH)
    rows_bytes = 2 * 4 * 8 * 4  # [B, H, S/dp] rows of f32
    # max of the row maxima, sum of the exponent sums, sum of the weighted values [B, H, S/dp, E]
    combine = (2 * hw.collective_seconds("all_reduce", ("cp",), rows_bytes)
               + hw.collective_seconds("all_reduce", ("cp",), rows_bytes * 6))
    assert attention_combine_seconds(graph, op, KEYS_OVER_CP, MESH, hw) == pytest.approx(combine)
    queries = O(((), (), ("dp",), (), (), ()))
    assert attention_combine_seconds(graph, op, queries, MESH, hw) == 0.0
    without = op_cost(graph, op, queries, MESH, hw)
    with_keys = op_cost(graph, op, KEYS_OVER_CP, MESH, hw)
    assert with_keys.flops == pytest.approx(without.flops / 4 * 16 / 14)  # 14 keys: blocks of 4
    assert with_keys.seconds > combine > 0


def decode_graph(keys: int, kv_heads: int, heads: int = 8, queries: int = 16, dim: int = 128) -> dict:
    """Grouped-query attention of a few queries over a long key/value cache stored split over cp
    along the keys (the cache of a long context), K/V repeated to the query heads by views."""
    b = GraphBuilder("decode", "bf16")
    q = b.input("q", (1, heads, queries, dim))
    group = heads // kv_heads
    kv = []
    for name in "kv":
        x = b.input(name, (1, kv_heads, keys, dim))
        wide = b.op("broadcast_in_dim", [x], f"{name}.repeat", shape=[1, kv_heads, group, keys, dim],
                    broadcast_dimensions=[0, 1, 3, 4])
        kv.append(b.op("reshape", [wide], f"{name}.grouped", shape=[1, heads, keys, dim]))
    b.mark_outputs(b.op("attention", [q, *kv], "sdpa", causal=False))
    doc = b.document()
    doc["constraints"] = [{"tensor": n, "split_axes": [[], [], ["cp"]]} for n in "kv"]
    return doc


def test_the_solver_splits_the_keys_of_a_long_context_and_moves_kv_at_kv_heads():
    mesh = Mesh.parse("cp=8")
    hw = bind_hardware("dgx-h100", mesh)
    graph = graph_from_json(decode_graph(131072, kv_heads=2), mesh)
    result = make_plan(graph, mesh, hw)
    option = result.plan.options["sdpa"]
    assert option.loop_axes[KEY_LOOP] == ("cp",)
    assert plan_roles(result.plan).ops["sdpa"] == {"cp": "context"}
    program = partition(result.plan, hw.collective_seconds)
    # K and V stay where the cache is: nothing moves them, at kv heads or after the repeat
    moved = {c.input.tensor for c in program.body if isinstance(c, Communicate)}
    assert not moved & {"k", "v", "k.repeat", "v.repeat", "k.grouped", "v.grouped"}
    # against the all-gather realisation: queries split, the cache gathered whole at kv heads, then repeated
    options = {name: O.replicated(op.nest.num_loops) for name, op in graph.op_by_name.items()}
    options["sdpa"] = O(((), (), ("cp",), (), (), ()))
    gathered = Plan(graph, mesh, options, result.plan.storage)
    gathers = [c for c in partition(gathered, hw.collective_seconds).communicates() if c.input.tensor in "kv"]
    assert sorted((c.input.tensor, c.input.shape, c.step.after) for c in gathers) == [
        ("k", (1, 2, 131072, 128), S()), ("v", (1, 2, 131072, 128), S())]
    assert estimate(gathered, hw).step_s > 5 * result.report.step_s


def test_grouped_query_key_split_simulates_to_the_reference_without_moving_kv():
    mesh = Mesh.parse("cp=4")
    graph = graph_from_json(decode_graph(64, kv_heads=2, heads=4, queries=3, dim=8), mesh)
    options = {}
    for op in graph.ops:  # every op splits its keys: dim 3 of the repeat, dim 2 of the others
        keys = op.nest.output_maps[0].results[3 if op.kind == "broadcast_in_dim" else 2].single_loop()
        options[op.name] = O(tuple(("cp",) if l == (KEY_LOOP if op.kind == "attention" else keys) else ()
                                   for l in range(op.nest.num_loops)))
    plan = Plan(graph, mesh, options, {"q": S(), "k": S(((), (), ("cp",))), "v": S(((), (), ("cp",)))})
    verdict = verify_plan(plan)
    assert verdict.passed and verdict.max_error < 1e-12, verdict.summary()
    assert not partition(plan).communicates()


@pytest.mark.parametrize("dialect", ["mesh", "shard"])
def test_the_partitioned_ir_of_a_key_split_verifies_with_its_combine(dialect):
    graph = attention_graph(causal=True, mask="bool")
    plan = Plan(graph, MESH, {"sdpa": KEYS_OVER_CP}, stored_whole(graph))
    text = emit_partitioned(plan, dialect)
    verify(text, dialect)
    reduce_op = "mesh.all_reduce" if dialect == "mesh" else "shard.all_reduce"
    combines = [line.strip() for line in text.splitlines() if reduce_op in line]
    kinds = ["<max>", "<sum>", "<sum>"] if dialect == "mesh" else ["= max", "= sum", "= sum"]
    assert len(combines) == 3 and all(k in line for k, line in zip(kinds, combines))
    assert all("_axes = [1]" in line for line in combines)  # cp is mesh axis 1
    assert ["global_max", "total_sum", "total"] == [line.split(" = ")[0].lstrip("%") for line in combines]


def test_the_partitioned_ir_of_key_split_gradients_verifies_with_their_combines():
    graph = gradient_graph(causal=True)
    plan = Plan(graph, MESH, {op.name: KEYS_OVER_CP for op in graph.ops}, stored_whole(graph))
    for dialect in ("mesh", "shard"):
        text = emit_partitioned(plan, dialect)
        verify(text, dialect)
    reduces = [line.strip().split(" = ")[0].lstrip("%") for line in text.splitlines() if "shard.all_reduce" in line]
    # per gradient: the row max and the exponent sums, dq and dk also rowsum(p dp); then the results'
    # partial sums: dq's over the key blocks (cp), dk's and dv's over the query blocks (dp)
    assert [r.rstrip("_0123456789") for r in reduces] == [
        "global_max", "total_sum", "total_rowdot", "global_max", "total_sum", "total_rowdot",
        "global_max", "total_sum", "dq", "dk", "dv"]


def test_the_key_split_ir_computes_the_reference_when_run():
    """The emitted combine executed by mlir-runner on a one-device mesh whose axis carries the key
    split (its all_reduces over a one-device group are the identity, written as such): the block
    state, its rescaling and the division compute the op table's attention and gradients."""
    one = Mesh.of(x=1)
    b = GraphBuilder("cp_run", "f32")
    q, k, v = (b.input(n, s) for n, s in zip("qkv", ((1, 2, 4, 3), (1, 2, 5, 3), (1, 2, 5, 2))))
    dy = b.input("dy", (1, 2, 4, 2))
    forward = {"causal": True}
    b.mark_outputs(b.op("attention", [q, k, v], "sdpa", causal=True),
                   *(b.op("grad", [q, k, v, dy], f"d{n}", of="attention", wrt=w, forward=forward)
                     for w, n in enumerate("qkv")))
    graph = graph_from_json(b.document(), one)
    keys = O(((), (), (), (), ("x",), ()))
    plan = Plan(graph, one, {op.name: keys for op in graph.ops}, stored_whole(graph))
    module = emit_partitioned(partition(plan), "shard")
    # every collective over the one-device group is the identity: written as a cast; its index is 0
    collective = re.compile(r"^(\s*%[\w.]+) = shard\.(\w+) (%[\w.]+) on @mesh grid_axes = \[0\] .* : "
                            r"(tensor<[^>]*>) -> (tensor<[^>]*>)$")
    index = re.compile(r"^(\s*%[\w.]+) = shard\.process_multi_index on @mesh axes = \[0\] : index$")
    lines, reduces = [], 0
    for line in module.splitlines():
        found, at = collective.match(line), index.match(line)
        if at:  # the one device's index
            line = f"{at.group(1)} = arith.constant 0 : index"
        if found:
            name, kind, value, before, after = found.groups()
            line, reduces = f"{name} = tensor.cast {value} : {before} to {after}", reduces + (kind == "all_reduce")
        lines.append(line)
    # the forward's combine (max, sum, sum), dq's and dk's (max, sum, sum), dv's (max, sum), dq's partial sum
    assert reduces == 3 + 3 + 3 + 2 + 1
    names, _, _ = signature(module, graph.name)
    rng = np.random.default_rng(3)
    values = {n: rng.standard_normal(graph.tensors[n].shape).astype(np.float32) for n in names}
    results = run_module("\n".join(lines), graph.name, [values[n] for n in names])
    expected = evaluate_graph(graph, values)
    for output, got in zip(graph.outputs, results):
        np.testing.assert_allclose(got, expected[output], rtol=2e-5, atol=2e-5, err_msg=output)


def test_each_devices_key_block_run_by_mlir_runner_gives_its_state_and_numpy_combines_them():
    """The partitioned module of a causal key split over cp=2, run once per device (its index a
    constant, the module returning its block's row maximum, exponent sums and weighted values beside
    the result): the two devices' states, combined in numpy as the all_reduces would, give the
    reference attention."""
    mesh = Mesh.parse("cp=2")
    graph = attention_graph(causal=True, shapes=((1, 2, 6, 4), (1, 2, 8, 4), (1, 2, 8, 3)))
    storage = {"q": S(), "k": S(((), (), ("cp",))), "v": S(((), (), ("cp",)))}
    module = emit_partitioned(Plan(graph, mesh, {"sdpa": O(((), (), (), (), ("cp",), ()))}, storage), "shard")
    _, _, (out_type,) = signature(module, graph.name)
    state = "tensor<1x2x6xf32>", "tensor<1x2x6xf32>", "tensor<1x2x6x3xf32>"
    rng = np.random.default_rng(5)
    values = {n: rng.standard_normal(graph.tensors[n].shape).astype(np.float32) for n in "qkv"}
    states = []
    for device in (0, 1):
        lines = []
        for line in module.splitlines():
            if "shard.process_multi_index" in line:
                line = line.split(" = ")[0] + f" = arith.constant {device} : index"
            elif "shard.all_reduce" in line:  # what follows the state is not read here
                name, rest = line.split(" = shard.all_reduce ")
                value, type_ = rest.split(" ")[0], rest.rsplit(" -> ", 1)[1]
                line = f"{name} = tensor.cast {value} : {type_} to {type_}"
            elif line.strip().startswith("return %sdpa"):
                line = f"  return %sdpa, %row_max, %exp_sum, %weighted : {out_type}, {', '.join(state)}"
            elif line.startswith(f"func.func @{graph.name}("):
                line = line.replace(f"-> {out_type} {{", f"-> ({out_type}, {', '.join(state)}) {{")
            lines.append(line)
        keys = slice(4 * device, 4 * device + 4)
        _, row_max, exp_sum, weighted = run_module("\n".join(lines), graph.name,
                                                   [values["q"], values["k"][:, :, keys], values["v"][:, :, keys]])
        states.append((row_max, exp_sum, weighted))
    # device 1's keys 4..7 come after queries 0..3: those rows are all masked in its block
    assert np.isneginf(states[1][0][:, :, :4]).all() and (states[1][1][:, :, :4] == 0).all()
    global_max = np.maximum(states[0][0], states[1][0])
    factors = [np.exp(m - global_max) for m, _, _ in states]
    total_sum = sum(l * f for (_, l, _), f in zip(states, factors))
    total = sum(o * f[..., None] for (_, _, o), f in zip(states, factors))
    expected = evaluate_graph(graph, values)["sdpa"]
    np.testing.assert_allclose(total / total_sum[..., None], expected, rtol=2e-5, atol=2e-5)

"""Ring attention: queries split over a mesh axis, key/value blocks passed around it by rotating
shifts, the online-softmax state accumulated on the device (`planning/ring_attention.py`).
Proven by the simulator against the unsharded graph, priced step by step against gathering K/V
whole and splitting the keys, chosen by the solver where it pays, and emitted as IR the real
verifiers accept with its shifts."""

from __future__ import annotations

from dataclasses import replace

import re

import numpy as np
import pytest

from autoshard.errors import InputError
from autoshard.graph.evaluate import evaluate_graph
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.mlir import emit_partitioned, verify
from autoshard.models import GraphBuilder
from autoshard.ops.nn import KEY_LOOP, QUERY_LOOP
from autoshard.planning.costs import device_flops, op_cost
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import make_plan
from autoshard.planning.options import ShardingOption as O
from autoshard.planning.plan import Plan, plan_from_json, plan_to_json, validate_plan
from autoshard.planning.report import estimate
from autoshard.planning.ring_attention import ring_pairs, ring_step_pairs
from autoshard.sharding import Sharding as S
from autoshard.sim.program import simulate_program, verify_plan
from autoshard.spmd.program import partition
from support.attention import attention_gradient_graph, attention_inputs, stored_whole
from support.mlir_run import run_module

MESH = Mesh.parse("dp=2,cp=4")
Q, K, V = (2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 16, 6)


def queries_over(*axes: str, ring: str | None = "cp", batch: tuple[str, ...] = ()) -> O:
    loops = [batch, (), axes, (), (), ()]
    return O(tuple(loops), ring)


def attention_graph(causal: bool = False, mask: str | None = None, balanced: int | None = None):
    b = GraphBuilder("ring", "f32")
    q, k, v = (b.input(n, s) for n, s in zip("qkv", (Q, K, V)))
    inputs = [q, k, v]
    if mask is not None:  # broadcast over the batch: [H, S, T]
        inputs.append(b.input("mask", (Q[1], Q[2], K[2]), mask))
    attrs = {"causal": causal} | ({"balanced_over": balanced} if balanced else {})
    b.mark_outputs(b.op("attention", inputs, "sdpa", **attrs))
    return graph_from_json(b.document())


def grouped_graph(seq: int, heads: int, kv_heads: int, causal: bool = True, dtype: str = "bf16", dim: int = 128,
                  stored_split: bool = True) -> dict:
    """Attention over a sequence stored split over cp (queries, keys, values and the result),
    K/V of `kv_heads` repeated to the query heads by views."""
    b = GraphBuilder("ring_choice", dtype)
    q = b.input("q", (1, heads, seq, dim))
    kv = []
    for name in "kv":
        x = b.input(name, (1, kv_heads, seq, dim))
        if kv_heads != heads:
            group = heads // kv_heads
            wide = b.op("broadcast_in_dim", [x], f"{name}.repeat", shape=[1, kv_heads, group, seq, dim],
                        broadcast_dimensions=[0, 1, 3, 4])
            x = b.op("reshape", [wide], f"{name}.grouped", shape=[1, heads, seq, dim])
        kv.append(x)
    b.mark_outputs(b.op("attention", [q, *kv], "sdpa", causal=causal))
    doc = b.document()
    if stored_split:
        doc["constraints"] = [{"tensor": n, "split_axes": [[], [], ["cp"]]} for n in ("q", "k", "v", "sdpa")]
    return doc


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mask", [None, "bool", "f32"])
def test_the_ring_equals_unsharded_attention_and_moves_kv_only_by_shifts(causal, mask):
    graph = attention_graph(causal, mask)
    for option in (queries_over("cp"), queries_over("dp", "cp"), queries_over("cp", "dp"),
                   queries_over("cp", batch=("dp",))):
        plan = Plan(graph, MESH, {"sdpa": option}, stored_whole(graph))
        program = partition(plan)
        verdict = simulate_program(program, attention_inputs(graph))
        assert verdict.passed and verdict.max_error < 1e-12, (option, verdict.summary())
        (local,) = program.local_ops()
        # K and V read as each device's own block along the keys; the queries as split
        assert [v.sharding.split_axes[2] for v in local.inputs[1:3]] == [("cp",)] * 2
        assert local.inputs[0].sharding.split_axes[2] == option.loop_axes[QUERY_LOOP]
        # nothing is gathered or reduced around the op: K/V only sliced to the device's block
        assert {c.step.kind for c in program.communicates()} <= {"all_slice"}


def test_the_ring_in_the_balanced_causal_layout_equals_unsharded_attention():
    graph = attention_graph(causal=True, balanced=4)
    verdict = verify_plan(Plan(graph, MESH, {"sdpa": queries_over("cp")}, stored_whole(graph)))
    assert verdict.passed and verdict.max_error < 1e-12, verdict.summary()


def test_a_grouped_query_ring_simulates_to_the_reference():
    mesh = Mesh.parse("cp=4")
    graph = graph_from_json(grouped_graph(16, heads=4, kv_heads=2, dtype="f32", dim=8, stored_split=False), mesh)
    keys = {"k.repeat": 3, "v.repeat": 3, "k.grouped": 2, "v.grouped": 2}  # the sequence's loop in each view
    options = {name: O(tuple(("cp",) if l == loop else () for l in range(graph.op_by_name[name].nest.num_loops)))
               for name, loop in keys.items()}
    options["sdpa"] = queries_over("cp")
    storage = {"q": S(((), (), ("cp",))), "k": S(((), (), ("cp",))), "v": S(((), (), ("cp",)))}
    plan = Plan(graph, mesh, options, storage)
    verdict = verify_plan(plan)
    assert verdict.passed and verdict.max_error < 1e-12, verdict.summary()
    assert not partition(plan).communicates()  # every block where it is stored: the ring moves the rest


def gradient_graph(causal: bool, mask: str | None = None):
    return attention_gradient_graph("ring_grad", (Q, K, V), causal, mask)


@pytest.mark.parametrize("causal, mask", [(False, None), (True, None), (True, "bool"), (True, "f32")])
def test_ring_gradients_equal_unsharded_gradients_and_bring_dk_dv_home(causal, mask):
    graph = gradient_graph(causal, mask)
    found = attention_inputs(graph)
    found["dy"] = np.random.default_rng(1).standard_normal((2, 4, 16, 6))
    for option, partial in ((queries_over("cp"), ()), (queries_over("dp", "cp"), ("dp",))):
        plan = Plan(graph, MESH, {op.name: option for op in graph.ops}, stored_whole(graph))
        program = partition(plan)
        verdict = simulate_program(program, found)
        assert verdict.passed and verdict.max_error < 1e-12, (option, verdict.summary())
        produced = {op.op.name: op.outputs[0].sharding for op in program.local_ops()}
        # dq whole on the device's queries; dk, dv its own keys' rows, whole over the ring (partial
        # only over another axis splitting the queries)
        assert produced["dq"] == S(((), (), option.loop_axes[QUERY_LOOP]))
        assert produced["dk"] == produced["dv"] == S(((), (), ("cp",)), partial)
        reduced = sorted(c.input.tensor for c in program.communicates() if c.step.kind == "all_reduce")
        assert reduced == (["dk", "dv"] if partial else [])
        assert not [c for c in program.communicates() if c.step.kind == "all_gather"]


def test_a_ring_gradient_is_priced_as_two_passes_with_its_accumulator_travelling_home():
    """One head at 16k tokens: the shifts outlast every step, so each pass is n - 1 transfers and
    the last step's compute; dk's pass also shifts its accumulator, then takes it home."""
    mesh = Mesh.parse("cp=8")
    hw = bind_hardware("dgx-h100", mesh)
    b = GraphBuilder("ring_grad_price", "bf16")
    q, k, v = (b.input(n, (1, 1, 16384, 128)) for n in "qkv")
    dy = b.input("dy", (1, 1, 16384, 128))
    b.mark_outputs(*(b.op("grad", [q, k, v, dy], f"d{n}", of="attention", wrt=w, forward={"causal": True})
                     for w, n in enumerate("qkv")))
    graph = graph_from_json(b.document(), mesh)
    shift = hw.collective_seconds("shift", ("cp",), 2048 * 128 * 2)  # a block of K, V or an accumulator
    rate = hw.peak_flops("bf16") * hw.matmul_efficiency("bf16")
    read_s = (2048 + 2048) * 256 * 2 / hw.hbm_bytes_per_s
    last = 2048 * 2048  # the last step: some device's full block below the diagonal
    ring = queries_over("cp")
    for name, travelling in (("dq", 0), ("dk", 1), ("dv", 1)):
        op = graph.op_by_name[name]
        per_pair = device_flops(op, ring, mesh) / sum(pairs for pairs in ring_pairs(op, ring, mesh)[-1])
        statistics = 7 * 2 * shift + max((2 * 256 + 5) * last / rate, read_s)
        gradient = 7 * (2 + travelling) * shift + max(per_pair * last / rate, read_s)
        assert op_cost(graph, op, ring, mesh, hw).seconds == pytest.approx(statistics + gradient + travelling * shift,
                                                                           rel=1e-6), name


def test_a_ring_that_does_not_fit_is_refused_naming_the_field():
    graph = attention_graph()
    bad = {"an axis the queries are not split over": (queries_over("dp", ring="cp"), "must split the queries"),
           "the keys split as well": (O(((), (), ("dp",), (), ("cp",), ()), "dp"), "walks the whole key loop"),
           "an unknown axis": (queries_over("cp", ring="tp"), "unknown ring axis")}
    for what, (option, message) in bad.items():
        with pytest.raises(InputError) as error:
            validate_plan(Plan(graph, MESH, {"sdpa": option}, stored_whole(graph)))
        assert error.value.problems[0].where == "/ops/sdpa/ring" and message in str(error.value), what


def test_a_plan_document_keeps_the_ring():
    graph = attention_graph(causal=True)
    plan = Plan(graph, MESH, {"sdpa": queries_over("cp")}, stored_whole(graph))
    document = plan_to_json(plan)
    assert document["ops"]["sdpa"] == {"kind": "attention", "option": [[], [], ["cp"], [], [], []], "ring": "cp"}
    assert plan_from_json(document, graph, MESH).options["sdpa"] == queries_over("cp")
    document["ops"]["sdpa"]["ring"] = ["cp"]
    with pytest.raises(InputError) as error:
        plan_from_json(document, graph, MESH)
    assert error.value.problems[0].where == "/ops/sdpa/ring"


@pytest.mark.parametrize("dialect", ["mesh", "shard"])
def test_the_partitioned_ir_of_a_ring_verifies_with_its_shifts(dialect):
    graph = attention_graph(causal=True, mask="bool")
    text = emit_partitioned(Plan(graph, MESH, {"sdpa": queries_over("cp")}, stored_whole(graph)), dialect)
    verify(text, dialect)
    shifts = [line.strip() for line in text.splitlines() if f"{dialect}.shift" in line]
    # n - 1 = 3 steps, each passing K and V one place along cp (mesh axis 1), rotating
    assert [s.split(" = ")[0] for s in shifts] == ["%k_ring", "%v_ring", "%k_ring_1", "%v_ring_1", "%k_ring_2",
                                                    "%v_ring_2"]
    assert all("shift_axis = 1 offset = 1 rotate" in s for s in shifts)
    assert f"{dialect}.all_reduce" not in text and f"{dialect}.all_gather" not in text
    # each step's mask columns and causal positions from the key block the device holds: (c - j) mod 4
    assert text.count("tensor.extract_slice %mask_1[0, 0, %ring_start") == 4


def test_each_devices_ring_run_by_mlir_runner_gives_its_rows_of_the_reference():
    """The partitioned module of a causal ring over cp=2, run once per device by mlir-runner (its
    index a constant; the one shift of K and of V reading the other device's block, which the
    shift delivers there): each device's result is its queries' rows of the reference."""
    mesh = Mesh.parse("cp=2")
    b = GraphBuilder("ring_run", "f32")
    q, k, v = (b.input(n, s) for n, s in zip("qkv", ((1, 2, 6, 4), (1, 2, 8, 4), (1, 2, 8, 3))))
    b.mark_outputs(b.op("attention", [q, k, v], "sdpa", causal=True))
    graph = graph_from_json(b.document())
    storage = {n: S(((), (), ("cp",))) for n in "qkv"}
    module = emit_partitioned(Plan(graph, mesh, {"sdpa": queries_over("cp")}, storage), "shard")
    shift = re.compile(r"^(\s*)%(k|v)_ring = shard\.shift %[\w.]+ on @mesh .* : (tensor<[^>]*>) -> tensor<[^>]*>$")
    rng = np.random.default_rng(7)
    values = {n: rng.standard_normal(graph.tensors[n].shape).astype(np.float32) for n in "qkv"}
    expected = evaluate_graph(graph, values)["sdpa"]
    block = {"q": 3, "k": 4, "v": 4}
    own = lambda name, device: values[name][:, :, block[name] * device:block[name] * (device + 1)]  # noqa: E731
    for device in (0, 1):
        lines, types = [], {}
        for line in module.splitlines():
            found = shift.match(line)
            if "shard.process_multi_index" in line:
                line = line.split(" = ")[0] + f" = arith.constant {device} : index"
            elif found:
                indent, name, type_ = found.groups()
                types[name] = type_
                line = f"{indent}%{name}_ring = tensor.cast %{name}_next : {type_} to {type_}"
            lines.append(line)
        assert sorted(types) == ["k", "v"]
        text = "\n".join(lines).replace(") -> tensor", f", %k_next: {types['k']}, %v_next: {types['v']}) -> tensor", 1)
        (got,) = run_module(text, graph.name, [own("q", device), own("k", device), own("v", device),
                                               own("k", 1 - device), own("v", 1 - device)])
        np.testing.assert_allclose(got, expected[:, :, 3 * device:3 * device + 3], rtol=2e-5, atol=2e-5)


def test_the_partitioned_ir_of_ring_gradients_verifies_and_brings_dk_dv_home():
    graph = gradient_graph(causal=True)
    plan = Plan(graph, MESH, {op.name: queries_over("dp", "cp") for op in graph.ops}, stored_whole(graph))
    for dialect in ("mesh", "shard"):
        text = emit_partitioned(plan, dialect)
        verify(text, dialect)
    shifted = [line.split(" = ")[0].strip().lstrip("%").rstrip("_0123456789") for line in text.splitlines()
               if "shard.shift" in line]
    # each gradient: two passes of 3 steps shifting K and V; dk's and dv's accumulators 4 times (home)
    assert shifted.count("k_ring") == shifted.count("v_ring") == 3 * 2 * 3
    assert shifted.count("dk_ring") == shifted.count("dv_ring") == 4 and "dq_ring" not in shifted
    reduced = [line.strip() for line in text.splitlines() if "shard.all_reduce" in line]
    # only dk's and dv's partial sums over dp (mesh axis 0), the other axis splitting the queries
    assert [r.split(" = ")[0].lstrip("%").rstrip("_0123456789") for r in reduced] == ["dk", "dv"]
    assert all("grid_axes = [0]" in r for r in reduced)


@pytest.mark.parametrize("seq, heads, kv_heads, hidden", [(131072, 32, 8, True), (16384, 1, 1, False)])
def test_the_ring_is_priced_per_step_as_the_slower_of_its_compute_and_its_transfer(seq, heads, kv_heads, hidden):
    """Llama-3-8B's attention (32 heads, 8 kv heads) at 128k: every shift hides behind a step's
    compute. One head at 16k: the steps are short and the shifts show."""
    mesh = Mesh.parse("cp=8")
    hw = bind_hardware("dgx-h100", mesh)
    graph = graph_from_json(grouped_graph(seq, heads=heads, kv_heads=kv_heads), mesh)
    op = graph.op_by_name["sdpa"]
    ring = queries_over("cp")
    # contiguous causal queries: step 0 each device's own diagonal block, then some device's key
    # block is below the diagonal at every step
    steps = ring_step_pairs(op, ring, mesh)
    cols = seq // 8
    assert steps == [cols * (cols + 1) // 2] + [cols * cols] * 7
    balanced = replace(op, attrs={**op.attrs, "balanced_over": 8})
    assert max(ring_step_pairs(balanced, ring, mesh)) < cols * cols
    # a step's K/V block shifts at kv heads; a step reads a block at the query heads (bf16, d = e = 128)
    transfer = 2 * hw.collective_seconds("shift", ("cp",), kv_heads * cols * 128 * 2)  # K's block, then V's
    read_s = (heads * cols * 256 * 2 * 2) / hw.hbm_bytes_per_s  # a K/V block and 1/8 of the queries and result
    compute = [max(heads * (2 * 128 + 5 + 2 * 128) * pairs / (hw.peak_flops("bf16") * hw.matmul_efficiency("bf16")),
                   read_s) for pairs in steps]
    assert (transfer < min(compute)) == hidden and (transfer > max(compute)) == (not hidden)
    expected = sum(max(c, transfer) for c in compute[:-1]) + compute[-1]  # the last step sends nothing
    assert op_cost(graph, op, ring, mesh, hw).seconds == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(sum(compute) if hidden else 7 * transfer + compute[-1])


def realisations(graph, mesh, hw, storage) -> dict[str, float]:
    """The step of each realisation of the attention (every other op as the solver placed it)."""
    def step(option: O) -> float:
        plan = Plan(graph, mesh, {**placed.options, "sdpa": option}, storage)
        return estimate(plan, hw).step_s
    placed = make_plan(graph, mesh, hw).plan
    return {"ring": step(queries_over("cp")), "all_gather": step(queries_over("cp", ring=None)),
            "key_split": step(O(((), (), (), (), ("cp",), ())))}


@pytest.mark.parametrize("seq, chosen", [(131072, "ring"), (16384, "all_gather")])
def test_the_solver_chooses_the_ring_where_it_pays_and_the_all_gather_where_that_does(seq, chosen):
    """One head (multi-query attention) over a causal sequence stored split over cp, one DGX H100:
    at 128k tokens a step's compute hides its K/V block's shift and the ring saves the gather; at
    16k the steps are short, the n - 1 shifts show, and one all_gather moves the same bytes faster."""
    mesh = Mesh.parse("cp=8")
    hw = bind_hardware("dgx-h100", mesh)
    graph = graph_from_json(grouped_graph(seq, heads=1, kv_heads=1), mesh)
    result = make_plan(graph, mesh, hw)
    option = result.plan.options["sdpa"]
    assert option.loop_axes[QUERY_LOOP] == ("cp",) and not option.loop_axes[KEY_LOOP]
    assert option.ring == ("cp" if chosen == "ring" else None)
    steps = realisations(graph, mesh, hw, result.plan.storage)
    assert min(steps, key=steps.get) == chosen
    assert result.report.step_s == pytest.approx(steps[chosen], rel=1e-9)
    # gathered: K and V made whole on every device (by the cheapest resharding); the ring moves
    # them only inside the op
    whole = {c.input.tensor for c in partition(result.plan, hw.collective_seconds).communicates()
             if c.step.after == S()}
    assert whole == ({"k", "v"} if chosen == "all_gather" else set())


def test_the_cli_writes_the_ring_in_the_plan_and_estimate_reads_it_back(tmp_path, capsys):
    import json

    from autoshard.cli.main import main
    (tmp_path / "g.json").write_text(json.dumps(grouped_graph(131072, heads=1, kv_heads=1)))
    assert main(["plan", str(tmp_path / "g.json"), "--mesh", "cp=8", "--topology", "dgx-h100", "--workers", "1",
                 "--verify", "never", "-o", str(tmp_path / "out")]) == 0
    document = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert (document["ops"]["sdpa"]["option"], document["ops"]["sdpa"]["ring"]) == ([[], [], ["cp"], [], [], []], "cp")
    capsys.readouterr()
    assert main(["estimate", str(tmp_path / "g.json"), "--mesh", "cp=8", "--topology", "dgx-h100",
                 "--plan", str(tmp_path / "out" / "plan.json")]) == 0
    assert "[[], [], [cp], [], [], []] ring cp  1314 us" in capsys.readouterr().out

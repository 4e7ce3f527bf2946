"""Training steps in a named precision: Megatron-LM's mixed precision (bf16 weights and
activations, f32 main gradients, master weights and Adam moments) beside the step as generated
before (`adam32`), with the casts in the graph, the gradient reductions in f32 and the bytes a
parameter costs read from planned memory."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from autoshard.cli.main import main
from autoshard.errors import InputError
from autoshard.graph.builder import GraphBuilder
from autoshard.graph.evaluate import evaluate_graph, random_inputs
from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.mlir import emit_partitioned
from autoshard.mlir.toolchain import verify
from autoshard.models.gpt import GPTConfig, gpt
from autoshard.models.mlp import MLPConfig, mlp
from autoshard.models.training import add_training_step, training_precision
from autoshard.ops.loops import loop_position
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.microbatches import microbatch
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.planning.report import estimate, memory_timeline
from autoshard.planning.roles import dim_labels
from autoshard.sharding import Sharding
from autoshard.sim.microbatch import simulate_microbatched
from autoshard.sim.program import verify_plan
from autoshard.spmd.program import Communicate, partition
from support.mlir_run import run_module, signature

MLP = MLPConfig(layers=2, batch=8, hidden=64, ffn=256)
ONE = Mesh.of(x=1)


def step(precision: str, config: MLPConfig = MLP) -> Graph:
    with training_precision(precision):
        return graph_from_json(mlp(config, training=True))


def weights(graph: Graph) -> list[str]:
    return sorted(graph.gradients)


def plan_of(graph: Graph, mesh: Mesh, batch_axis: str | None, optimizer_axis: str | None) -> Plan:
    """Loops over the batch split over `batch_axis` (data parallelism), the optimizer's loops over
    a parameter's first dim and its state (master weights and moments) over `optimizer_axis` (the
    distributed optimizer); the weights the forward reads stay whole."""
    labels = dim_labels(graph)
    phases = graph.phases
    options = {}
    for op in graph.ops:
        loops = []
        for loop in range(op.nest.num_loops):
            dims = [(labels[op.operands[i]][dim], dim) for i, m in enumerate(op.nest.maps)
                    if (dim := loop_position(m, loop, op.nest.extents)) is not None and dim >= 0]
            if phases[op.name] == "optimizer" and optimizer_axis:
                loops.append((optimizer_axis,) if loop == 0 and op.nest.num_loops == 2 else ())
            else:
                loops.append((batch_axis,) if batch_axis and any(label == "batch" for label, _ in dims) else ())
        options[op.name] = ShardingOption(tuple(loops))
    storage = {}
    for t in graph.tensors.values():
        if t.role == "intermediate":
            continue
        state = t.role == "parameter" and t.name not in graph.gradients
        storage[t.name] = Sharding(tuple((optimizer_axis,) if state and optimizer_axis and dim == 0
                                         else (batch_axis,) if batch_axis and label == "batch" else ()
                                         for dim, label in enumerate(labels[t.name])))
    return Plan(graph, mesh, options, storage)


def state_bytes_per_parameter(graph: Graph, mesh: Mesh, batch_axis: str | None, optimizer_axis: str | None) -> float:
    """Bytes a device holds per parameter at the first step of a 2-microbatch step, less the
    inputs and the first op's result: the weights, master weights and moments as stored and the
    gradients' accumulators (held from the start of the step)."""
    m = microbatch(graph, 2)
    plan = plan_of(m.graph, mesh, batch_axis, optimizer_axis)
    usage, _ = memory_timeline(plan, accumulated=m.accumulated)
    held = m.graph.tensors
    split = mesh.axis_size(batch_axis) if batch_axis else 1
    inputs = sum(t.bytes // (split if t.batch_dim is not None else 1)
                 for t in held.values() if t.role == "input")
    first = held[m.graph.order[0].outputs[0]].bytes // split
    return (int(usage[0]) - inputs - first) / sum(math.prod(held[p].shape) for p in weights(graph))


def test_mixed_precision_keeps_f32_master_weights_and_main_gradients_with_the_casts_in_the_graph():
    graph = step("bf16-mixed")
    assert weights(graph) == ["layer0.w1", "layer0.w2", "layer1.w1", "layer1.w2"]
    for p, g in graph.gradients.items():
        assert graph.tensors[p].dtype == "bf16"  # what the forward and backward read
        assert graph.tensors[g].dtype == "f32"  # the weight gradient's GEMM writes f32
        maker = graph.producers[g]
        assert (maker.kind, maker.attrs["dtype"]) == ("dot_general", "f32")
        assert {graph.tensors[t].dtype for t in maker.inputs} == {"bf16"}
        master = graph.tensors[f"adam.{p}.master"]
        assert (master.role, master.dtype) == ("parameter", "f32")
        new_master = graph.updated_by[master.name]
        new_weight = graph.producers[graph.updated_by[p]]
        assert (new_weight.kind, new_weight.attrs["dtype"], new_weight.inputs) == ("cast", "bf16", (new_master,))
        assert graph.tensors[graph.updated_by[f"adam.{p}.m"]].dtype == "f32"
        assert graph.phases[new_weight.name] == "optimizer"
    forward = {op.name for op in graph.ops if graph.phases[op.name] == "forward"}
    assert {graph.tensors[t].dtype for op in graph.ops if op.name in forward for t in op.outputs} == {"bf16"}


def test_today_s_step_is_the_default_named_adam32_and_fp32_is_all_f32():
    default = mlp(MLP, training=True)
    with training_precision("adam32"):
        assert mlp(MLP, training=True) == default
    graph = graph_from_json(default)
    assert {graph.tensors[g].dtype for g in graph.gradients.values()} == {"bf16"}
    assert not any(name.endswith(".master") for name in graph.tensors)
    full = step("fp32", MLPConfig(layers=2, batch=8, hidden=64, ffn=256, dtype="f32"))
    assert {t.dtype for t in full.tensors.values()} == {"f32"}
    assert full.gradients == graph.gradients and not any(name.endswith(".master") for name in full.tensors)


def test_a_gradient_no_contraction_writes_is_cast_to_f32_in_its_parameter_s_layer():
    """A norm's gain gets its gradient from a `grad` op, which has no result dtype: a cast follows
    it, right behind it, so the backward still runs the layers in reverse order."""
    with training_precision("bf16-mixed"):
        graph = graph_from_json(gpt(GPTConfig(layers=2, hidden=32, heads=2, seq=8, batch=2, vocab=64), training=True))
    g = graph.gradients["layer1.attn_norm.gamma"]
    cast = graph.producers[g]
    assert (cast.kind, cast.attrs["dtype"], graph.tensors[g].dtype) == ("cast", "f32", "f32")
    assert graph.producers[cast.inputs[0]].kind == "grad" and cast.layer == 1
    assert {graph.tensors[g].dtype for g in graph.gradients.values()} == {"f32"}


@pytest.mark.parametrize("precision, expected", [("bf16-mixed", 18), ("adam32", 2 + 2 * 2 + 8)])
def test_a_replicated_plan_holds_18_bytes_per_parameter_in_mixed_precision(precision, expected):
    """Megatron-LM's count: 2 (bf16 weight) + 4 (f32 main gradient) + 4 (master) + 4 + 4 (moments).
    The step as generated before holds 2 + 4 (its bf16 gradient accumulated in f32) + 8."""
    assert state_bytes_per_parameter(step(precision), Mesh.parse("dp=2"), None, None) == expected


@pytest.mark.parametrize("mesh_text, d", [("dp=2", 2), ("dp=4", 4)])
def test_the_distributed_optimizer_holds_6_plus_12_over_d_bytes_per_parameter(mesh_text, d):
    """Master weights and moments split over the d data replicas; the bf16 weights and the f32
    gradient buffer whole on every device."""
    assert state_bytes_per_parameter(step("bf16-mixed"), Mesh.parse(mesh_text), "dp", "dp") == 6 + 12 / d


def test_gradients_are_reduced_in_f32_priced_at_4_bytes_and_emitted_as_f32_collectives():
    graph = step("bf16-mixed")
    mesh = Mesh.parse("dp=2")
    m = microbatch(graph, 2)
    hw = bind_hardware("dgx-h100", mesh)
    gradients = set(graph.gradients.values())
    for optimizer_axis, kind in ((None, "all_reduce"), ("dp", "reduce_scatter")):
        plan = plan_of(m.graph, mesh, "dp", optimizer_axis)
        report = estimate(plan, hw, m)
        reduced = [e for e in report.reshardings if e["tensor"] in gradients]
        assert len(reduced) == len(gradients)
        for entry in reduced:
            elements = math.prod(graph.tensors[entry["tensor"]].shape)
            (reduction,) = [s for s in entry["steps"] if s["kind"] == kind]
            assert reduction["bytes_per_device"] == 4 * elements  # the whole f32 gradient each device holds
            assert entry["runs"] == 1  # once per step, after both microbatches
        program = partition(plan)
        collectives = [item for item in program.body if isinstance(item, Communicate) and item.input.tensor in gradients]
        assert {item.step.kind for item in collectives} == {kind}
        text = emit_partitioned(program)
        lines = [line for line in text.splitlines() if f"mesh.{kind}" in line and "%grad." in line]
        assert len(lines) == len(gradients) and all(line.endswith("xf32>") and "bf16" not in line for line in lines)
        verify(text, "mesh")
        if optimizer_axis:  # the new bf16 weights, computed on each replica's part, are gathered in bf16
            gathers = [line for line in text.splitlines() if "mesh.all_gather" in line and ".new" in line]
            assert gathers and all(line.endswith("xbf16>") for line in gathers)
        verdict = simulate_microbatched(program, m)
        assert verdict.passed, verdict.first_divergence


def test_a_mixed_precision_step_simulates_on_one_batch():
    graph = step("fp16-mixed", MLPConfig(layers=2, batch=8, hidden=16, ffn=32, dtype="f16"))
    verdict = verify_plan(plan_of(graph, Mesh.parse("dp=2,tp=2"), "dp", "tp"))
    assert verdict.passed, verdict.first_divergence


def test_an_unknown_precision_is_refused_naming_it():
    with pytest.raises(InputError, match="must be one of") as error:
        with training_precision("bf16"):
            pass
    assert error.value.problems[0].where == "precision"
    with pytest.raises(InputError, match="'fp8-mixed'"):
        add_training_step(None, "loss", {}, precision="fp8-mixed")  # type: ignore[arg-type]


def test_generate_takes_precision_and_refuses_a_dtype_it_contradicts(tmp_path, capsys):
    out = tmp_path / "g.json"
    assert main(["generate", "mlp", "--layers", "1", "--hidden", "16", "--ffn", "32", "--training",
                 "--precision", "fp16-mixed", "-o", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["tensors"]["layer0.w1"]["dtype"] == "f16"  # --dtype follows the precision
    assert document["tensors"]["adam.layer0.w1.master"]["dtype"] == "f32"
    capsys.readouterr()
    assert main(["generate", "gpt", "--training", "--precision", "bf16-mixed", "--dtype", "f32", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--dtype: --precision bf16-mixed computes in bf16, but --dtype asks for f32" in err
    assert "Traceback" not in err
    assert main(["generate", "mlp", "--precision", "fp32", "-o", str(out)]) == 2
    assert "--precision: sets the precision of the training step; add --training" in capsys.readouterr().err
    assert main(["generate", "mlp", "--training", "--precision", "adam32", "--dtype", "f16", "--layers", "1",
                 "--hidden", "16", "--ffn", "32", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["tensors"]["layer0.w1"]["dtype"] == "f16"


def test_a_contraction_and_a_reduction_written_in_f32_run_as_emitted_mlir():
    """bf16 operands, f32 results: the emitted module, run by LLVM's JIT, gives the graph's values."""
    b = GraphBuilder("f32_results", "bf16")
    lhs, rhs = b.input("lhs", (4, 8)), b.input("rhs", (8, 3))
    product = b.op("dot_general", [lhs, rhs], "product", lhs_contracting_dims=[1], rhs_contracting_dims=[0], dtype="f32")
    total = b.op("reduce_sum", [lhs], "total", dims=[0], dtype="f32")
    b.mark_outputs(product, total)
    graph = graph_from_json(b.document(), ONE)
    assert [graph.tensors[t].dtype for t in graph.outputs] == ["f32", "f32"]
    plan = Plan(graph, ONE, {op.name: ShardingOption.replicated(op.nest.num_loops) for op in graph.ops},
                {name: Sharding() for name in ("lhs", "rhs")})
    module = emit_partitioned(partition(plan), "shard")
    assert "arith.extf" in module
    # multiples of 1/128 below 1: exact in bf16 (numpy has none: the reference would keep what the module
    # rounds), their products exact in f32 but not in bf16
    rng = np.random.default_rng(0)
    inputs = {name: (rng.integers(-127, 128, graph.tensors[name].shape) / 128).astype(np.float32) for name in ("lhs", "rhs")}
    names, _, _ = signature(module, graph.name)
    results = run_module(module, graph.name, [inputs[n] for n in names])
    expected = evaluate_graph(graph, inputs)
    for output, got in zip(graph.outputs, results):
        np.testing.assert_allclose(got, expected[output], rtol=1e-5, err_msg=output)


TORCH_FACTORY = '''
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def make():
    return Net().to(torch.bfloat16), (torch.randn(4, 8, dtype=torch.bfloat16),)


def make_f32():
    return Net(), (torch.randn(4, 8),)
'''


def test_a_torch_module_in_bf16_imports_as_a_mixed_precision_training_step(tmp_path, capsys):
    """A linear layer's weight gradient comes out of its GEMM transposed: the GEMM writes f32 and
    the transpose moves f32, so no cast is needed there either."""
    pytest.importorskip("torch")
    source = tmp_path / "net.py"
    source.write_text(TORCH_FACTORY)
    out = tmp_path / "graph.json"
    assert main(["import", "torch", f"{source}:make", "--training", "--precision", "bf16-mixed", "--batch-dim", "0",
                 "-o", str(out)]) == 0
    graph = graph_from_json(json.loads(out.read_text()))
    assert sorted(graph.gradients) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    for p, g in graph.gradients.items():
        assert (graph.tensors[p].dtype, graph.tensors[g].dtype, graph.tensors[f"adam.{p}.master"].dtype) == ("bf16", "f32", "f32")
        assert graph.producers[g].kind != "cast"
    moved = graph.producers[graph.gradients["fc1.weight"]]
    assert moved.kind == "transpose" and graph.producers[moved.inputs[0]].attrs["dtype"] == "f32"
    mesh = Mesh.parse("dp=2")
    verdict = simulate_microbatched(partition(plan_of(microbatch(graph, 2).graph, mesh, "dp", None)), microbatch(graph, 2))
    assert verdict.passed, verdict.first_divergence
    capsys.readouterr()
    assert main(["import", "torch", f"{source}:make_f32", "--training", "--precision", "bf16-mixed", "-o", str(out)]) == 2
    assert ("--precision: bf16-mixed computes in bf16, but parameter 'fc1.weight' is f32 (4 of 4 are not bf16)"
            in capsys.readouterr().err)
    assert main(["import", "torch", f"{source}:make", "--precision", "fp32", "-o", str(out)]) == 2
    assert "--precision: sets the precision of the training step; add --training" in capsys.readouterr().err


def test_fp16_scales_the_loss_so_small_gradients_survive_and_the_optimizer_unscales():
    """Seeds of 1e-8 flush to zero in f16; times loss.scale 2**15 they do not, and the optimizer's
    unscaled main gradients match the f32 step's gradients. Every gradient's largest magnitude
    is an output for the overflow check."""
    config = MLPConfig(layers=1, batch=8, hidden=16, ffn=32, dtype="f16")
    half = step("fp16-mixed", config)
    full = step("fp32", MLPConfig(layers=1, batch=8, hidden=16, ffn=32, dtype="f32"))
    assert half.tensors["loss.scale"].dtype == "f16" and half.tensors["loss.inverse_scale"].dtype == "f32"
    assert "loss.scale" not in step("bf16-mixed", MLPConfig(layers=1, batch=8, hidden=16, ffn=32)).tensors
    inputs = random_inputs(half, seed=3)
    inputs["labels"] = (inputs["labels"] * 1e-8).astype(np.float16)
    reference = evaluate_graph(full, {name: value.astype(np.float32) for name, value in inputs.items()
                                      if name in full.tensors})
    for scale in (1.0, 2.0**15):
        values = evaluate_graph(half, dict(inputs, **{"loss.scale": np.float16(scale),
                                                      "loss.inverse_scale": np.float32(1 / scale)}))
        for p in weights(half):
            unscaled = values[f"adam.{p}.unscaled"]
            expected = reference[full.gradients[p]]
            assert half.tensors[f"adam.{p}.grad_max"].shape == () and f"adam.{p}.grad_max" in half.outputs
            assert values[f"adam.{p}.grad_max"] == np.max(np.abs(unscaled))
            if scale == 1.0:
                assert np.count_nonzero(unscaled) < 0.05 * unscaled.size  # underflowed in the f16 backward
            else:
                np.testing.assert_allclose(unscaled, expected, rtol=0.05, atol=1e-3 * np.max(np.abs(expected)))

"""Architectures of the transformers library (`support.architectures`), built from small configs
with random weights: the README's table says, for each, which ops stay opaque inside its layers,
whether its forward planned on dp=2,tp=2 (forced to shard) simulates PASS and runs under DTensor
with the unsharded output and exactly the plan's collectives, and whether its training step gives
the unsharded module's gradients and update. These tests measure each row and hold the table to it;
the routed experts of the MoE models are planned as a dense dispatch."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from support.architectures import (ARCHITECTURES, IN_LAYERS, README, Row, build, measure_forward,  # noqa: E402
                                   measure_training, opaque_inside, readme_rows)
from support.dtensor import sharded_plan, simulated_ranks  # noqa: E402
from torch.distributed.tensor import Shard  # noqa: E402

from autoshard.errors import InputError  # noqa: E402
from autoshard.frontends.torch import import_program, parallelize  # noqa: E402
from autoshard.graph.evaluate import evaluate_graph, random_inputs  # noqa: E402
from autoshard.sim.program import verify_plan  # noqa: E402

# architecture -> its experts' weights, which the plan must shard (a replicated MoE proves little)
EXPERT_WEIGHTS = {name: re.compile(r"\.experts\.(gate_up_proj|down_proj)$") for name in ("Mixtral", "OLMoE", "Qwen2-MoE")}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_the_readme_row_of_an_architecture_is_what_it_measures(name):
    forward = measure_forward(name)
    model, _, _ = build(name)
    row = Row(type(model).__name__, opaque_inside(forward.imported), forward.status, measure_training(name))
    assert row.line(name) == readme_rows(README.read_text()).get(name), "python -m support.architectures writes the row"
    if name in EXPERT_WEIGHTS:
        assert row.opaque == "none", f"the routed experts of {name} are planned, not opaque"
        experts = [t for t in forward.imported.parameters if EXPERT_WEIGHTS[name].search(t)]
        assert len(experts) == 2 * 2  # two layers
        for tensor in experts:
            assert any(isinstance(p, Shard) for p in forward.program_on_mesh.stored(tensor).placements), tensor


def test_the_readme_table_lists_every_architecture_tried():
    assert sorted(readme_rows(README.read_text())) == sorted(ARCHITECTURES)


@pytest.mark.parametrize("name", ["BERT", "ViT"])
def test_an_opaque_attention_mask_is_drawn_valid_so_the_simulator_compares_finite_values(name):
    """Their mask of the query rows [1, 1, S, 1] is an opaque op's value, a graph input: drawn as
    any bool, half its rows were masked everywhere and the reference NaN, matched by every
    device's same NaN."""
    model, args, kwargs = build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the mask is opaque
        imported = import_program(torch.export.export(model, args, kwargs).run_decompositions({}), name=name)
    assert any(op.kind == "attention" and len(op.inputs) == 4 for op in imported.graph.ops)
    reference = evaluate_graph(imported.graph, random_inputs(imported.graph))
    assert all(np.isfinite(v).all() for v in reference.values() if v.dtype.kind == "f")
    verdict = verify_plan(sharded_plan(imported.document, "dp=2,tp=2", memory_s_per_byte=1e-9).plan)
    assert verdict.passed and verdict.values_checked > 0 and math.isfinite(verdict.max_error), verdict.summary()


def moe_block():
    """The MoE block of a Mixtral model's first layer (the model sets up its experts'
    implementation and weights), exported alone on tokens [2, 16, 64]."""
    torch.manual_seed(0)
    model, _, _ = ARCHITECTURES["Mixtral"]()
    block = model.model.layers[0].mlp.eval()
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1))
    return block, x, torch.export.export(block, (x,)).run_decompositions({})


def test_routed_experts_import_as_a_dense_dispatch_equal_to_the_routed_one():
    block, x, program = moe_block()
    imported = import_program(program, strict=True)  # nothing opaque
    kinds = {op.kind for op in imported.graph.ops}
    assert {"top_k_values", "top_k_indices", "one_hot"} <= kinds
    consumers = {t: [op for op in imported.graph.ops if t in op.inputs] for t in imported.parameters}
    # the experts' weights reach dense contractions (through a transpose) with the expert loop in them
    for name in ("experts.gate_up_proj", "experts.down_proj"):
        (transpose,) = consumers[name]
        (contraction,) = [op for op in imported.graph.ops if transpose.outputs[0] in op.inputs]
        assert contraction.kind == "dot_general"
    values = {name: program.state_dict[target].detach().numpy() for name, target in imported.parameters.items()}
    values |= {imported.user_inputs[0]: x.numpy()}
    (out,) = imported.outputs
    computed = evaluate_graph(imported.graph, values)[out]
    np.testing.assert_allclose(computed, block(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    # planned with the experts split over the mesh, every device's share computes the same (the simulator)
    result = sharded_plan(imported.document, "dp=2,tp=2", memory_s_per_byte=1e-9)
    for name in ("experts.gate_up_proj", "experts.down_proj"):
        assert result.plan.storage[name].used_axes(), name
    assert verify_plan(result.plan).passed


def test_a_routing_chain_of_another_form_stays_opaque():
    """Counting slots into other bins than the experts is not the routed form: nothing is rewritten."""
    _, _, program = moe_block()
    (histc,) = [n for n in program.graph.nodes if n.op == "call_function" and "histc" in str(n.target)]
    histc.args = (histc.args[0], histc.args[1], histc.args[2], histc.args[3] + 1)
    with pytest.warns(UserWarning, match="kept opaque") as caught:
        imported = import_program(program)
    message = str(caught[0].message)
    assert "grouped_mm_fallback" in message and "sort" in message and "histc" in message
    assert "one_hot" not in {op.kind for op in imported.graph.ops}
    assert "top_k_values" in {op.kind for op in imported.graph.ops}  # the router's topk is a row of its own
    with pytest.raises(InputError, match="grouped_mm_fallback"):
        import_program(program, strict=True)


def test_a_training_step_through_the_routed_experts_gives_the_unsharded_gradients():
    """Autograd runs back through the dense dispatch as planned: the router's and the experts'
    gradients are the routed block's."""
    block, x, program = moe_block()
    result = sharded_plan(import_program(program).document, "dp=2,tp=2", memory_s_per_byte=1e-9)
    labels = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    block.zero_grad()
    loss = (block(x) * labels).sum()
    loss.backward()
    with simulated_ranks("dp=2,tp=2") as mesh:
        program_on_mesh = parallelize(program, result, mesh)
        out = program_on_mesh(x)
        sharded_loss = (out * torch.distributed.tensor.distribute_tensor(labels, mesh, out.placements, src_data_rank=None)).sum()
        sharded_loss.backward()
        got_loss = sharded_loss.full_tensor()._local_tensors[0]
        grads = {n: p.grad.full_tensor()._local_tensors[0] for n, p in program_on_mesh.named_parameters()}
    torch.testing.assert_close(got_loss, loss.detach(), rtol=1e-5, atol=1e-5)
    assert sorted(grads) == ["experts.down_proj", "experts.gate_up_proj", "gate.weight"]
    for name, parameter in block.named_parameters():
        torch.testing.assert_close(grads[name], parameter.grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def test_the_imported_training_step_differentiates_the_router_through_top_k():
    """autoshard's own backward: the router's gradient goes through the top-k values (the picked
    indices, integers, carry none), and the sharded training plan computes what the whole one does."""
    _, _, program = moe_block()
    training = import_program(program, training=True)
    grads_of = {op.attrs.get("of") for op in training.graph.ops if op.kind == "grad"}
    assert "top_k_values" in grads_of
    assert {"gate.weight.new", "experts.gate_up_proj.new", "experts.down_proj.new"} <= set(training.graph.outputs)
    result = sharded_plan(training.document, "dp=2,tp=2", memory_s_per_byte=1e-9)
    assert verify_plan(result.plan).passed


@pytest.mark.parametrize("name", ["Llama", "GPT-NeoX", "OLMoE"])
def test_layers_come_from_the_module_tree_and_backward_and_adam_inherit_them(name):
    torch.manual_seed(0)
    model, args, kwargs = ARCHITECTURES[name]()
    program = torch.export.export(model.train(), args, kwargs).run_decompositions({})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the mask and position bookkeeping outside the layers is opaque
        graph = import_program(program, name=name, training=True).graph
    phases = graph.phases
    for op in graph.ops:
        if phases[op.name] == "forward":
            inside = IN_LAYERS.search(op.module) if op.module else None
            assert op.layer == (int(re.search(r"\.(\d+)(\.|$)", op.module).group(1)) if inside else None), op.name
    for phase in ("backward", "optimizer"):
        assert {op.layer for op in graph.ops if phases[op.name] == phase} >= {0, 1}, phase
    # every parameter of layer 1 is updated by optimizer ops of layer 1 only
    for old, new in graph.updated_by.items():
        if re.search(r"layers?\.1\.", old):
            assert graph.producers[new].layer == 1, old

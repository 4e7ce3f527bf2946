"""The proof, in PyTorch itself: modules exported with torch.export, planned by autoshard under a
memory budget below their replicated footprint, and run under DTensor on CPU (every rank of the
fake process group simulated in this process by LocalTensorMode). Outputs must equal the unsharded
module's, and the collectives DTensor issues must be the plan's reshardings: same kinds, same
count, same bytes (within 10%).

DTensor redistributes one mesh dim at a time, so a planned step over several mesh axes is
compared as one collective per axis; bytes are compared as what each device receives under ring
algorithms, which does not depend on the order DTensor picks for those axes. LocalTensorMode
runs the functional collectives themselves (no gloo), so no collective is substituted here.
"""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")

from torch.distributed.tensor.debug import CommDebugMode  # noqa: E402

from support.dtensor import (CollectiveLog, attention_collectives, planned_collectives, sharded_plan,  # noqa: E402
                             simulated_ranks, traffic)
from support.torch_models import examples, exported  # noqa: E402

from autoshard.frontends.torch import import_program, parallelize, tensor_placements  # noqa: E402
from autoshard.delivery.dtensor_placements import PlacementSpec, placement_specs  # noqa: E402

# (model, mesh, objective charge per byte held): the larger charge stores weights sharded and
# gathers them before use (ZeRO-3-like), the smaller one keeps them split (tensor parallel, partial
# sums reduced)
CASES = [
    ("mlp", "tp=4", 1e-8),
    ("mlp", "dp=2,tp=4", 1e-8),
    ("llama_block", "tp=4", 1e-9),
    ("llama_block", "dp=2,tp=2", 1e-9),
    ("gpt", "tp=8", 1e-8),
    ("gpt", "dp=2,tp=4", 4e-9),
]


def linear_weights(graph) -> list[str]:
    return [op.inputs[1] for op in graph.ops if op.kind == "dot_general" and graph.tensors[op.inputs[1]].role == "parameter"]


def unwrap(value):
    """Rank 0's tensor of a value LocalTensorMode holds per rank (all equal for a full tensor)."""
    return value._local_tensors[0] if hasattr(value, "_local_tensors") else value


@pytest.mark.parametrize("name, mesh_text, charge", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_dtensor_runs_the_plan_and_matches_the_unsharded_module(name, mesh_text, charge):
    module, args = examples()[name]
    program = exported(module, args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an opaque op would warn: these modules have none
        imported = import_program(program)
    result = sharded_plan(imported.document, mesh_text, memory_s_per_byte=charge)

    placements = tensor_placements(result.plan)
    weights = linear_weights(imported.graph)
    sharded = [w for w in weights if any(p.is_shard() for p in placements[w])]
    assert sharded == weights, f"replicated linear weights: {sorted(set(weights) - set(sharded))}"

    expected = module(*args)
    with simulated_ranks(mesh_text) as mesh:
        program_on_mesh = parallelize(program, result, mesh)
        for w in weights:  # stored as planned
            assert tuple(program_on_mesh.stored(w).placements) == placements[w]
        with CommDebugMode() as comm, CollectiveLog() as log:
            out = program_on_mesh(*args)
        full = unwrap(out.full_tensor())
    # DTensor's own count agrees with the log, which also records each collective's group and bytes
    assert comm.get_total_counts() == len(log.collectives)
    torch.testing.assert_close(full, expected, rtol=1e-5, atol=1e-5)
    assert program_on_mesh.mismatches == []  # DTensor placed every op's result as planned

    # the plan's reshardings, and the combine or rotations of an attention holding a block of the keys
    planned = traffic(planned_collectives(result) + attention_collectives(result.plan))
    issued = traffic(log.collectives)
    assert sum(count for count, _ in planned.values()) > 0
    assert {k: count for k, (count, _) in issued.items()} == {k: count for k, (count, _) in planned.items()}
    for kind, (_, received) in planned.items():
        assert issued[kind][1] == pytest.approx(received, rel=0.1), kind


def unsharded_gradients(module, args) -> tuple:
    """Random labels, the loss sum(module(args) * labels) and every parameter's gradient of it, unsharded."""
    labels = torch.randn_like(module(*args))
    module.zero_grad()
    loss = (module(*args) * labels).sum()
    loss.backward()
    return labels, loss, {n: p.grad for n, p in module.named_parameters()}


@pytest.mark.parametrize("name, mesh_text", [("mlp", "tp=4"), ("llama_block", "dp=2,tp=2")])
def test_a_training_step_gives_the_unsharded_loss_and_gradients(name, mesh_text, record_property):
    """The forward runs as planned; autograd chooses the backward's collectives (recorded beside
    the plan's forward reshardings, not required to equal anything)."""
    module, args = examples()[name]
    program = exported(module, args)
    result = sharded_plan(import_program(program).document, mesh_text, memory_s_per_byte=1e-9)
    torch.manual_seed(1)
    labels, loss, expected = unsharded_gradients(module, args)

    with simulated_ranks(mesh_text) as mesh:
        program_on_mesh = parallelize(program, result, mesh)
        out = program_on_mesh(*args)
        placed_labels = torch.distributed.tensor.distribute_tensor(labels, mesh, out.placements, src_data_rank=None)
        sharded_loss = (out * placed_labels).sum()
        with CollectiveLog() as backward:
            sharded_loss.backward()
        got_loss = unwrap(sharded_loss.full_tensor())
        grads = {n: unwrap(p.grad.full_tensor()) for n, p in program_on_mesh.named_parameters()}
    torch.testing.assert_close(got_loss, loss.detach(), rtol=1e-5, atol=1e-4)
    assert sorted(grads) == sorted(expected)
    for n, g in grads.items():
        torch.testing.assert_close(g, expected[n], rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
    record_property("forward_plan_collectives", traffic(planned_collectives(result)))
    record_property("backward_collectives", traffic(backward.collectives))


def test_the_training_graph_plan_runs_its_forward():
    """A plan made for the imported training step (`training=True`) runs the forward: its forward
    ops keep their names."""
    module, args = examples()["mlp"]
    program = exported(module, args)
    training = import_program(program, training=True)
    assert len(training.graph.ops) > len(import_program(program).graph.ops)
    result = sharded_plan(training.document, "tp=4", memory_s_per_byte=1e-9)
    with simulated_ranks("tp=4") as mesh:
        out = parallelize(program, result.plan, mesh)(*args)
        full = unwrap(out.full_tensor())
    torch.testing.assert_close(full, module(*args), rtol=1e-5, atol=1e-5)


def test_a_plan_read_back_from_its_document_runs_the_same(tmp_path):
    module, args = examples()["mlp"]
    program = exported(module, args)
    result = sharded_plan(import_program(program).document, "tp=4")
    from autoshard.delivery.document import plan_document
    document = plan_document(result, "dgx-h100")
    again = exported(module, args)  # exported anew: the names are the same
    with simulated_ranks("tp=4") as mesh:
        a = parallelize(program, result.plan, mesh)
        b = parallelize(again, document, mesh)
        for w in linear_weights(result.plan.graph):
            assert a.stored(w).placements == b.stored(w).placements
        out = unwrap(b(*args).full_tensor())
    torch.testing.assert_close(out, module(*args), rtol=1e-5, atol=1e-5)


def test_a_hand_edited_document_for_the_graph_is_refused_naming_the_field():
    """A document made for this graph is read through the plan contract, as the CLI reads it."""
    from autoshard.delivery.document import plan_document
    from autoshard.errors import InputError
    module, args = examples()["mlp"]
    program = exported(module, args)
    document = plan_document(sharded_plan(import_program(program).document, "tp=4"), "dgx-h100")
    document["tensors"] = None
    document["format"] = "autoshard.plan/v0"
    with simulated_ranks("tp=4") as mesh:
        with pytest.raises(InputError) as error:
            parallelize(program, document, mesh)
    assert {"/tensors", "/format"} <= {p.where for p in error.value.problems}


def test_a_mesh_that_is_not_the_plans_is_refused_naming_the_axis():
    from autoshard.errors import InputError
    module, args = examples()["mlp"]
    program = exported(module, args)
    result = sharded_plan(import_program(program).document, "tp=4")
    with simulated_ranks("dp=4") as mesh:
        with pytest.raises(InputError) as error:
            parallelize(program, result.plan, mesh)
    assert "device_mesh/tp" in str(error.value) and "['dp']" in str(error.value)
    assert placement_specs(result.plan.produced("x"), result.plan.mesh, "x") == (PlacementSpec("replicate"),)


class MaskedGroupedAttention(torch.nn.Module):
    """Grouped-query attention (8 heads, 2 kv heads) under a learned additive float mask (a
    position bias, as T5's: its gradient flows through attention's mask input)."""

    def __init__(self, hidden: int = 32, heads: int = 8, kv_heads: int = 2, seq: int = 8):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.wq = torch.nn.Linear(hidden, hidden, bias=False)
        self.wkv = torch.nn.Linear(hidden, 2 * kv_heads * self.head_dim, bias=False)
        self.wo = torch.nn.Linear(hidden, hidden, bias=False)
        self.bias = torch.nn.Parameter(torch.randn(seq, seq))

    def forward(self, x):
        b, s, h = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = (t.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2) for t in self.wkv(x).chunk(2, dim=-1))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.bias, enable_gqa=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, h))


def key_split(plan, keys, queries=(), ring=None):
    """The plan with its attention splitting the key loop over `keys` and the queries over
    `queries`, or passing the keys around `ring` (one of the query axes)."""
    from dataclasses import replace

    from autoshard.ops.nn import KEY_LOOP, QUERY_LOOP
    from autoshard.planning.options import ShardingOption
    attention = next(op for op in plan.graph.ops if op.kind == "attention")
    loops = [()] * attention.nest.num_loops
    loops[KEY_LOOP], loops[QUERY_LOOP] = keys, queries
    return replace(plan, options={**plan.options, attention.name: ShardingOption(tuple(loops), ring)})


# (model, mesh, keys split over, queries split over, ring axis)
KEY_SPLITS = [("llama_block", "cp=2", ("cp",), (), None), ("llama_block", "dp=2,cp=2", ("cp",), ("dp",), None),
              ("llama_block", "dp=2,cp=2", ("dp", "cp"), (), None), ("masked_gqa", "cp=2", ("cp",), (), None),
              ("llama_block", "cp=4", (), ("cp",), "cp"), ("llama_block", "dp=2,cp=2", (), ("dp", "cp"), "cp"),
              ("masked_gqa", "cp=4", (), ("cp",), "cp")]


@pytest.mark.parametrize("name, mesh_text, keys, queries, ring", KEY_SPLITS,
                         ids=[f"{c[0]}-{c[1]}-{'ring_' + c[4] if c[4] else 'keys_' + '_'.join(c[2])}"
                              for c in KEY_SPLITS])
def test_context_parallel_attention_gives_the_unsharded_outputs_and_gradients(name, mesh_text, keys, queries, ring):
    """Context parallelism under DTensor, causal (llama_block) or under a float mask, grouped-query
    heads repeated before attention. A key split: each rank's key block combined by all_reduce max
    then sum over the key axes; the backward's dq summed over them, dk and dv per key block. A
    ring: K/V blocks passed around the ring axis by point-to-point rotations (all_to_all_single
    sending one block to one peer), no all_reduce; the backward passes dk and dv home."""
    torch.manual_seed(0)
    if name in examples():
        module, args = examples()[name]
    else:
        module, args = MaskedGroupedAttention().eval(), (torch.randn(2, 8, 32),)
    program = exported(module, args)
    plan = key_split(sharded_plan(import_program(program).document, mesh_text).plan, keys, queries, ring)
    labels, _, expected = unsharded_gradients(module, args)

    with simulated_ranks(mesh_text) as mesh:
        program_on_mesh = parallelize(program, plan, mesh)
        with CollectiveLog() as log:
            out = program_on_mesh(*args)
        torch.testing.assert_close(unwrap(out.full_tensor()), module(*args), rtol=1e-5, atol=1e-5)
        placed_labels = torch.distributed.tensor.distribute_tensor(labels, mesh, out.placements, src_data_rank=None)
        sharded_loss = (out * placed_labels).sum()
        with CollectiveLog() as backward:
            sharded_loss.backward()
        grads = {n: unwrap(p.grad.full_tensor()) for n, p in program_on_mesh.named_parameters()}
    assert sorted(grads) == sorted(expected)
    for n, g in grads.items():
        torch.testing.assert_close(g, expected[n], rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
    attention = next(op for op in plan.graph.ops if op.kind == "attention")
    reduces = [(c.group_size, c.input_bytes) for c in log.collectives if c.kind == "all_reduce"]
    rotations = [c for c in log.collectives if c.kind == "all_to_all"]
    # what the plans' comparison above counts as the attention's own collectives
    assert traffic([c for c in log.collectives if c.kind in ("all_reduce", "all_to_all")]) == \
        traffic(attention_collectives(plan))
    if ring:  # n - 1 steps, each passing K and V; the backward also takes dk and dv home
        n = plan.mesh.axis_size(ring)
        assert reduces == [] and len(rotations) == 2 * (n - 1)
        assert len([c for c in backward.collectives if c.kind == "all_to_all"]) == 4 * (n - 1) + 2
        return
    # the combine: max of the row maxima [B, H, S/queries], sum of the exponent sums, sum of the
    # weighted values [B, H, S/queries, E]: one all_reduce per key axis each (f32)
    b, h, s, e = attention.nest.extents[:4]
    rows = b * h * s // math.prod(plan.mesh.axis_size(a) for a in queries) * 4
    sizes = [plan.mesh.axis_size(a) for a in keys]
    assert reduces == [(n, size) for size in (rows, rows, rows * e) for n in sizes] and rotations == []


def test_an_uneven_key_split_is_refused_naming_the_attention_op():
    from autoshard.errors import InputError
    module, args = examples()["llama_block"]
    program = exported(module, args)
    plan = key_split(sharded_plan(import_program(program).document, "cp=3").plan, ("cp",))
    attention = next(op for op in plan.graph.ops if op.kind == "attention")
    with simulated_ranks("cp=3") as mesh:
        with pytest.raises(InputError) as error:
            parallelize(program, plan, mesh)(*args)
    assert error.value.problems[0].where == f"/ops/{attention.name}/option"
    assert "8 keys" in str(error.value) and "unevenly" in str(error.value)

"""Rows of the aten table written for the layers of transformers architectures: `select` (BLOOM's
fused query, key and value), `stack` and `repeat_interleave` (GPT-J's and Cohere's rotary),
`baddbmm` (BLOOM's attention scores), `type_as` (Gemma's norms), `index` by a constant list of
positions (Falcon's multi-query key and value), `masked_fill` and `bitwise_not` (DeBERTa-v2's
attention mask), gelu's exact form with `erf`, and `new_empty`, `copy`, `slice_scatter` and an
unsorted `topk` (DeepSeek-V2's attention heads written in two parts, and its router), and
`conv1d` (Whisper's front end, a strided convolution whose input gradient is spread by its stride),
`zeros_like`, `scatter` of a value and `gather` along the last dim (DeepSeek-V3's router), and T5's
position bias: `where`, comparisons with numbers, `min`, `full_like`, `zeros`, and the gradient of
an attention's added mask, and `arange` (the relative positions T5's layers make). Each is lowered to rows of
the op table: the graph computes what PyTorch computes, the FLOPs are the contraction's and the
elementwise ops', and a plan forced to shard splits the new ops, simulates and runs under DTensor
with the unsharded result and the plan's collectives."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.dtensor import CollectiveLog, planned_collectives, sharded_plan, simulated_ranks, traffic  # noqa: E402
from support.torch_models import exported  # noqa: E402
from test_torch_import import graph_inputs  # noqa: E402
from test_torch_training_import import assert_step_is_torchs  # noqa: E402
from torch import nn  # noqa: E402

from autoshard.frontends.torch import import_program, parallelize  # noqa: E402
from autoshard.graph.evaluate import evaluate_graph  # noqa: E402
from autoshard.sim.program import verify_plan  # noqa: E402

B, T, H, D = 4, 8, 4, 8  # batch, tokens, heads, head dim


class Rows(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(H * D, 3 * H * D)
        self.out = nn.Linear(H * D, H * D)
        angles = torch.linspace(0.0, 3.0, T * D // 2).reshape(T, D // 2)
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x).view(B, T, H, 3, D)
        q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]  # select.int
        cos, sin = (f.repeat_interleave(2, dim=-1)[:, None, :] for f in (self.cos, self.sin))

        def rotate(t: torch.Tensor) -> torch.Tensor:  # rotate every two
            turned = torch.stack((-t[..., 1::2], t[..., ::2]), dim=-1).flatten(-2)
            return t * cos + turned * sin
        q, k, v = (t.transpose(1, 2).reshape(B * H, T, D) for t in (rotate(q), rotate(k), v))
        scores = torch.baddbmm(bias, q, k.transpose(1, 2), beta=0.5, alpha=D ** -0.5)
        mixed = torch.bmm(scores.softmax(-1), v).view(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)
        return self.out((mixed.double() * 2).type_as(x))


def module_and_args() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    return Rows().eval(), (torch.randn(B, T, H * D, generator=generator), torch.randn(B * H, 1, T, generator=generator))


def strict_import(module: nn.Module, args: tuple, aten_targets: set[str]):
    """The export of `module` (holding `aten_targets`, the rows under test) and its strict import."""
    program = exported(module, args)
    assert aten_targets <= {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    return program, import_program(program, strict=True)


def assert_computes_and_steps_as_pytorch(module: nn.Module, args: tuple, program, imported) -> None:
    """The imported graph's output is the module's, and its training step autograd's and Adam's."""
    values = evaluate_graph(imported.graph, graph_inputs(imported, program, args))
    np.testing.assert_allclose(values[imported.outputs[0]], module(*args).detach().numpy(), rtol=1e-5, atol=1e-6)
    assert_step_is_torchs(module, args)


def run_on_dp2_tp2(program, result, module: nn.Module, args: tuple):
    """`program` run under DTensor on dp=2,tp=2 as `result` plans: its output is the module's and
    its collectives are the plan's in kind and count; the sharded program and both traffics."""
    with simulated_ranks("dp=2,tp=2") as mesh:
        program_on_mesh = parallelize(program, result, mesh)
        with CollectiveLog() as log:
            out = program_on_mesh(*args)
        full = out.full_tensor()._local_tensors[0]
    torch.testing.assert_close(full, module(*args), rtol=1e-5, atol=1e-6)
    issued, planned = traffic(log.collectives), traffic(planned_collectives(result))
    assert {k: n for k, (n, _) in issued.items()} == {k: n for k, (n, _) in planned.items()}
    return program_on_mesh, issued, planned


def test_the_rows_compute_what_pytorch_computes_with_nothing_opaque():
    module, args = module_and_args()
    program, imported = strict_import(module, args, {"aten.select.int", "aten.stack.default",
                                                     "aten.repeat_interleave.self_int", "aten.baddbmm.default",
                                                     "aten.type_as.default"})
    graph = imported.graph
    values = evaluate_graph(graph, graph_inputs(imported, program, args))
    (out,) = imported.outputs
    np.testing.assert_allclose(values[out], module(*args).detach().numpy(), rtol=1e-5, atol=1e-6)
    # baddbmm: the contraction, its scaling by alpha, the input scaled by beta, added once after
    ops = graph.op_by_name
    assert [ops[n].kind for n in ("baddbmm.bmm", "baddbmm.scaled", "baddbmm.bias", "baddbmm")] == \
        ["batch_matmul", "mul", "mul", "add"]
    assert ops["baddbmm.bmm"].flops() == 2 * B * H * T * T * D
    assert ops["baddbmm.scaled"].flops() == ops["baddbmm"].flops() == B * H * T * T
    # select: a slice of width 1, the dim then dropped; no FLOPs, the selected third's bytes
    assert ops["select.slice"].kind == "slice" and graph.tensors["select"].shape == (B, T, H, D)
    assert ops["select.slice"].flops() == 0 and graph.tensors["select"].bytes == B * T * H * D * 4
    # stack: each piece given a dim of 1, concatenated along it
    assert ops["stack"].kind == "concat" and graph.tensors["stack"].shape == (B, T, H, D // 2, 2)
    # repeat_interleave: a broadcast between two reshapes, each entry twice in place
    assert ops["repeat_interleave.expand"].kind == "broadcast_in_dim"
    assert graph.tensors["repeat_interleave"].shape == (T, D)
    # type_as: a cast back from f64
    assert ops["type_as"].kind == "cast" and graph.tensors[ops["type_as"].inputs[0]].dtype == "f64"
    assert graph.tensors["type_as"].dtype == "f32"


def test_a_plan_that_shards_the_rows_runs_under_dtensor_with_the_plans_collectives():
    module, args = module_and_args()
    program = exported(module, args)
    imported = import_program(program, strict=True)
    result = sharded_plan(imported.document, "dp=2,tp=2", memory_s_per_byte=1e-9)
    assert verify_plan(result.plan).passed
    split = {name for name in ("select.slice", "stack", "baddbmm.bmm", "baddbmm")
             if result.plan.options[name].used_axes()}
    assert split == {"select.slice", "stack", "baddbmm.bmm", "baddbmm"}
    program_on_mesh, issued, planned = run_on_dp2_tp2(program, result, module, args)
    assert program_on_mesh.mismatches == []
    assert {k: b for k, (_, b) in issued.items()} == pytest.approx({k: b for k, (_, b) in planned.items()}, rel=0.1)


class Picks(nn.Module):
    """Positions written in the code pick columns of a projection (Falcon's `qkv[:, :, [-2]]`)."""

    def __init__(self, positions: list[int]):
        super().__init__()
        self.up, self.positions = nn.Linear(8, 6), positions

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x)[:, self.positions] * 2


def test_constant_evenly_spaced_positions_are_a_strided_slice_and_other_picks_stay_opaque():
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    module = Picks([-5, -3, -1]).eval()
    program = exported(module, (x,))
    imported = import_program(program, strict=True)
    index = imported.graph.op_by_name["index"]
    assert index.kind == "slice" and index.attrs["starts"] == [0, 1] and index.attrs["strides"] == [1, 2]
    assert imported.graph.tensors["index"].shape == (4, 3) and index.flops() == 0
    values = evaluate_graph(imported.graph, graph_inputs(imported, program, (x,)))
    np.testing.assert_allclose(values[imported.outputs[0]], module(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shuffled = import_program(exported(Picks([2, 0]).eval(), (x,)))
    assert [n.target for n in shuffled.opaque] == ["index.Tensor"]
    assert "positions [2, 0] are not evenly spaced and ascending" in shuffled.opaque[0].reason and caught


class Masked(nn.Module):
    """Scores masked where a bool mask is false (DeBERTa-v2's `masked_fill(~mask, min)`), gelu's
    exact form (torch's default) and erf."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = nn.functional.gelu(self.up(x)).masked_fill(~mask, -3.0)
        return self.down(torch.erf(y) + y)


def test_masks_exact_gelu_and_erf_compute_and_differentiate_as_pytorch():
    generator = torch.Generator().manual_seed(3)
    torch.manual_seed(0)
    module = Masked().eval()
    args = (torch.randn(4, 8, generator=generator), torch.rand(4, 8, generator=generator) > 0.3)
    program = exported(module, args)
    imported = import_program(program, strict=True)
    ops = imported.graph.op_by_name
    assert ops["bitwise_not"].kind == "compare" and ops["bitwise_not"].attrs["direction"] == "eq"
    assert ops["masked_fill"].kind == "select" and ops["masked_fill"].inputs[:2] == ("bitwise_not", "gelu")
    assert ops["gelu"].kind == "gelu_erf" and ops["erf"].kind == "erf"
    values = evaluate_graph(imported.graph, graph_inputs(imported, program, args) | {"mask": args[1].numpy()})
    np.testing.assert_allclose(values[imported.outputs[0]], module(*args).detach().numpy(), rtol=1e-6, atol=1e-6)
    # the training step's gradients through the mask, erf and gelu are autograd's (to float rounding)
    assert_step_is_torchs(module, args)


class Written(nn.Module):
    """A value made empty and written in two parts (DeepSeek-V2's `q[..., :nope] = q_nope`), then
    an unsorted top-k whose picks are summed, so their order does not matter."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(x)
        out = y.new_empty(4, 12)
        out[:, :8] = y
        out[:, 8:] = y[:, :4] * 2
        picked, _ = torch.topk(out, 3, sorted=False)
        return picked.sum(-1, keepdim=True) * out


def test_a_value_written_in_parts_and_an_unsorted_top_k_compute_and_differentiate_as_pytorch():
    torch.manual_seed(0)
    module, args = Written().eval(), (torch.randn(4, 8, generator=torch.Generator().manual_seed(4)),)
    program, imported = strict_import(module, args, {"aten.new_empty.default", "aten.copy.default",
                                                     "aten.slice_scatter.default"})
    ops = imported.graph.op_by_name
    assert ops["new_empty"].kind == "broadcast_in_dim" and ops["new_empty"].flops() == 0
    assert ops["slice_scatter"].kind == "concat" and ops["slice_scatter.after"].attrs["starts"] == [0, 8]
    assert {op.kind for op in imported.graph.ops} >= {"top_k_values", "top_k_indices"}
    assert_computes_and_steps_as_pytorch(module, args, program, imported)


class FrontEnd(nn.Module):
    """Whisper's front end: two convolutions over time, the second strided, then time-major."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(4, 8, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(8, 8, kernel_size=3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(self.conv2(nn.functional.gelu(self.conv1(x)))).permute(0, 2, 1)


@pytest.mark.parametrize("frames", [16, 15])  # the strides reach the last frame, or leave it out
def test_a_strided_conv1d_computes_differentiates_and_runs_sharded_as_pytorch(frames):
    torch.manual_seed(0)
    module, args = FrontEnd().eval(), (torch.randn(4, 4, frames, generator=torch.Generator().manual_seed(5)),)
    program = exported(module, args)
    imported = import_program(program, strict=True)
    assert [op.kind for op in imported.graph.ops if op.name.endswith(".conv")] == ["conv1d", "conv1d"]
    values = evaluate_graph(imported.graph, graph_inputs(imported, program, args))
    np.testing.assert_allclose(values[imported.outputs[0]], module(*args).detach().numpy(), rtol=1e-5, atol=1e-6)
    step = assert_step_is_torchs(module, args)
    assert "conv1d" in {op.kind for op in step.graph.ops if op.name.startswith("grad.conv1d_1.conv")}
    result = sharded_plan(imported.document, "dp=2,tp=2", memory_s_per_byte=1e-9)
    assert verify_plan(result.plan).passed
    run_on_dp2_tp2(program, result, module, args)


class GroupRouter(nn.Module):
    """DeepSeek-V3's router: expert groups picked by their best score (`scatter` of ones into
    `zeros_like`), the other groups' experts masked, the top experts picked on biased scores and
    their unbiased scores read back by `gather`."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(8, 8)
        self.register_buffer("bias", torch.linspace(-0.1, 0.1, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.gate(x).sigmoid()  # [T, 8 experts] in 4 groups of 2
        biased = scores + self.bias
        group_best = biased.view(-1, 4, 2).amax(-1)
        groups = torch.topk(group_best, 2, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(group_best).scatter(1, groups, 1).bool()
        mask = mask.unsqueeze(-1).expand(-1, 4, 2).reshape(-1, 8)
        picked = torch.topk(biased.masked_fill(~mask, 0.0), 3, dim=-1, sorted=False)[1]
        weights = scores.gather(1, picked)
        return weights.sum(-1, keepdim=True) * scores  # in any order the picks come


def test_a_group_limited_router_computes_and_differentiates_as_pytorch():
    torch.manual_seed(0)
    module, args = GroupRouter().eval(), (torch.randn(6, 8, generator=torch.Generator().manual_seed(6)),)
    program, imported = strict_import(module, args, {"aten.zeros_like.default", "aten.scatter.value",
                                                     "aten.gather.default"})
    ops = imported.graph.op_by_name
    assert ops["gather"].kind == "dot_general" and ops["gather.one_hot"].kind == "one_hot"
    assert ops["scatter"].kind == "select" and ops["scatter.named"].kind == "reduce_max"
    assert ops["zeros_like"].kind == "broadcast_in_dim"
    assert_computes_and_steps_as_pytorch(module, args, program, imported)


class PositionBias(nn.Module):
    """T5's attention: a learned bias per head and clipped relative position (`where`, `gt`, `lt`,
    `min`, `full_like`) added to the scores as the attention's mask, so it trains through it."""

    def __init__(self):
        super().__init__()
        self.qkv, self.bias = nn.Linear(8, 24), nn.Embedding(5, 2)
        self.register_buffer("relative", torch.arange(4)[None, :] - torch.arange(4)[:, None])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.relative
        clipped = torch.where(r.abs() < 2, r.abs(), torch.min(r.abs(), torch.full_like(r, 2)))
        buckets = clipped + (r > 0).long() * 2 + torch.zeros(4, 4, dtype=torch.long)
        bias = self.bias(buckets).permute(2, 0, 1).unsqueeze(0)  # [1, heads, S, T]
        qkv = self.qkv(x).view(2, 4, 3, 2, 4).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias).sum(1)


def test_a_learned_position_bias_computes_and_trains_through_the_attention_mask():
    torch.manual_seed(0)
    module, args = PositionBias().eval(), (torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(7)),)
    program = exported(module, args)
    imported = import_program(program, strict=True)
    kinds = {op.kind for op in imported.graph.ops}
    assert {"select", "compare", "min", "broadcast_in_dim", "attention"} <= kinds
    values = evaluate_graph(imported.graph, graph_inputs(imported, program, args))
    np.testing.assert_allclose(values[imported.outputs[0]], module(*args).detach().numpy(), rtol=1e-5, atol=1e-6)
    step = assert_step_is_torchs(module, args)
    assert any(op.kind == "grad" and op.attrs["of"] == "attention" and op.attrs["wrt"] == 3 for op in step.graph.ops)


class Ranges(nn.Module):
    """Positions made in the forward, as T5's layers make them: relative positions from two
    `arange`s, and evenly spaced numbers with a start and a step scaling the features."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        relative = torch.arange(x.shape[1])[None, :] - torch.arange(x.shape[1], dtype=torch.long)[:, None]
        ramp = torch.arange(0.5, 4.5, 0.5)  # 8 features
        return self.up(x * ramp) + relative.abs().to(x.dtype).sum(-1, keepdim=True)


def test_arange_is_an_iota_scaled_and_shifted_and_runs_sharded_as_pytorch():
    module, args = Ranges().eval(), (torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(8)),)
    program, imported = strict_import(module, args, {"aten.arange.default", "aten.arange.start_step"})
    ops = imported.graph.op_by_name
    ranges = [op for op in imported.graph.ops if op.kind == "iota"]
    assert len(ranges) == 3 and all(op.flops() == 0 for op in ranges)
    assert {imported.graph.tensors[op.outputs[0]].dtype for op in ranges} == {"i64", "f32"}
    scaled = next(op for op in ranges if imported.graph.tensors[op.outputs[0]].dtype == "f32").name
    assert [ops[n].kind for n in ops if n.startswith(scaled.rsplit(".", 1)[0]) and n != scaled] == ["mul", "add"]
    assert_computes_and_steps_as_pytorch(module, args, program, imported)
    result = sharded_plan(imported.document, "dp=2,tp=2", memory_s_per_byte=1e-9)
    assert verify_plan(result.plan).passed
    run_on_dp2_tp2(program, result, module, args)

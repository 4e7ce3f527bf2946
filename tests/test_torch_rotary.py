"""Rotary embeddings as models write them, imported and run under DTensor as planned: a partial
rotary whose pass-through part has zero width (its empty values are dropped, not planned), and a
complex rotary (`polar`, `view_as_complex`, as DeepSeek-V2 writes it), whose complex values are
held as real ones with a trailing dim of 2 and multiplied part by part."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from support.dtensor import sharded_plan, simulated_ranks  # noqa: E402
from torch import nn  # noqa: E402

from autoshard.errors import InputError  # noqa: E402
from autoshard.frontends.torch import import_program, parallelize  # noqa: E402


class PartialRotary(nn.Module):
    """q and k rotated on their first `rotary` features, the rest passed through (GPT-NeoX, Phi):
    with `rotary` equal to the head dim the passed-through part is empty."""

    def __init__(self, hidden: int = 32, heads: int = 4, rotary: int = 8):
        super().__init__()
        self.heads, self.rotary = heads, rotary
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        angles = torch.outer(torch.arange(8.0), 1.0 / 10000 ** (torch.arange(0, rotary, 2.0) / rotary))
        self.register_buffer("cos", torch.cat((angles, angles), -1).cos())
        self.register_buffer("sin", torch.cat((angles, angles), -1).sin())

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        turned, passed = x[..., :self.rotary], x[..., self.rotary:]
        half = self.rotary // 2
        turned = turned * self.cos + torch.cat((-turned[..., half:], turned[..., :half]), -1) * self.sin
        return torch.cat((turned, passed), -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(h, -1))
        o = nn.functional.scaled_dot_product_attention(self.rotate(q), self.rotate(k), v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(b, s, h))


class ComplexRotary(PartialRotary):
    """DeepSeek-V2's rotary: the angles as unit complex numbers (`polar`), q and k's feature pairs
    as complex numbers multiplied by them."""

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        b, n, s, d = x.shape
        angles = torch.atan2(self.sin[:, : d // 2], self.cos[:, : d // 2])
        freqs = torch.polar(torch.ones_like(angles), angles) * 1.0
        pairs = torch.view_as_complex(x.float().reshape(b, n, s, d // 2, 2))
        return torch.view_as_real(pairs * freqs.unsqueeze(0)).flatten(3)


def run_as_planned(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, object]:
    """The module's output computed under DTensor on dp=2,tp=2 as a plan that must shard says."""
    program = torch.export.export(module, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # polar has no row: it is opaque, outside the planned ops
        imported = import_program(program)
    result = sharded_plan(imported.document, "dp=2,tp=2", memory_s_per_byte=1e-9)
    with simulated_ranks("dp=2,tp=2") as mesh:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sharded = parallelize(program, result, mesh)
        out = sharded(x).full_tensor()._local_tensors[0]
    assert sharded.mismatches == []
    assert any(result.plan.storage[w].used_axes() for w in imported.parameters)  # it shards
    return out, imported


def test_a_zero_width_pass_through_is_dropped_and_the_rotary_runs_as_planned():
    torch.manual_seed(0)
    module, x = PartialRotary(rotary=8).eval(), torch.randn(2, 8, 32)  # head dim 8: nothing passed through
    out, imported = run_as_planned(module, x)
    torch.testing.assert_close(out, module(x), rtol=1e-5, atol=1e-5)
    assert imported.opaque == []
    assert all(0 not in t.shape for t in imported.graph.tensors.values())
    # the rotated part, and nothing of the empty one, reaches the attention
    concats = [op for op in imported.graph.ops if op.kind == "concat"]
    assert all(len(op.inputs) == 2 for op in concats) and len(concats) == 2  # the two rotate-half concats


def test_a_partial_rotary_with_a_pass_through_keeps_it():
    torch.manual_seed(0)
    module, x = PartialRotary(rotary=4).eval(), torch.randn(2, 8, 32)
    out, imported = run_as_planned(module, x)
    torch.testing.assert_close(out, module(x), rtol=1e-5, atol=1e-5)
    assert len([op for op in imported.graph.ops if op.kind == "concat"]) == 4


def test_a_complex_rotary_is_multiplied_part_by_part_and_runs_as_planned():
    torch.manual_seed(0)
    module, x = ComplexRotary(rotary=8).eval(), torch.randn(2, 8, 32)
    out, imported = run_as_planned(module, x)
    torch.testing.assert_close(out, module(x), rtol=1e-5, atol=1e-5)
    assert {n.target for n in imported.opaque} <= {"polar.default", "ones_like.default", "atan2.default"}
    # q's and k's complex products are graph ops: parts sliced, multiplied, recombined
    assert sum(op.kind == "sub" and op.name.endswith(".re") for op in imported.graph.ops) == 2
    (freqs,) = [t for t in imported.graph.tensors.values() if t.name == "polar"]
    assert freqs.shape == (8, 4, 2) and freqs.dtype == "f32"  # the complex angles, held as real parts


def test_a_zero_size_argument_is_refused_naming_it():
    module = nn.Linear(4, 4)
    with pytest.raises(InputError) as error:
        import_program(torch.export.export(module, (torch.randn(0, 4),)))
    assert "zero-size" in str(error.value) and error.value.problems[0].where == "/inputs/input"


def test_deepseek_v2_and_a_whole_head_rotary_phi_import():
    """The models the failures were seen on: DeepSeek-V2's complex rotary leaves no complex op
    opaque (its `polar` angles are bookkeeping outside the layers); Phi rotating whole heads
    leaves no op opaque inside its layers."""
    transformers = pytest.importorskip("transformers")
    ids = torch.zeros(2, 16, dtype=torch.long)
    small = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4)
    deepseek = transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(
        **small, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16, first_k_dense_replace=1))
    phi = transformers.PhiForCausalLM(transformers.PhiConfig(**small, partial_rotary_factor=1.0))
    opaque = {}
    for name, model in (("deepseek", deepseek), ("phi", phi)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            imported = import_program(torch.export.export(model.eval(), (ids,), {"use_cache": False}))
        opaque[name] = imported.opaque
    complex_ops = {"mul.Tensor", "view_as_complex.default", "view_as_real.default", "unsqueeze.default"}
    assert not [n for n in opaque["deepseek"] if n.target in complex_ops]
    assert {n.target for n in opaque["deepseek"] if n.module == "model.rotary_emb"} == {"ones_like.default",
                                                                                         "polar.default"}
    assert not [n for n in opaque["phi"] if ".layers." in n.module]


class SumOfNothing(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(x)
        return y + y[..., 8:].sum(-1, keepdim=True)  # a sum over an empty slice: zeros


def test_an_op_reading_an_empty_value_is_computed_by_pytorch_on_an_empty_tensor():
    torch.manual_seed(0)
    module, x = SumOfNothing().eval(), torch.randn(2, 8, 32)
    out, imported = run_as_planned(module, x)
    torch.testing.assert_close(out, module(x), rtol=1e-5, atol=1e-5)
    (node,) = imported.opaque
    assert node.target == "sum.dim_IntList" and "is empty" in node.reason

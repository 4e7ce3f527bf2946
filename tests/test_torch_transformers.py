"""Architectures of the transformers library, built from small configs with random weights
(nothing downloaded): each exports, imports, plans on dp=2,tp=2 and runs under DTensor with the
unsharded model's outputs and the plan's collectives. The README's table says which import with
no opaque op inside their layers and, for the others, which ops stay opaque there; this test
measures both and holds the table to them."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from support.dtensor import CollectiveLog, planned_collectives, sharded_plan, simulated_ranks, traffic  # noqa: E402

from autoshard.frontends.torch import import_program, parallelize  # noqa: E402

README = (Path(__file__).parent.parent / "README.md").read_text()
SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
TOKENS = (torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0)),)

# README name -> (model, example args, example kwargs)
ARCHITECTURES = {
    "Llama": lambda: (transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, num_key_value_heads=2)),
                      TOKENS, {"use_cache": False}),
    "Qwen2": lambda: (transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SMALL, num_key_value_heads=2)),
                      TOKENS, {"use_cache": False}),
    "Mistral": lambda: (transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL, num_key_value_heads=2)),
                        TOKENS, {"use_cache": False}),
    "GPT-2": lambda: (transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4,
                                                                           n_positions=32, bos_token_id=0, eos_token_id=0)),
                      TOKENS, {"use_cache": False}),
    "GPT-NeoX": lambda: (transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**SMALL)), TOKENS, {"use_cache": False}),
    "Mixtral": lambda: (transformers.MixtralForCausalLM(transformers.MixtralConfig(**SMALL, num_key_value_heads=2,
                                                                                   num_local_experts=4,
                                                                                   num_experts_per_tok=2)),
                        TOKENS, {"use_cache": False}),
    "BERT": lambda: (transformers.BertModel(transformers.BertConfig(**SMALL, max_position_embeddings=32)), TOKENS, {}),
    "ViT": lambda: (transformers.ViTModel(transformers.ViTConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                                 num_attention_heads=4, image_size=32, patch_size=8)),
                    (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)),), {}),
}

# a module inside a stack of layers: `model.layers.0.mlp`, `transformer.h.1.attn`, `encoder.layer.0`
IN_LAYERS = re.compile(r"(^|\.)(layers|layer|h|blocks)\.\d+(\.|$)")


def readme_table() -> dict[str, str]:
    """Architecture -> its "opaque ops inside the layers" cell, from the README's table."""
    section = README.split("### Architectures of transformers\n", 1)[1]
    rows = re.findall(r"^\| (.+?) \| `transformers\.\w+` \| (.+?) \|$", section, re.M)
    return {name: cell for name, cell in rows}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_architecture_runs_under_dtensor_as_planned(name):
    torch.manual_seed(0)
    model, args, kwargs = ARCHITECTURES[name]()
    model = model.eval()
    program = torch.export.export(model, args, kwargs).run_decompositions({})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the mask and position bookkeeping outside the layers is opaque
        imported = import_program(program, name=name)
    inside = sorted({n.target.split(".")[0] for n in imported.opaque if IN_LAYERS.search(n.module)})
    cell = readme_table()[name]
    assert cell == ("none" if not inside else ", ".join(f"`{op}`" for op in inside)), name

    result = sharded_plan(imported.document, "dp=2,tp=2", memory_s_per_byte=1e-9)
    expected = model(*args, **kwargs)[0]
    with simulated_ranks("dp=2,tp=2") as mesh:
        program_on_mesh = parallelize(program, result, mesh)
        with CollectiveLog() as log:
            out = program_on_mesh(*args, **kwargs)
        first = out[0] if isinstance(out, tuple) else out
        full = first.full_tensor()._local_tensors[0]
    torch.testing.assert_close(full, expected, rtol=1e-4, atol=1e-5)
    assert program_on_mesh.mismatches == []
    issued, planned = traffic(log.collectives), traffic(planned_collectives(result))
    assert {k: n for k, (n, _) in issued.items()} == {k: n for k, (n, _) in planned.items()}
    assert {k: b for k, (_, b) in issued.items()} == pytest.approx({k: b for k, (_, b) in planned.items()}, rel=0.1)


def test_the_readme_table_lists_every_architecture_tried():
    assert sorted(readme_table()) == sorted(ARCHITECTURES)

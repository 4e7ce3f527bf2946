"""Architectures of the transformers library, built from small configs with random weights
(nothing downloaded), and the measurement of the README's table "Architectures of transformers":
for each, the opaque ops inside its layers, whether its forward runs as planned, and whether its
training step does.

`python -m support.architectures` (from `tests/`) measures every architecture and writes the
table's rows into the README; `tests/test_torch_transformers.py` measures them and holds the
table to the measurement.
"""

from __future__ import annotations

import copy
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import transformers
from torch.distributed.tensor import distribute_tensor

from autoshard.errors import InputError
from autoshard.frontends.torch import ImportedProgram, import_program, parallelize
from autoshard.planning.make_plan import PlanResult
from autoshard.sim.program import verify_plan
from support.dtensor import (CollectiveLog, per_rank_copies, planned_collectives, sharded_plan, simulated_ranks,
                             traffic)
from test_torch_training_import import BETAS, EPS, LR, assert_step_is_torchs

README = Path(__file__).parent.parent.parent / "README.md"
SECTION = "### Architectures of transformers\n"
HEADER = ("| architecture | model class | opaque ops inside the layers | forward | training |\n"
          "| --- | --- | --- | --- | --- |\n")
MESH = "dp=2,tp=2"

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
TOKENS = (torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0)),)
IMAGES = (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)
CAUSAL = {"use_cache": False}
T = transformers
VIT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
# 16 mel bins over 32 frames; the special tokens inside the small vocabulary
WHISPER = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
               encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=16, vocab_size=128,
               pad_token_id=0, bos_token_id=0, eos_token_id=0, decoder_start_token_id=0)
# multi-head latent attention and 4 routed experts (2 per token) after one dense layer
DEEPSEEK = dict(SMALL, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                v_head_dim=16, n_group=1, topk_group=1)

Example = tuple[torch.nn.Module, tuple[torch.Tensor, ...], dict[str, Any]]
# README name -> (model, example args, example kwargs)
ARCHITECTURES: dict[str, Callable[[], Example]] = {
    "Llama": lambda: (T.LlamaForCausalLM(T.LlamaConfig(**SMALL, num_key_value_heads=2)), TOKENS, CAUSAL),
    "Qwen2": lambda: (T.Qwen2ForCausalLM(T.Qwen2Config(**SMALL, num_key_value_heads=2)), TOKENS, CAUSAL),
    "Mistral": lambda: (T.MistralForCausalLM(T.MistralConfig(**SMALL, num_key_value_heads=2)), TOKENS, CAUSAL),
    "GPT-2": lambda: (T.GPT2LMHeadModel(T.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=32,
                                                     bos_token_id=0, eos_token_id=0)), TOKENS, CAUSAL),
    "GPT-NeoX": lambda: (T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**SMALL)), TOKENS, CAUSAL),
    "Mixtral": lambda: (T.MixtralForCausalLM(T.MixtralConfig(**SMALL, num_key_value_heads=2, num_local_experts=4,
                                                             num_experts_per_tok=2)), TOKENS, CAUSAL),
    "Qwen2-MoE": lambda: (T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(**SMALL, num_key_value_heads=2, num_experts=4,
                                                                 num_experts_per_tok=2, moe_intermediate_size=32,
                                                                 shared_expert_intermediate_size=64)), TOKENS, CAUSAL),
    "OLMoE": lambda: (T.OlmoeForCausalLM(T.OlmoeConfig(**SMALL, num_key_value_heads=2, num_experts=4,
                                                       num_experts_per_tok=2)), TOKENS, CAUSAL),
    "BERT": lambda: (T.BertModel(T.BertConfig(**SMALL, max_position_embeddings=32)), TOKENS, {}),
    "ViT": lambda: (T.ViTModel(T.ViTConfig(**VIT)), IMAGES, {}),
    "Phi": lambda: (T.PhiForCausalLM(T.PhiConfig(**SMALL, partial_rotary_factor=0.5)), TOKENS, CAUSAL),
    "StableLM": lambda: (T.StableLmForCausalLM(T.StableLmConfig(**SMALL, num_key_value_heads=2)), TOKENS, CAUSAL),
    "Granite": lambda: (T.GraniteForCausalLM(T.GraniteConfig(**SMALL, num_key_value_heads=2)), TOKENS, CAUSAL),
    "StarCoder2": lambda: (T.Starcoder2ForCausalLM(T.Starcoder2Config(**SMALL, num_key_value_heads=2)), TOKENS, CAUSAL),
    "CLIP vision": lambda: (T.CLIPVisionModel(T.CLIPVisionConfig(**VIT)), IMAGES, {}),
    "Gemma": lambda: (T.GemmaForCausalLM(T.GemmaConfig(**SMALL, num_key_value_heads=2, head_dim=16)), TOKENS, CAUSAL),
    "Gemma 3": lambda: (T.Gemma3ForCausalLM(T.Gemma3TextConfig(**SMALL, num_key_value_heads=2, head_dim=16,
                                                               sliding_window=8)), TOKENS, CAUSAL),
    "Cohere": lambda: (T.CohereForCausalLM(T.CohereConfig(**SMALL, num_key_value_heads=2, eos_token_id=0)), TOKENS, CAUSAL),
    "GPT-J": lambda: (T.GPTJForCausalLM(T.GPTJConfig(vocab_size=128, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                                     n_positions=32, bos_token_id=0, eos_token_id=0)), TOKENS, CAUSAL),
    "BLOOM": lambda: (T.BloomForCausalLM(T.BloomConfig(vocab_size=128, hidden_size=64, n_layer=2, n_head=4)), TOKENS,
                      CAUSAL),
    "Falcon": lambda: (T.FalconForCausalLM(T.FalconConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                                                          num_attention_heads=4)), TOKENS, CAUSAL),
    "Whisper encoder": lambda: (T.WhisperForAudioClassification(T.WhisperConfig(**WHISPER)).encoder,
                                (torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(0)),), {}),
    "DeBERTa-v2": lambda: (T.DebertaV2Model(T.DebertaV2Config(**SMALL, max_position_embeddings=32)), TOKENS, {}),
    "T5": lambda: (T.T5Model(T.T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)),
                   TOKENS, {"decoder_input_ids": TOKENS[0], "use_cache": False}),
    "T5 encoder": lambda: (T.T5EncoderModel(T.T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                                       num_heads=4)), TOKENS, {}),
    "DeepSeek-V2": lambda: (T.DeepseekV2ForCausalLM(T.DeepseekV2Config(**DEEPSEEK, q_lora_rank=None)), TOKENS, CAUSAL),
    "DeepSeek-V3": lambda: (T.DeepseekV3ForCausalLM(T.DeepseekV3Config(**DEEPSEEK, q_lora_rank=32)), TOKENS, CAUSAL),
}

# The training step's loss is on the first output. Where some parameters do not feed it (a
# pooler, the norm of a pooled output), the step is measured on the model as trained without them
TRAINED: dict[str, Callable[[], Example]] = {
    "BERT": lambda: (T.BertModel(T.BertConfig(**SMALL, max_position_embeddings=32), add_pooling_layer=False), TOKENS, {}),
    "ViT": lambda: (T.ViTModel(T.ViTConfig(**VIT), add_pooling_layer=False), IMAGES, {}),
    "CLIP vision": lambda: (T.CLIPVisionModelWithProjection(T.CLIPVisionConfig(**VIT)), IMAGES, {}),
}

# a module inside a stack of layers: `model.layers.0.mlp`, `transformer.h.1.attn`, `encoder.layer.0`
IN_LAYERS = re.compile(r"(^|\.)(layers|layer|h|blocks)\.\d+(\.|$)")
# the aten op named by the refusal of a training step whose gradients would stop at an opaque op
OPAQUE_OP = re.compile(r"^cannot differentiate through opaque op \S+ \((\w+)\.")


@dataclass(frozen=True)
class Row:
    model_class: str
    opaque: str  # the opaque ops inside the layers, or "none"
    forward: str  # "yes", or what differs
    training: str  # "yes", or why not

    def line(self, name: str) -> str:
        return f"| {name} | `transformers.{self.model_class}` | {self.opaque} | {self.forward} | {self.training} |"


@dataclass
class Forward:
    """What running the forward as planned measured, for the tests to look into further."""

    imported: ImportedProgram
    result: PlanResult
    program_on_mesh: Any
    status: str


def build(name: str, trained: bool = False) -> Example:
    torch.manual_seed(0)
    model, args, kwargs = (TRAINED.get(name, ARCHITECTURES[name]) if trained else ARCHITECTURES[name])()
    return model.eval(), args, kwargs


def opaque_inside(imported: ImportedProgram) -> str:
    inside = sorted({n.target.split(".")[0] for n in imported.opaque if IN_LAYERS.search(n.module)})
    return ", ".join(f"`{op}`" for op in inside) or "none"


def measure_forward(name: str) -> Forward:
    """Export, import, plan forced to shard, simulate, and run under DTensor: "yes" when the plan
    simulates PASS and the run gives the unsharded output with exactly the plan's collectives."""
    model, args, kwargs = build(name)
    program = torch.export.export(model, args, kwargs).run_decompositions({})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the mask and position bookkeeping outside the layers is opaque
        imported = import_program(program, name=name)
    result = sharded_plan(imported.document, MESH, memory_s_per_byte=1e-9)
    expected = model(*args, **kwargs)[0]
    with simulated_ranks(MESH) as mesh:
        program_on_mesh = parallelize(program, result, mesh)
        with CollectiveLog() as log:
            out = program_on_mesh(*args, **kwargs)
        full = whole(out[0] if isinstance(out, tuple) else out)
    issued, planned = traffic(log.collectives), traffic(planned_collectives(result))
    counts = ({k: n for k, (n, _) in issued.items()}, {k: n for k, (n, _) in planned.items()})
    received = [{k: b for k, (_, b) in t.items()} for t in (issued, planned)]
    if not verify_plan(result.plan).passed:
        status = "the sharded plan fails the simulation"
    elif not torch.allclose(full, expected, rtol=1e-4, atol=1e-5):
        status = "outputs differ from the unsharded model's"
    elif program_on_mesh.mismatches:
        status = f"DTensor places {len(program_on_mesh.mismatches)} values otherwise than planned"
    elif counts[0] != counts[1] or not all(np.isclose(received[0][k], received[1][k], rtol=0.1) for k in counts[0]):
        status = "collectives other than the plan's: " + ", ".join(f"{n} {k}" for k, n in sorted(counts[0].items())) + \
            " issued, " + ", ".join(f"{n} {k}" for k, n in sorted(counts[1].items())) + " planned"
    else:
        status = "yes"
    return Forward(imported, result, program_on_mesh, status)


def measure_training(name: str) -> str:
    """"yes" when the training step imported with `training=True` gives autograd's gradient of
    every parameter (a tied one once) and torch.optim.Adam's update, and the forward plan run
    under DTensor and differentiated by autograd gives the unsharded module's gradients; else
    what fails."""
    model, args, kwargs = build(name, trained=True)
    try:
        assert_step_is_torchs(copy.deepcopy(model), args, kwargs)
    except InputError as error:
        blocking = sorted({m.group(1) for p in error.problems if (m := OPAQUE_OP.search(p.message))})
        if blocking:
            return "refused: the gradients stop at opaque " + ", ".join(f"`{op}`" for op in blocking)
        return "refused: " + "; ".join(p.message for p in error.problems)
    except AssertionError as error:  # numpy's message names the parameter on the line after its first
        lines = str(error).strip().splitlines()
        return f"the imported step's gradient or update of `{lines[1].strip()}` differs from autograd's or Adam's"

    program = torch.export.export(model, args, kwargs).run_decompositions({})
    model = copy.deepcopy(model)  # stepped on its own: the program holds the weights before the step
    out = model(*args, **kwargs)[0]
    labels = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    model.zero_grad()
    (out * labels).sum().backward()
    torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS, foreach=False).step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = sharded_plan(import_program(program, name=name).document, MESH, memory_s_per_byte=1e-9)
    with simulated_ranks(MESH) as mesh:
        sharded = parallelize(program, result, mesh)
        out = sharded(*args, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        (out * distribute_tensor(labels, mesh, out.placements, src_data_rank=None)).sum().backward()
        grads = {n: whole(p.grad) for n, p in sharded.named_parameters()}
        per_rank_copies(sharded)
        torch.optim.Adam(sharded.parameters(), lr=LR, betas=BETAS, eps=EPS, foreach=False).step()
        updated = {n: whole(p.detach()) for n, p in sharded.named_parameters()}
    expected = {n: p for n, p in model.named_parameters() if p.requires_grad}  # a frozen one is a buffer there
    if sorted(grads) != sorted(expected):
        return "the parameters under DTensor are not the module's"
    scale = max(float(p.grad.abs().max()) for p in expected.values())
    differing = [n for n, g in grads.items() if not torch.allclose(g, expected[n].grad, rtol=1e-4, atol=1e-5 * scale)]
    if differing:
        return f"under DTensor the gradient of `{differing[0]}` differs"
    # Adam's first step moves a weight by about lr times its gradient's sign, which rounding
    # noise does not define: weights whose gradient is noise are left out, as in the import's check
    moved = [n for n, p in expected.items()
             if not torch.allclose(updated[n][sure := p.grad.abs() > 1e-4 * scale], p.detach()[sure], rtol=1e-5,
                                   atol=1e-4 * LR)]
    return f"under DTensor Adam's update of `{moved[0]}` differs" if moved else "yes"


def whole(value: Any) -> torch.Tensor:
    """A DTensor's whole value on the simulated ranks (every rank's, which are the same)."""
    full = value.full_tensor()
    return full._local_tensors[0] if hasattr(full, "_local_tensors") else full


def measure(name: str) -> Row:
    forward = measure_forward(name)
    model, _, _ = build(name)
    return Row(type(model).__name__, opaque_inside(forward.imported), forward.status, measure_training(name))


def readme_rows(text: str) -> dict[str, str]:
    """Architecture -> its line of the README's table."""
    section = text.split(SECTION, 1)[1].split(HEADER, 1)[1]
    return {line.split(" | ")[0][2:]: line for line in section.split("\n\n", 1)[0].splitlines()}


def write_table(text: str, lines: dict[str, str]) -> str:
    """The README with its table's rows replaced by `lines` (architecture -> line), by name."""
    start = text.index(HEADER, text.index(SECTION)) + len(HEADER)
    end = text.index("\n\n", start)
    return text[:start] + "\n".join(lines[name] for name in sorted(lines, key=str.lower)) + text[end:]


if __name__ == "__main__":
    # the architectures named (all by default) measured again; the other rows kept as they are
    names = sys.argv[1:] or sorted(ARCHITECTURES)
    measured = {name: measure(name).line(name) for name in names}
    text = README.read_text()
    kept = {name: line for name, line in readme_rows(text).items() if name in ARCHITECTURES}
    README.write_text(write_table(text, kept | measured))

"""Training steps imported with `training=True` (`autoshard import torch --training`): autoshard's
own backward and Adam, evaluated in numpy, give the gradients PyTorch's autograd gives and the
parameters one step of `torch.optim.Adam` gives, on models whose steps failed to import: GPT-2
(`pow` in its gelu, a tied head), a Llama with a tied head, and strided slices. A tied weight is
one parameter there and under DTensor."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from support.dtensor import sharded_plan, simulated_ranks  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.tensor import distribute_tensor  # noqa: E402

from autoshard.cli.main import main  # noqa: E402
from autoshard.errors import InputError  # noqa: E402
from autoshard.frontends.torch import ImportedProgram, import_program, parallelize  # noqa: E402
from autoshard.graph.evaluate import evaluate_graph  # noqa: E402
from autoshard.graph.schema import graph_from_json  # noqa: E402
from autoshard.sim.program import verify_plan  # noqa: E402

LR, BETAS, EPS = 1e-2, (0.9, 0.999), 1e-8
# Adam's first step in the folded form the imported step takes (autoshard.models.training)
ADAM = {"adam.one_minus_beta1": 1 - BETAS[0], "adam.one_minus_beta2": 1 - BETAS[1],
        "adam.step_size": LR * math.sqrt(1 - BETAS[1]) / (1 - BETAS[0]), "adam.eps_hat": EPS * math.sqrt(1 - BETAS[1])}
IDS = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))


class EveryOther(nn.Module):
    """Strided slices (GPT-J's rotate-every-two, a slice whose stride overshoots the end) and a
    cube (`pow`, as GPT-2's gelu)."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 8)
        self.down = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(x)
        turned = torch.cat((-y[..., 1::2], y[..., ::2]), -1)
        return self.down(turned * y.pow(3)[:, 1::3].sum(1, keepdim=True))


def step_values(imported, program, args: tuple, kwargs: dict | None = None) -> dict[str, np.ndarray]:
    """The inputs of the imported training step: the program's weights and arguments, Adam's
    first step (zero moments), labels, and the values opaque ops compute (run by PyTorch, as when
    a plan runs)."""
    state = program.state_dict | dict(program.constants)
    values = {name: state[target].detach() for name, target in imported.parameters.items()}
    values |= dict(zip(imported.user_inputs, args))
    values |= {name: value for name, value in (kwargs or {}).items() if name in imported.user_inputs}
    values |= {name: torch.tensor(number) for name, (number, _) in imported.scalars.items()}
    with torch.no_grad():
        for step in imported.steps:
            result = step.call(*(values[t] for t in step.inputs))
            for name, value in zip(step.outputs, result if isinstance(result, (tuple, list)) else [result]):
                if name:
                    values[name] = value
    graph = imported.graph
    given = {t: np.asarray(values[t]) for t in graph.tensors if graph.tensors[t].role != "intermediate" and t in values}
    given |= {name: np.float32(value) for name, value in ADAM.items()}
    given |= {t: np.zeros(graph.tensors[t].shape, np.float32) for t in graph.tensors
              if t.startswith("adam.") and graph.tensors[t].role == "parameter"}
    given["labels"] = np.random.default_rng(1).standard_normal(graph.tensors["labels"].shape).astype(np.float32)
    return given


def assert_step_is_torchs(module: nn.Module, args: tuple, kwargs: dict | None = None) -> ImportedProgram:
    """Import the module's training step, evaluate it, and compare its gradients and updated
    parameters with autograd's and torch.optim.Adam's; returns the imported step."""
    kwargs = kwargs or {}
    program = torch.export.export(module, args, kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mask and rotary bookkeeping is opaque: computed by PyTorch
        imported = import_program(program, training=True)
    given = step_values(imported, program, args, kwargs)
    computed = evaluate_graph(imported.graph, given)

    out = module(*args, **kwargs)
    out = out if isinstance(out, torch.Tensor) else out[0]  # the loss is on the first output
    optimizer = torch.optim.Adam(module.parameters(), lr=LR, betas=BETAS, eps=EPS)
    optimizer.zero_grad()
    (out * torch.from_numpy(given["labels"])).sum().backward()
    expected = {name: p.grad.clone() for name, p in module.named_parameters() if p.requires_grad}
    optimizer.step()
    gradients = imported.graph.gradients
    assert sorted(gradients) == sorted(expected)  # a tied weight is one parameter
    scale = max(float(g.abs().max()) for g in expected.values())
    updated = {name: p.detach().numpy() for name, p in module.named_parameters() if p.requires_grad}
    for name, grad in expected.items():
        np.testing.assert_allclose(computed[gradients[name]], grad.numpy(), rtol=1e-4, atol=1e-5 * scale, err_msg=name)
        # Adam's first step moves each weight by about lr times the sign of its gradient; where the
        # gradient is rounding noise the sign is not defined, so those weights are left out
        sure = np.abs(grad.numpy()) > 1e-4 * scale
        np.testing.assert_allclose(computed[f"{name}.new"][sure], updated[name][sure], rtol=1e-5, atol=1e-4 * LR,
                                   err_msg=name)
    return imported


def test_strided_slices_and_pow_have_gradients():
    torch.manual_seed(0)
    module, x = EveryOther(), torch.randn(2, 8, 8)
    imported = assert_step_is_torchs(module, (x,))
    # planned to shard (the gradients of pow and of the strided slices too), every device's share
    # of the step computes the same (the simulator)
    plan = sharded_plan(imported.document, "tp=2", memory_s_per_byte=1e-9).plan
    backward = [op.name for op in plan.graph.ops if op.kind == "grad" or ".spread" in op.name]
    assert any(plan.options[op].used_axes() for op in backward)
    assert verify_plan(plan).passed


SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
# name -> (causal LM with fixed random weights, whether its head is tied to its embedding)
MODELS = {
    "GPT-2": lambda: (transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=32, bos_token_id=0, eos_token_id=0)), True),
    "Llama (tied)": lambda: (transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **SMALL, num_key_value_heads=2, tie_word_embeddings=True)), True),
    "Phi": lambda: (transformers.PhiForCausalLM(transformers.PhiConfig(**SMALL)), False),  # pow in gelu_new
    "StarCoder2": lambda: (transformers.Starcoder2ForCausalLM(transformers.Starcoder2Config(
        **SMALL, num_key_value_heads=2, tie_word_embeddings=True)), True),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_training_step_gives_autograds_gradients_and_adams_update_with_a_tied_head_once(name):
    torch.manual_seed(0)
    model, tied = MODELS[name]()
    model = model.eval()
    assert (model.lm_head.weight is model.get_input_embeddings().weight) == tied
    gradients = assert_step_is_torchs(model, (IDS,), {"use_cache": False}).graph.gradients
    assert ("lm_head.weight" in gradients) != tied  # a tied head is the embedding's parameter


FACTORY = '''
import torch
import transformers


def make():
    config = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=1, n_head=4, n_positions=32, bos_token_id=0,
                                     eos_token_id=0)
    return transformers.GPT2LMHeadModel(config), (torch.zeros(2, 16, dtype=torch.long),), {"use_cache": False}
'''


def test_import_training_writes_one_parameter_and_one_update_for_the_tied_head(tmp_path, capsys):
    (tmp_path / "gpt2.py").write_text(FACTORY)
    out = tmp_path / "step.json"
    assert main(["import", "torch", f"{tmp_path / 'gpt2.py'}:make", "-o", str(out), "--training"]) == 0
    capsys.readouterr()
    graph = graph_from_json(json.loads(out.read_text()))
    parameters = {t.name for t in graph.tensors_with_role("parameter") if not t.name.startswith("adam.")}
    assert "transformer.wte.weight" in parameters and "lm_head.weight" not in parameters
    assert sorted(graph.gradients) == sorted(parameters)
    assert [t for t in graph.outputs if t.startswith("transformer.wte.weight.")] == ["transformer.wte.weight.new"]


class Cumulative(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x).cumsum(-1)  # cumsum has no row: opaque, on the weights' path


def test_a_step_whose_gradient_would_stop_at_an_opaque_op_is_refused_naming_it():
    program = torch.export.export(Cumulative(), (torch.randn(2, 8),))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import_program(program)  # the forward imports, cumsum computed by PyTorch
        with pytest.raises(InputError) as error:
            import_program(program, training=True)
    (problem,) = error.value.problems
    assert problem.where == "/nodes/cumsum" and "cannot differentiate through opaque op cumsum" in problem.message
    assert "['linear']" in problem.message


def test_a_tied_llama_under_dtensor_holds_the_tied_weight_once_and_its_gradient_sums_both_uses():
    """The forward plan run by `parallelize`, differentiated by autograd: the tied weight is one
    DTensor parameter (stored sharded as planned), whose gradient is the unsharded module's."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).eval()
    program = torch.export.export(model, (IDS,), {"use_cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = sharded_plan(import_program(program).document, "dp=2,tp=2", memory_s_per_byte=1e-9)
    assert result.plan.storage["model.embed_tokens.weight"].used_axes()
    labels = torch.randn(2, 16, 128, generator=torch.Generator().manual_seed(2))
    model.zero_grad()
    (model(IDS, use_cache=False).logits * labels).sum().backward()
    with simulated_ranks("dp=2,tp=2") as mesh:
        sharded = parallelize(program, result, mesh)
        out = sharded(IDS, use_cache=False)
        (out * distribute_tensor(labels, mesh, out.placements, src_data_rank=None)).sum().backward()
        grads = {n: p.grad.full_tensor()._local_tensors[0] for n, p in sharded.named_parameters()}
    expected = dict(model.named_parameters())
    assert sorted(grads) == sorted(expected) and "lm_head.weight" not in grads
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[name].grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_a_frozen_parameter_is_an_input_the_step_neither_differentiates_nor_updates():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))
    module[0].weight.requires_grad_(False)
    imported = assert_step_is_torchs(module, (torch.randn(2, 8),))
    graph = imported.graph
    assert graph.tensors["0.weight"].role == "input" and "0.weight" not in graph.gradients
    assert "0.weight.new" not in graph.outputs and "0.bias.new" in graph.outputs


def test_a_tied_embedding_stored_over_two_mesh_axes_is_looked_up_on_one_as_dtensor_runs_it():
    """DTensor's embedding keeps one mask of the ids per placement: a vocabulary split over two
    mesh dims fails inside it. Plans for DTensor (`mesh_order_splits`) split an embedding's
    vocabulary over one axis at most; the table may still be stored over both."""
    import autoshard

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).eval()
    program = torch.export.export(model, (IDS,), {"use_cache": False})
    document = import_program(program).document
    document["constraints"].append({"tensor": "model.embed_tokens.weight", "split_axes": [["dp", "tp"], []]})
    mesh = autoshard.Mesh.parse("dp=2,tp=2")
    graph = autoshard.load_graph(document, mesh)
    result = autoshard.make_plan(graph, mesh, autoshard.bind_hardware("dgx-h100", mesh),
                                 autoshard.SolveSettings(deterministic=True, mesh_order_splits=True))
    assert result.plan.storage["model.embed_tokens.weight"].dim_axes(0) == ("dp", "tp")
    lookups = [op for op in graph.ops if op.kind == "embedding"]
    assert lookups and all(len(result.plan.options[op.name].loop_axes[-1]) <= 1 for op in lookups)
    with simulated_ranks("dp=2,tp=2") as device_mesh:
        out = parallelize(program, result, device_mesh)(IDS, use_cache=False)
        full = out.full_tensor()._local_tensors[0]
    torch.testing.assert_close(full, model(IDS, use_cache=False).logits, rtol=1e-4, atol=1e-5)

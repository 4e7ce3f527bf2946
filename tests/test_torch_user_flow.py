"""The flow a user follows: `autoshard import torch model.py:make` and `autoshard plan` in the
shell, then, in their own script, `parallelize(torch.export.export(model, args), plan, mesh)` on
the program exported plainly (not decomposed). Every path imports one canonical form, so the
CLI's plan applies: the outputs are the unsharded model's and the collectives are the plan's."""

from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from support.dtensor import CollectiveLog, planned_collectives, simulated_ranks, traffic  # noqa: E402
from torch.distributed.tensor import distribute_tensor  # noqa: E402

from autoshard.cli.main import main  # noqa: E402
from autoshard.frontends.torch import import_program, parallelize  # noqa: E402

FACTORY = '''
import torch
import transformers


def make():
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    return transformers.LlamaForCausalLM(config).eval(), (torch.zeros(2, 16, dtype=torch.long),), {"use_cache": False}
'''


def llama() -> torch.nn.Module:
    """Another instance of the factory's model, with other random weights: the plan depends only
    on the program's code and shapes."""
    torch.manual_seed(3)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    return transformers.LlamaForCausalLM(config).eval()


def plan_from_the_shell(folder, *import_flags: str) -> dict:
    """`autoshard import torch model.py:make -o graph.json [flags]`, then `autoshard plan` on dp=2,tp=2."""
    (folder / "model.py").write_text(FACTORY)
    graph = folder / "graph.json"
    assert main(["import", "torch", f"{folder / 'model.py'}:make", "-o", str(graph), *import_flags]) == 0
    assert main(["plan", str(graph), "--mesh", "dp=2,tp=2", "--mesh-order-splits", "--deterministic",
                 "--weights", "time=1,memory_s_per_byte=1e-9", "--verify", "never", "-o", str(folder / "out")]) == 0
    return json.loads((folder / "out" / "plan.json").read_text())


@pytest.fixture(scope="module")
def cli_plan(tmp_path_factory) -> dict:
    return plan_from_the_shell(tmp_path_factory.mktemp("flow"))


def test_the_cli_plan_runs_the_plainly_exported_program_as_planned(cli_plan):
    model = llama()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    program = torch.export.export(model, (ids,), {"use_cache": False})
    assert program.dialect == "TRAINING"  # as exported, not decomposed
    placements = cli_plan["dtensor"]["tensors"]
    assert any("Shard" in str(placements[w]) for w in placements if w.endswith("proj.weight"))  # the plan shards
    expected = model(ids, use_cache=False).logits
    with simulated_ranks("dp=2,tp=2") as mesh:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # mask and rotary bookkeeping outside the layers is opaque
            sharded = parallelize(program, cli_plan, mesh)
        with CollectiveLog() as log:
            out = sharded(ids, use_cache=False)
        full = out.full_tensor()._local_tensors[0]
    torch.testing.assert_close(full, expected, rtol=1e-4, atol=1e-5)
    assert sharded.mismatches == []
    issued, planned = traffic(log.collectives), traffic(planned_collectives(cli_plan))
    assert sum(n for n, _ in planned.values()) > 0
    assert {k: n for k, (n, _) in issued.items()} == {k: n for k, (n, _) in planned.items()}
    assert {k: b for k, (_, b) in issued.items()} == pytest.approx({k: b for k, (_, b) in planned.items()}, rel=0.1)


def test_a_plain_and_a_decomposed_export_import_to_one_graph():
    """Decomposing inside is idempotent: a program the user decomposed is not decomposed again
    (that would renumber its nodes, the names of the plan's ops)."""
    model = llama()
    ids = torch.zeros(2, 16, dtype=torch.long)
    plain = torch.export.export(model, (ids,), {"use_cache": False})
    decomposed = plain.run_decompositions({})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        documents = [import_program(p).document for p in (plain, decomposed)]
        assert import_program(decomposed).program is decomposed
    assert documents[0] == documents[1]


def test_the_cli_training_plan_runs_the_plainly_exported_program_with_the_unsharded_gradients(tmp_path):
    """A plan of the training step (`--training`) runs the forward of the program the user exports;
    autograd's gradients through it are the unsharded model's."""
    plan = plan_from_the_shell(tmp_path, "--training")
    model = llama()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    labels = torch.randn(2, 16, 128, generator=torch.Generator().manual_seed(1))
    program = torch.export.export(model, (ids,), {"use_cache": False})
    model.zero_grad()
    (model(ids, use_cache=False).logits * labels).sum().backward()
    with simulated_ranks("dp=2,tp=2") as mesh:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sharded = parallelize(program, plan, mesh)
        out = sharded(ids, use_cache=False)
        (out * distribute_tensor(labels, mesh, out.placements, src_data_rank=None)).sum().backward()
        grads = {n: p.grad.full_tensor()._local_tensors[0] for n, p in sharded.named_parameters()}
    expected = dict(model.named_parameters())
    assert sorted(grads) == sorted(expected)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[name].grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")

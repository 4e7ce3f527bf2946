"""Importing torch.export programs: the graph computes what the module computes (evaluated in
numpy with the module's own weights), names are the module's, opaque ops are kept replicated with
a warning or refused under strict, and the command line writes the same graph."""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.torch_models import GPT, LlamaBlock, examples, exported  # noqa: E402
from torch import nn  # noqa: E402

import autoshard  # noqa: E402
from autoshard.cli.main import main  # noqa: E402
from autoshard.errors import InputError  # noqa: E402
from autoshard.frontends.torch import import_program  # noqa: E402
from autoshard.graph.evaluate import evaluate_graph  # noqa: E402
from autoshard.mesh import Mesh  # noqa: E402
from autoshard.planning.plan import plan_from_json  # noqa: E402
from autoshard.sim.program import verify_plan  # noqa: E402


def graph_inputs(imported, program, args) -> dict[str, np.ndarray]:
    """The graph's inputs from the program's own weights and the example arguments."""
    state = program.state_dict | dict(program.constants)
    values = {name: state[target].detach().numpy() for name, target in imported.parameters.items()}
    values |= {name: a.numpy() for name, a in zip(imported.user_inputs, args)}
    values |= {name: np.array(value, dtype=np.float32) for name, (value, _) in imported.scalars.items()}
    return values


class Mixed(nn.Module):
    """Ops beyond the test models: addmm, scalars, pow, mean, softmax, layer norm without affine,
    a masked attention with a float mask, conv2d, permute, expand, cumsum (no row: opaque)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.proj = nn.Linear(4, 4)
        self.register_buffer("mask", torch.triu(torch.full((4, 4), -1e9), 1))

    def forward(self, image: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(image).permute(0, 2, 3, 1)  # [N, H, W, C]
        y = torch.addmm(self.proj.bias, y.reshape(-1, 4), self.proj.weight.t()) * 0.5 + 1.0
        y = y.pow(2).mean(dim=0, keepdim=True) - y.softmax(dim=-1)
        q = x.unsqueeze(1).expand(2, 2, 4, 8)
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=self.mask)
        a = torch.nn.functional.layer_norm(a, (8,)) / 3
        return y, a.cumsum(-1)


def test_the_graph_computes_what_the_module_computes():
    torch.manual_seed(0)
    cases = {name: examples()[name] for name in ("llama_block", "gpt")}
    cases["mixed"] = (Mixed().eval(), (torch.randn(2, 3, 4, 4), torch.randn(2, 4, 8)))
    for name, (module, args) in cases.items():
        program = exported(module, args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            imported = import_program(program)
        assert [n.target for n in imported.opaque] == (["cumsum.default"] if name == "mixed" else []), name
        expected = module(*args)
        expected = expected if isinstance(expected, tuple) else (expected,)
        given = graph_inputs(imported, program, args)
        # an opaque op's value is an input (PyTorch computes it when the plan runs): here, an output
        given |= {t: want.detach().numpy() for t, want in zip(imported.outputs, expected) if t not in given
                  and imported.graph.tensors[t].role == "input"}
        values = evaluate_graph(imported.graph, given)
        assert len(imported.outputs) == len(expected)
        for tensor, want in zip(imported.outputs, expected):
            np.testing.assert_allclose(values[tensor], want.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_names_are_the_modules_and_stable_across_exports():
    module, args = examples()["llama_block"]
    imported = import_program(exported(module, args))
    graph = imported.graph
    assert imported.user_inputs == ["x"]
    assert {t.name for t in graph.tensors_with_role("parameter")} == {n for n, _ in module.named_parameters()}
    assert {"cos", "sin"} <= {t.name for t in graph.tensors_with_role("input")}  # buffers are inputs, not trained
    modules = {op.name: op.module for op in graph.ops}
    assert modules["linear"] == "wq" and modules["rms_norm"] == "attention_norm" and modules["linear_6"] == "down"
    assert graph.op_by_name["linear"].kind == "dot_general"
    again = import_program(exported(module, args))
    assert again.document == imported.document

    gpt = import_program(exported(GPT().eval(), (torch.randint(0, 64, (2, 8)),))).graph
    assert "layers.1.qkv.weight" in gpt.tensors and gpt.op_by_name["linear_4.matmul"].module == "layers.1.qkv"


def test_gqa_keys_and_values_are_broadcast_to_the_query_heads():
    module, args = LlamaBlock(hidden=32, heads=4, kv_heads=2).eval(), (torch.randn(2, 8, 32),)
    graph = import_program(exported(module, args)).graph
    attention = next(op for op in graph.ops if op.kind == "attention")
    assert [graph.tensors[t].shape for t in attention.inputs] == [(2, 4, 8, 8)] * 3
    expand = graph.op_by_name[f"{attention.name}.k.expand"]
    assert expand.kind == "broadcast_in_dim" and graph.tensors[expand.outputs[0]].shape == (2, 2, 2, 8, 8)


def test_a_bias_is_added_once_after_a_split_reduction():
    """linear with a bias is a contraction then an add: splitting the contraction's reduction
    leaves a partial sum that is reduced before the bias, never a bias added per device."""
    module, args = nn.Linear(8, 6).eval(), (torch.randn(4, 8),)
    imported = import_program(exported(module, args))
    graph = imported.graph
    assert [op.kind for op in graph.ops] == ["dot_general", "add"]
    matmul, add = graph.ops
    assert add.inputs == (matmul.outputs[0], "bias")
    mesh = Mesh.parse("x=2")
    plan = plan_from_json({"ops": {matmul.name: {"option": [[], [], ["x"]]}, add.name: {"option": [[], []]}}}, graph, mesh)
    assert plan.produced(matmul.outputs[0]).partial_axes == ("x",)
    assert verify_plan(plan).passed


class Scaled(nn.Module):
    """A constant tensor (a plain attribute, lifted by export) under sqrt, and a Python scalar."""

    def __init__(self):
        super().__init__()
        self.scale = torch.tensor([0.25, 1.0, 4.0, 9.0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sqrt(self.scale) * 0.5


def test_constants_and_scalars_carry_their_values_and_verify_with_finite_values():
    module, args = Scaled().eval(), (torch.randn(8, 4),)
    imported = import_program(exported(module, args))
    graph = imported.graph
    carried = {name: t.value for name, t in graph.tensors.items() if t.value is not None}
    (scalar,) = imported.scalars
    assert carried.pop(scalar) == (0.5,) and list(carried.values()) == [(0.25, 1.0, 4.0, 9.0)]
    mesh = Mesh.parse("x=2")
    hardware = autoshard.bind_hardware("dgx-h100", mesh)
    plan = autoshard.make_plan(graph, mesh, hardware, autoshard.SolveSettings(deterministic=True)).plan
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no sqrt of a drawn negative number
        verdict = verify_plan(plan)
    assert verdict.passed and verdict.values_checked > 0, verdict.summary()


def test_opaque_ops_are_replicated_inputs_with_a_warning_or_an_error_under_strict():
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            return self.inner(x).cumsum(0) + x

    module, args = Counting().eval(), (torch.randn(3, 4),)
    program = exported(module, args)
    with pytest.warns(UserWarning, match=r"cumsum \(cumsum.default\)"):
        imported = import_program(program)
    assert [(n.name, n.target) for n in imported.opaque] == [("cumsum", "cumsum.default")]
    assert imported.graph.tensors["cumsum"].role == "input" and imported.graph.tensors["cumsum"].shape == (3, 4)
    (pin,) = [c for c in imported.graph.constraints if c.tensor == "cumsum"]
    assert pin.required and pin.sharding.split_axes == ()
    with pytest.raises(InputError) as error:
        import_program(program, strict=True)
    assert [p.where for p in error.value.problems] == ["/nodes/cumsum"]


def test_symbolic_shapes_are_refused_naming_the_node():
    module, args = examples()["mlp"]
    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(module, args, dynamic_shapes=({0: batch},)).run_decompositions({})
    with pytest.raises(InputError) as error:
        import_program(program)
    assert "symbolic" in str(error.value) and error.value.problems[0].where == "/nodes/x"


def test_training_adds_the_backward_and_adam():
    module, args = examples()["mlp"]
    graph = import_program(exported(module, args), training=True).graph
    params = {n for n, _ in module.named_parameters()}
    assert {f"{p}.new" for p in params} <= set(graph.outputs)
    assert any(op.kind == "dot_general" and op.name.startswith("grad.") for op in graph.ops)


FACTORY = '''
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x, scale):
        return self.fc(x).cumsum(0) * scale

def make():
    return Net(), (torch.randn(2, 8),), {"scale": torch.ones(4)}
'''


def test_import_command_writes_the_graph_and_names_opaque_ops(tmp_path, capsys):
    source = tmp_path / "net.py"
    source.write_text(FACTORY)
    out = tmp_path / "graph.json"
    assert main(["import", "torch", f"{source}:make", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "warning: opaque op cumsum (cumsum.default, in fc" not in printed  # cumsum is called at the top level
    assert "warning: opaque op cumsum (cumsum.default)" in printed and f"wrote {out}" in printed
    document = json.loads(out.read_text())
    assert document["tensors"]["fc.weight"] == {"shape": [4, 8], "dtype": "f32", "role": "parameter"}
    assert document["tensors"]["scale"]["role"] == "input"
    assert main(["import", "torch", f"{source}:make", "-o", str(out), "--strict"]) == 2
    assert "/nodes/cumsum" in capsys.readouterr().err
    assert main(["import", "torch", f"{source}:missing", "-o", str(out)]) == 2
    assert "defines no function 'missing'" in capsys.readouterr().err
    assert main(["import", "torch", str(source), "-o", str(out)]) == 2
    assert "expected FILE.py:FACTORY" in capsys.readouterr().err


def test_without_torch_the_frontend_names_the_extra(monkeypatch):
    from autoshard.frontends.torch.runtime import require_torch
    monkeypatch.setitem(sys.modules, "torch", None)  # what an install without torch sees
    with pytest.raises(InputError) as error:
        require_torch()
    assert "autoshard[torch]" in str(error.value)

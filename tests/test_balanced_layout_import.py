"""The load-balanced causal layout on any graph (`planning/sequence_layout.py`): where the
sequence enters (inputs and parameters linked to attention's sequence dims: token ids, labels,
position tables, masks, rotary tables), checked to be order-agnostic elsewhere, and proven to give
the contiguous graph's values in the stored order: a generated GPT step, a hand-built graph with a
document mask and rotary tables, and a torch module with rotary inputs imported."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest

from autoshard.errors import InputError
from autoshard.graph.builder import GraphBuilder
from autoshard.graph.evaluate import evaluate_graph
from autoshard.graph.schema import graph_from_json
from autoshard.models import GPTConfig, gpt
from autoshard.ops.nn import BALANCED, layout_order
from autoshard.planning.sequence_layout import balance_layout, sequence_entries, to_stored_order


def gpt_values(graph, config: GPTConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = {}
    for t in graph.tensors.values():
        if t.role == "intermediate":
            continue
        if t.name in ("ids", "labels"):
            values[t.name] = rng.integers(0, config.vocab, t.shape).astype(np.int32)
        elif t.name == "loss.token_weight":
            values[t.name] = np.array(1.0 / (config.batch * config.seq))
        else:
            values[t.name] = rng.standard_normal(t.shape) * 0.5
    return values


def test_a_gpt_step_balanced_by_the_transform_stores_its_position_table_in_the_layout_order():
    config = GPTConfig(layers=2, hidden=16, heads=4, kv_heads=2, seq=12, batch=2, vocab=11, dtype="f64")
    plain_doc = gpt(config, training=True)
    plain = graph_from_json(plain_doc)
    balanced = graph_from_json(balance_layout(plain_doc, 3))
    assert {op.attrs.get(BALANCED) for op in balanced.ops if op.kind == "attention"} == {3}
    assert {op.attrs["forward"].get(BALANCED) for op in balanced.ops if op.attrs.get("of") == "attention"} == {3}
    entries = sequence_entries(balanced)
    # the tokens, the labels and the learned position table with its Adam moments (all but the batch's inputs
    # and every parameter of another shape are untouched)
    assert entries == {"ids": [1], "labels": [1], "embed.position": [0], "adam.embed.position.m": [0],
                       "adam.embed.position.v": [0]}
    values = gpt_values(plain, config)
    reference = evaluate_graph(plain, values)
    found = evaluate_graph(balanced, to_stored_order(values, entries, 3))
    order = layout_order(12, 3)
    loss = next(name for name in plain.outputs if "loss" in name)
    assert found[loss] == pytest.approx(float(reference[loss]), rel=1e-12)
    for param, grad in plain.gradients.items():
        want = reference[grad][order] if param == "embed.position" else reference[grad]
        np.testing.assert_allclose(found[balanced.gradients[param]], want, rtol=1e-9, atol=1e-12, err_msg=param)


def masked_rotary_graph(iota_positions: bool = False):
    """x [B, S, D] through q/k/v projections, q and k rotated elementwise by cos/sin tables
    [S, D] (inputs), causal attention with an added document mask [S, S] (input)."""
    b = GraphBuilder("rotary", "f64")
    s, d = 8, 4
    x = b.input("x", (2, s, d), batch_dim=0)
    if iota_positions:  # positions counted in the graph: refused
        cos = b.op("cast", [b.op("iota", [], "positions", shape=[s, d], dimension=0, dtype="i32")], "cos", dtype="f64")
    else:
        cos = b.input("cos", (s, d))
    sin = b.input("sin", (s, d))
    heads = {}
    for name in "qkv":
        y = b.op("matmul", [x, b.parameter(f"{name}.w", (d, d))], name)
        if name != "v":
            y = b.op("add", [b.op("mul", [y, cos], f"{name}.cos"), b.op("mul", [y, sin], f"{name}.sin")], f"{name}.rot")
        heads[name] = b.op("reshape", [y], f"{name}.heads", shape=[2, 1, s, d])
    mask = b.input("mask", (s, s))
    b.mark_outputs(b.op("attention", [heads["q"], heads["k"], heads["v"], mask], "sdpa", causal=True))
    return b.document()


def test_masks_and_rotary_tables_are_fed_in_the_layout_order_and_give_the_contiguous_values():
    plain_doc = masked_rotary_graph()
    balanced = graph_from_json(balance_layout(plain_doc, 2))
    entries = sequence_entries(balanced)
    assert entries == {"x": [1], "cos": [0], "sin": [0], "mask": [0, 1]}
    rng = np.random.default_rng(2)
    plain = graph_from_json(plain_doc)
    values = {t.name: rng.standard_normal(t.shape) for t in plain.tensors.values() if t.role != "intermediate"}
    values["mask"] = np.where(rng.random((8, 8)) < 0.3, -1e9, 0.0)  # a document mask; the diagonal kept
    np.fill_diagonal(values["mask"], 0.0)
    order = layout_order(8, 2)
    found = evaluate_graph(balanced, to_stored_order(values, entries, 2))["sdpa"]
    np.testing.assert_allclose(found, evaluate_graph(plain, values)["sdpa"][:, :, order], rtol=1e-12, atol=1e-12)


def test_a_graph_that_depends_on_the_sequence_order_is_refused_at_the_op():
    with pytest.raises(InputError) as error:
        balance_layout(masked_rotary_graph(iota_positions=True), 2)
    (problem,) = error.value.problems
    assert problem.where == "/ops/0" and "'positions' (iota) counts positions along the sequence" in problem.message
    b = GraphBuilder("shifted", "f32")
    x = b.input("x", (1, 1, 8, 4))
    shifted = b.op("slice", [b.op("pad", [x], "padded", low=[0, 0, 1, 0], high=[0, 0, 0, 0])], "shifted",
                   starts=[0, 0, 0, 0], limits=[1, 1, 8, 4])
    b.mark_outputs(b.op("attention", [shifted, x, x], "sdpa", causal=True))
    with pytest.raises(InputError, match="reads the sequence of .* shifted, strided, windowed or merged"):
        balance_layout(b.document(), 2)
    b = GraphBuilder("merged", "f32")
    x = b.input("x", (2, 8, 4))
    flat = b.op("reshape", [x], "flat", shape=[16, 4])
    b.mark_outputs(flat, b.op("attention", [b.op("reshape", [x], "heads", shape=[2, 1, 8, 4])] * 3, "sdpa",
                              causal=True))
    with pytest.raises(InputError, match="'flat' \\(reshape\\) merges the sequence with another dim"):
        balance_layout(b.document(), 2)


def test_the_layout_errors_name_balanced_over():
    doc = masked_rotary_graph()
    for bad, message in ((3, "2 x 3 equal chunks, which must divide its 8 positions"), (0, "positive integer"),
                         ("2", "positive integer")):
        with pytest.raises(InputError, match=message) as error:
            balance_layout(doc, bad)
        assert [p.where for p in error.value.problems] == ["balanced_over"]
    b = GraphBuilder("full", "f32")
    x = b.input("x", (1, 1, 8, 4))
    b.mark_outputs(b.op("attention", [x, x, x], "sdpa"))
    with pytest.raises(InputError, match="no causal attention") as error:
        balance_layout(b.document(), 2)
    assert [p.where for p in error.value.problems] == ["balanced_over"]
    with pytest.raises(InputError, match="already in the layout balanced over 2") as error:
        balance_layout(balance_layout(doc, 2), 4)
    assert [p.where for p in error.value.problems] == ["balanced_over"]


ROTARY_SOURCE = '''
import torch

class Rotary(torch.nn.Module):
    """Projections, rotary tables given as inputs (cos, sin [S, 4]), causal attention over 2 heads."""
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(8, 8, bias=False) for _ in range(3))

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        def heads(y):
            return y.view(b, s, 2, 4).transpose(1, 2)
        def rotate(y):
            half = torch.cat([-y[..., 2:], y[..., :2]], dim=-1)
            return y * cos + half * sin
        q, k, v = rotate(heads(self.q(x))), rotate(heads(self.k(x))), heads(self.v(x))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(b, s, 8)

def make():
    torch.manual_seed(0)
    angles = torch.arange(16.0)[:, None] * torch.tensor([1.0, 0.1, 1.0, 0.1])
    return Rotary().eval(), (torch.randn(2, 16, 8), angles.cos(), angles.sin()), {}
'''


def test_an_imported_torch_module_with_rotary_inputs_balanced_computes_its_outputs_in_the_layout_order(
        tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from autoshard.cli.main import main
    from autoshard.frontends.torch import export_factory, import_program

    source = tmp_path / "rotary.py"
    source.write_text(ROTARY_SOURCE)
    out = tmp_path / "g.json"
    assert main(["import", "torch", f"{source}:make", "--balanced-over", "4", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    document = json.loads(out.read_text())
    assert [op.get(BALANCED) for op in document["ops"] if op["kind"] == "attention"] == [4]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imported = import_program(export_factory(f"{source}:make"))
    graph = graph_from_json(document)
    entries = sequence_entries(graph)
    x, cos, sin = imported.user_inputs
    assert entries == {x: [1], cos: [0], sin: [0]}
    assert f"feed and store in its order {x} (dim 1), {cos} (dim 0), {sin} (dim 0)" in printed
    module, args, _ = __import__("runpy").run_path(str(source))["make"]()
    values = {name: a.numpy().astype(np.float32) for name, a in zip(imported.user_inputs, args)}
    state = imported.program.state_dict | dict(imported.program.constants)
    values |= {name: state[target].detach().numpy() for name, target in imported.parameters.items()}
    values |= {name: np.array(value, dtype=np.float32) for name, (value, _) in imported.scalars.items()}
    (output,) = imported.outputs
    found = evaluate_graph(graph, to_stored_order(values, entries, 4))[output]
    with torch.no_grad():
        want = module(*args).numpy()
    np.testing.assert_allclose(found, want[:, layout_order(16, 4)], rtol=1e-5, atol=1e-5)
    # the flag's own error names it
    assert main(["import", "torch", f"{source}:make", "--balanced-over", "3", "-o", str(out)]) == 2
    assert "--balanced-over: the layout stores the sequence in 2 x 3 equal chunks" in capsys.readouterr().err


def long_attention(path, heads: int = 1, seq: int = 2048) -> None:
    """Causal attention over `seq` tokens whose q, k, v arrive split over cp along the sequence."""
    b = GraphBuilder("long", "f32")
    q, k, v = (b.input(name, (1, heads, seq, 64)) for name in "qkv")
    b.mark_outputs(b.op("attention", [q, k, v], "sdpa", causal=True))
    document = b.document()
    document["constraints"] = [{"tensor": name, "split_axes": [[], [], ["cp"]]} for name in "qkv"]
    path.write_text(json.dumps(document))


def test_plan_balanced_over_auto_keeps_the_layout_that_pays_and_writes_its_graph(tmp_path, capsys):
    from autoshard.cli.main import main

    long_attention(tmp_path / "g.json")
    out = tmp_path / "out"
    assert main(["plan", str(tmp_path / "g.json"), "--mesh", "cp=4", "--workers", "1", "--verify", "always",
                 "--balanced-over", "auto", "-o", str(out)]) == 0
    said = capsys.readouterr()
    steps = dict(re.findall(r"recompute none, (the sequence in its own order|balanced over 4): step (\S+) s", said.err))
    assert float(steps["balanced over 4"]) < float(steps["the sequence in its own order"])
    plan = json.loads((out / "plan.json").read_text())
    layout = plan["roles"]["sequence_layout"]
    assert (layout["balanced_over"], layout["stored_in_layout_order"]) == (4, {"q": [2], "k": [2], "v": [2]})
    assert layout["attention"]["sdpa"] == {"query_axes": ["cp"], "key_axes": [], "busiest_over_least_work": 1.0}
    assert plan["ops"]["sdpa"]["option"][2] == ["cp"]
    graph = json.loads((out / "graph.json").read_text())
    assert [op.get(BALANCED) for op in graph["ops"]] == [4]
    assert "simulator: PASS" in said.out
    # the readers take the plan with the graph written beside it
    assert main(["simulate", str(out / "graph.json"), "--plan", str(out / "plan.json")]) == 0
    assert "PASS" in capsys.readouterr().out
    # the frameworks run their programs' own attention (masking by index): the plan is refused, named
    pytest.importorskip("torch")
    from autoshard.frontends.torch import parallelize
    with pytest.raises(InputError, match="load-balanced causal layout over 4; autoshard.frontends.torch.parallelize"):
        parallelize(None, plan, None)
    pytest.importorskip("jax")
    from autoshard.frontends.jax import partition_specs
    with pytest.raises(InputError, match="layout over 4; autoshard.frontends.jax.partition_specs runs") as error:
        partition_specs(lambda x: x, plan)
    assert error.value.problems[0].where == "plan"


def test_plan_balanced_over_n_and_its_errors(tmp_path, capsys):
    from autoshard.cli.main import main

    long_attention(tmp_path / "g.json", seq=2044)
    assert main(["plan", str(tmp_path / "g.json"), "--mesh", "cp=4", "--workers", "1", "--balanced-over", "4",
                 "-o", str(tmp_path / "out")]) == 2
    assert ("--balanced-over: the layout stores the sequence in 2 x 4 equal chunks, which must divide its 2044 "
            "positions") in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", str(tmp_path / "g.json"), "--mesh", "cp=4", "--balanced-over", "four"])
    assert "argument --balanced-over: expected a whole number or auto, got 'four'" in capsys.readouterr().err
    # auto on a sequence no axis's layout divides: the own order alone, the layout said and skipped
    out = tmp_path / "auto"
    assert main(["plan", str(tmp_path / "g.json"), "--mesh", "cp=4", "--workers", "1", "--verify", "never",
                 "--balanced-over", "auto", "-o", str(out)]) == 0
    assert "layout balanced over 4: not offered: the layout stores the sequence in 2 x 4" in capsys.readouterr().err
    assert not (out / "graph.json").exists()
    assert "sequence_layout" not in json.loads((out / "plan.json").read_text())["roles"]
    long_attention(tmp_path / "g.json", seq=2048)
    out = tmp_path / "fixed"
    assert main(["plan", str(tmp_path / "g.json"), "--mesh", "cp=4", "--workers", "1", "--verify", "never",
                 "--balanced-over", "2", "-o", str(out)]) == 0
    assert [op.get(BALANCED) for op in json.loads((out / "graph.json").read_text())["ops"]] == [2]

"""`benchmarks/llama3_context.py`: torchtitan's FSDP x CP layout pinned on a generated Llama step holds
what defines it (parameters and optimizer state over fsdp and cp, the sequence over cp, attention's keys
and values whole over cp), and a plan under those pins is exact in the simulator."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from autoshard.cli.main import main

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "llama3_context.py"
spec = importlib.util.spec_from_file_location("llama3_context", SCRIPT)
llama3_context = sys.modules["llama3_context"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(llama3_context)

SMALL = ["generate", "gpt", "--style", "llama", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
         "--ffn", "128", "--seq", "32", "--batch", "2", "--vocab", "64", "--training", "--precision", "bf16-mixed",
         "--balanced-over", "4"]


def small_step(tmp_path: Path) -> dict:
    assert main(SMALL + ["-o", str(tmp_path / "g.json")]) == 0
    return json.loads((tmp_path / "g.json").read_text())


def test_the_pins_name_the_fsdp_and_cp_splits(tmp_path):
    document = small_step(tmp_path)
    pins = {c["tensor"]: c["split_axes"] for c in llama3_context.torchtitan_constraints(document, 2, 4)}
    parameters = [name for name, t in document["tensors"].items()
                  if t.get("role") == "parameter" and not name.startswith("adam.")]
    for name in parameters:
        for held in (name, f"adam.{name}.m", f"adam.{name}.v", f"adam.{name}.master"):
            assert pins[held][0] == ["fsdp", "cp"] and all(not axes for axes in pins[held][1:])
    assert not any(name.startswith("grad.") for name in pins)  # gradients: produced partial, left to the solver
    assert pins["ids"] == pins["labels"] == [["fsdp"], ["cp"]]
    assert pins["layer1.mlp.glu"] == pins["logits"] == [["fsdp"], ["cp"], []]
    assert pins["layer0.attn.q.heads"] == pins["layer0.attn.sdpa"] == [["fsdp"], [], ["cp"], []]
    assert pins["layer0.attn.k.grouped"] == pins["layer0.attn.v.grouped"] == [["fsdp"], [], [], []]
    # an axis of size 1 is absent from the mesh and from every pin
    alone = {c["tensor"]: c["split_axes"] for c in llama3_context.torchtitan_constraints(document, 1, 8)}
    assert alone["ids"] == [[], ["cp"]] and alone["layer0.attn.q.w"] == [["cp"], []]


def test_a_pinned_cp_layout_plans_with_cp_as_the_context_axis_and_simulates_exact(tmp_path):
    document = small_step(tmp_path)
    document["constraints"] = llama3_context.torchtitan_constraints(document, 2, 4)
    (tmp_path / "p.json").write_text(json.dumps(document))
    assert main(["plan", str(tmp_path / "p.json"), "--mesh", "fsdp=2,cp=4", "--topology", "dgx-h100",
                 "--recompute", "full", "--workers", "1", "--time-limit", "20", "--verify", "always",
                 "-o", str(tmp_path / "out")]) == 0
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["verification"]["passed"]
    sdpa = plan["ops"]["layer0.attn.sdpa"]
    assert sdpa["axis_roles"] == {"fsdp": "data", "cp": "context"}
    assert llama3_context.context_axes({"axes": plan["mesh"]["axes"], "roles": plan["roles"]["axes"]}) == ["cp=4"]

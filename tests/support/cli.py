"""A small graph file and `autoshard plan` arguments shared by the CLI tests."""

from __future__ import annotations

import json

BATCH, HIDDEN, FFN = 16, 256, 1024
# An f32 MLP whose weights (1 MiB each) cannot all be held replicated under a 1.5 MiB budget,
# with its output pinned replicated: whatever the split, some collective assembles it.
MLP = {"format": "autoshard.graph/v1", "name": "mlp",
       "tensors": {"x": {"shape": [BATCH, HIDDEN], "dtype": "f32", "role": "input"},
                   "w1": {"shape": [HIDDEN, FFN], "dtype": "f32", "role": "parameter"},
                   "w2": {"shape": [FFN, HIDDEN], "dtype": "f32", "role": "parameter"},
                   "h": {"shape": [BATCH, FFN], "dtype": "f32"}, "a": {"shape": [BATCH, FFN], "dtype": "f32"},
                   "y": {"shape": [BATCH, HIDDEN], "dtype": "f32"}},
       "ops": [{"name": "fc1", "kind": "matmul", "inputs": ["x", "w1"], "outputs": ["h"]},
               {"name": "act", "kind": "gelu", "inputs": ["h"], "outputs": ["a"]},
               {"name": "fc2", "kind": "matmul", "inputs": ["a", "w2"], "outputs": ["y"]}],
       "outputs": ["y"], "constraints": [{"tensor": "y", "split_axes": [], "required": True}]}


def mlp_graph(path) -> str:
    """`MLP` written to a file in `path`."""
    file = path / "mlp.json"
    file.write_text(json.dumps(MLP))
    return str(file)


def plan_args(tmp_path, *extra: str) -> list[str]:
    return ["plan", mlp_graph(tmp_path), "--mesh", "tp=4", "--topology", "dgx-h100", "--memory-budget", "1.5MiB",
            "--time-limit", "5", "-o", str(tmp_path / "out"), *extra]

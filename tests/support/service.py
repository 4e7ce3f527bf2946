"""Service settings, a small graph and error helpers shared by the service tests (fixtures are in
conftest.py)."""

from __future__ import annotations

from service.config import Settings

MLP = {
    "format": "autoshard.graph/v1", "name": "mlp",
    "tensors": {"x": {"shape": [8, 16], "dtype": "f32", "role": "input"},
                "w1": {"shape": [16, 32], "dtype": "f32", "role": "parameter"},
                "w2": {"shape": [32, 16], "dtype": "f32", "role": "parameter"},
                "h": {"shape": [8, 32], "dtype": "f32"},
                "y": {"shape": [8, 16], "dtype": "f32"}},
    "ops": [{"name": "fc1", "kind": "matmul", "inputs": ["x", "w1"], "outputs": ["h"]},
            {"name": "fc2", "kind": "matmul", "inputs": ["h", "w2"], "outputs": ["y"]}],
}


def deep_mlp(layers: int) -> dict:
    """A chain of matmuls; with `LONG_SOLVE` on a 3-axis mesh, planning uses its whole time limit."""
    tensors = {"a0": {"shape": [64, 256], "dtype": "bf16", "role": "input"}}
    ops = []
    for i in range(layers):
        tensors[f"w{i}"] = {"shape": [256, 256], "dtype": "bf16", "role": "parameter"}
        tensors[f"a{i + 1}"] = {"shape": [64, 256], "dtype": "bf16"}
        ops.append({"name": f"fc{i}", "kind": "matmul", "inputs": [f"a{i}", f"w{i}"], "outputs": [f"a{i + 1}"]})
    return {"format": "autoshard.graph/v1", "name": "deep", "tensors": tensors, "ops": ops}


# a memory budget that binds keeps the certified bound far below the cost, and gap 0 waits for it
LONG_SOLVE = {"memory_budget_bytes": 800_000, "gap_limit": 0}

OPTIONS = {"time_limit_s": 2, "seed": 0}


def plan_document_of(graph: dict, mesh: str, options: dict | None = None) -> dict:
    """The whole `autoshard.plan/v1` document of `graph` on `mesh` with the given ops' options
    (the others derived, replicated by default), as a plan file must be written."""
    from autoshard.graph.schema import graph_from_json
    from autoshard.mesh import Mesh
    from autoshard.planning.plan import plan_from_json, plan_to_json

    parsed = Mesh.parse(mesh)
    return plan_to_json(plan_from_json({"ops": {name: {"option": option} for name, option in (options or {}).items()}},
                                       graph_from_json(graph, parsed), parsed))


def settings_for(tmp_path, **overrides) -> Settings:
    values = dict(db=tmp_path / "plans.sqlite3", default_time_limit_s=10, max_body_bytes=20_000, max_ops=8,
                  max_tensors=16, max_time_limit_s=60)
    return Settings(**(values | overrides))


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    return body["error"]

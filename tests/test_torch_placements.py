"""Plans in DTensor's vocabulary: one placement per mesh dim, refusals that name the tensor, the
`parallelize_module` plan of a Megatron MLP (run by torch's own tensor-parallel styles), and the
`dtensor` entry of plan.json."""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")

from support.dtensor import CollectiveLog, planned_collectives, simulated_ranks, traffic  # noqa: E402
from support.torch_models import examples, exported  # noqa: E402
from torch.distributed.tensor import Partial, Replicate, Shard  # noqa: E402
from torch.distributed.tensor.parallel import parallelize_module  # noqa: E402

from autoshard.cli.main import main  # noqa: E402
from autoshard.errors import InputError  # noqa: E402
from autoshard.frontends.torch import import_program, parallelize_plan, tensor_placements  # noqa: E402
from autoshard.delivery.dtensor_placements import dtensor_document, placement_specs  # noqa: E402
from autoshard.graph.builder import document_text  # noqa: E402
from autoshard.mesh import Mesh  # noqa: E402
from autoshard.planning.make_plan import PlanResult  # noqa: E402
from autoshard.planning.plan import plan_from_json  # noqa: E402
from autoshard.planning.report import estimate  # noqa: E402
from autoshard.planning.hardware import bind_hardware  # noqa: E402
from autoshard.sharding import Sharding  # noqa: E402

MESH = Mesh.parse("dp=2,tp=4")


def test_one_placement_per_mesh_dim():
    to_torch = lambda s: tuple(p.to_torch() for p in placement_specs(Sharding.parse(s), MESH, "t"))  # noqa: E731
    assert to_torch("[[dp], [tp]]") == (Shard(0), Shard(1))
    assert to_torch("[[], [tp]]") == (Replicate(), Shard(1))
    assert to_torch("[[dp, tp]]") == (Shard(0), Shard(0))  # dp major: DTensor's mesh-dim order
    assert to_torch({"split_axes": [["dp"]], "partial": {"kind": "max", "axes": ["tp"]}}) == (Shard(0), Partial("max"))
    assert [str(p) for p in placement_specs(Sharding.parse("[[], [tp]]"), MESH, "t")] == ["Replicate()", "Shard(1)"]


def test_splits_dtensor_cannot_express_are_refused_naming_the_tensor():
    with pytest.raises(InputError) as error:
        placement_specs(Sharding.parse("[[tp, dp]]"), MESH, "layers.0.wq.weight")
    assert error.value.problems[0].where == "/tensors/layers.0.wq.weight"
    assert "mesh_order_splits" in str(error.value)
    with pytest.raises(InputError, match="uneven shard offsets"):
        placement_specs(Sharding((("tp",),), dims_offsets=((0, 1, 2, 3, 10),)), MESH, "w")


def megatron_mlp():
    """The MLP with its first linear column-parallel and its second row-parallel on `tp`."""
    module, args = examples()["mlp"]
    program = exported(module, args)
    imported = import_program(program)
    document = {"ops": {"linear.matmul": {"option": [[], ["tp"], []]}, "linear": {"option": [[], ["tp"]]},
                        "gelu": {"option": [[], ["tp"]]}, "linear_1.matmul": {"option": [[], [], ["tp"]]},
                        "linear_1": {"option": [[], []]}},
                "tensors": {"up.weight": [["tp"]], "up.bias": [["tp"]], "down.weight": [[], ["tp"]]}}
    plan = plan_from_json(document, imported.graph, Mesh.parse("tp=4"))
    return module, args, program, plan


def test_a_megatron_plan_is_a_parallelize_module_plan_torch_runs_as_planned():
    module, args, program, plan = megatron_mlp()
    axis, styles = parallelize_plan(plan)
    assert axis == "tp" and sorted(styles) == ["down", "up"]
    assert str(styles["up"]) == "ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))"
    assert str(styles["down"]) == "RowwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())"
    result = PlanResult(plan, estimate(plan, bind_hardware("dgx-h100", plan.mesh)), {}, None)
    with simulated_ranks("tp=4") as mesh:
        tp = parallelize_module(copy.deepcopy(module), mesh, {path: s.to_torch() for path, s in styles.items()})
        with CollectiveLog() as log:
            out = tp(*args)
        full = out._local_tensors[0] if hasattr(out, "_local_tensors") else out
    torch.testing.assert_close(full, module(*args), rtol=1e-5, atol=1e-5)
    assert traffic(log.collectives) == traffic(planned_collectives(result))
    assert [c.kind for c in log.collectives] == ["all_reduce"]  # Megatron's one all-reduce per MLP
    assert tensor_placements(plan)["down.weight"] == (Shard(1),)


def test_plans_whose_linears_match_no_style_have_no_parallelize_module_plan():
    module, args, program, plan = megatron_mlp()
    zero = plan_from_json({"tensors": {"up.weight": [[], ["tp"]]}}, plan.graph, plan.mesh)  # stored split on in-features, used whole
    assert parallelize_plan(zero) is None
    assert "parallelize_module" not in dtensor_document(zero)
    assert dtensor_document(plan)["parallelize_module"]["plan"]["up"].startswith("ColwiseParallel(")


def test_plan_json_carries_the_dtensor_placements(tmp_path, capsys):
    module, args = examples()["llama_block"]
    graph = tmp_path / "block.json"
    graph.write_text(document_text(import_program(exported(module, args)).document))
    out = tmp_path / "plan"
    assert main(["plan", str(graph), "--mesh", "dp=2,tp=2", "--mesh-order-splits", "--deterministic",
                 "--weights", "time=1,memory_s_per_byte=1e-9", "--verify", "never", "-o", str(out)]) == 0
    document = json.loads((out / "plan.json").read_text())
    dtensor = document["dtensor"]
    assert dtensor["mesh_dim_names"] == ["dp", "tp"] and "refused" not in dtensor
    assert set(dtensor["tensors"]) == set(document["tensors"])
    for name, placements in dtensor["tensors"].items():
        expected = placement_specs(Sharding.parse(document["tensors"][name]), Mesh.parse("dp=2,tp=2"), name)
        assert placements == [str(p) for p in expected]
    assert document["ops"]["linear"]["module"] == "wq"  # ops keep their module, for reports by layer
    capsys.readouterr()

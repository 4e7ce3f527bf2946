"""`autoshard.frontends.torch.pipeline`: a pipelined plan of a torch program (imported with
`batch_dim`, planned with `plan --pipeline 2 --microbatches 4`) run by torch.distributed.pipelining
on gloo ranks over loopback, 2 stages in 2 processes and 2 stages of tp=2 in 4 (a 4-layer stack
under each schedule, a two-layer GPT); the loss and every gradient equal the unsharded module's.
And the errors: a plan without stages, a plan of another program, a process group of another size."""

from __future__ import annotations

import importlib
import json

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from support.ranks import free_port, run_ranks  # noqa: E402
from support.torch_models import GPT  # noqa: E402

from autoshard.cli.main import main  # noqa: E402
from autoshard.errors import InputError  # noqa: E402
from autoshard.frontends.pipelined import PIPELINE_ENTRY  # noqa: E402
from autoshard.frontends.torch import import_program, parallelize, pipeline  # noqa: E402
from autoshard.frontends.torch.stage_cut import cut_program  # noqa: E402
from autoshard.planning.pipeline_cut import read_cut  # noqa: E402

BATCH, HIDDEN = 8, 16
BUDGET_S = 30  # per run of ranks: forked from the test, a run takes about a second here
TOLERANCE = 1e-5  # float32 sums of a few hundred terms, in another order


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x), approximate="tanh"))


class Stack(nn.Module):
    def __init__(self, layers: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture(scope="module")
def program():
    """The 4-layer stack, its example batch and labels, and its export."""
    torch.manual_seed(0)
    module, x, labels = Stack(), torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)
    return module, x, labels, torch.export.export(module, (x,)).run_decompositions({})


def planned(program, folder, mesh: str, *extra: str) -> dict:
    """plan --pipeline 2 --microbatches 4 of the program's training step (imported through the
    Python API) on stages of `mesh`."""
    graph = folder / "graph.json"
    graph.write_text(json.dumps(import_program(program[3], training=True, batch_dim=0).document))
    return planned_graph(graph, folder, mesh, *extra)


def planned_graph(graph, folder, mesh: str, *extra: str) -> dict:
    assert main(["plan", str(graph), "--mesh", mesh, "--pipeline", "2", "--microbatches", "4", "--deterministic",
                 "--verify", "never", "-o", str(folder / "out"), *extra]) == 0
    return json.loads((folder / "out" / "plan.json").read_text())


@pytest.fixture(scope="module")
def plan_of_two_stages(tmp_path_factory):
    """Planned from `autoshard import torch --training --batch-dim 0` of another instance of the
    stack: the names, and so the plan, depend only on the module's code and the inputs' shapes."""
    folder = tmp_path_factory.mktemp("pp2")
    (folder / "model.py").write_text("import torch\nfrom test_torch_pipeline import BATCH, HIDDEN, Stack\n\n\n"
                                     "def make():\n    return Stack(), (torch.randn(BATCH, HIDDEN),)\n")
    graph = folder / "graph.json"
    assert main(["import", "torch", f"{folder / 'model.py'}:make", "-o", str(graph), "--training",
                 "--batch-dim", "0"]) == 0
    return planned_graph(graph, folder, "tp=1")


def step_on_rank(rank: int, exported, plan: dict, x, labels, folder) -> None:
    """One training step of this rank's stages; its losses and whole gradients saved for the test."""
    run = pipeline(exported, plan)
    losses: list = []
    first, last = run.stages[0].is_first, run.stages[-1].is_last
    run.schedule.step(*((x,) if first else ()), target=labels if last else None, losses=losses)
    parameters = dict(p for module in run.modules for p in module.named_parameters())
    torch.save({"losses": [float(loss) for loss in losses], "schedule": type(run.schedule).__name__,
                "stages": [stage.stage_index for stage in run.stages],
                "grads": {name: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                          for name, p in parameters.items()},
                "sharded": sorted(name for name, p in parameters.items()
                                  if isinstance(p, DTensor) and any(pl.is_shard() for pl in p.placements))},
               folder / f"rank{rank}.pt")


def run_step(program, plan: dict, world: int, folder) -> list[dict]:
    module, x, labels, exported = program
    run_ranks(world, step_on_rank, (exported, plan, x, labels, folder), BUDGET_S)
    return [torch.load(folder / f"rank{rank}.pt") for rank in range(world)]


def assert_unsharded_step(program, ranks: list[dict], ranks_per_stage: int) -> None:
    """The last stage's losses sum to the whole batch's, and each rank holds the gradients of its
    stage's parameters, equal to the unsharded module's."""
    module, x, labels, _ = program
    module.zero_grad()
    loss = (module(x) * labels).sum()
    loss.backward()
    expected = dict(module.named_parameters())
    last = ranks[-ranks_per_stage:]
    assert all(len(r["losses"]) == 4 for r in last)
    assert all(sum(r["losses"]) == pytest.approx(float(loss), rel=TOLERANCE) for r in last)
    held = [name for r in ranks[::ranks_per_stage] for name in r["grads"]]
    assert sorted(held) == sorted(expected)  # every parameter on exactly one stage
    for r in ranks:
        for name, grad in r["grads"].items():
            torch.testing.assert_close(grad, expected[name].grad, atol=TOLERANCE, rtol=TOLERANCE, msg=name)


def test_two_stages_in_two_processes_give_the_unsharded_loss_and_gradients(program, plan_of_two_stages, tmp_path):
    ranks = run_step(program, plan_of_two_stages, 2, tmp_path)
    assert_unsharded_step(program, ranks, 1)
    assert [sorted({n.split(".")[1] for n in r["grads"]}) for r in ranks] == [["0", "1"], ["2", "3"]]
    assert [(r["schedule"], r["stages"]) for r in ranks] == [("Schedule1F1B", [0]), ("Schedule1F1B", [1])]
    assert not any(r["sharded"] for r in ranks)


@pytest.mark.parametrize("schedule, torch_schedule, stages", [
    ("1f1b", "Schedule1F1B", [[0], [0], [1], [1]]),
    ("gpipe", "ScheduleGPipe", [[0], [0], [1], [1]]),
    ("interleaved:2", "ScheduleInterleaved1F1B", [[0, 2], [0, 2], [1, 3], [1, 3]]),  # chunk c of stage s: c·S + s
    ("zb-h1", "ScheduleInterleavedZeroBubble", [[0], [0], [1], [1]])])
def test_two_stages_of_tp2_in_four_processes_hold_dtensors_placed_by_the_plan(program, tmp_path, schedule,
                                                                             torch_schedule, stages):
    # weighing memory makes the plan shard the weights, which it would not at these sizes for time alone
    plan = planned(program, tmp_path, "tp=2", "--schedule", schedule, "--weights", "time=1,memory_s_per_byte=1e-6")
    split = {name for name, entry in plan["tensors"].items() if name.startswith("layers.") and
             name.count(".") == 3 and entry["split_axes"]}
    assert {"layers.0.up.weight", "layers.3.down.weight"} <= split
    ranks = run_step(program, plan, 4, tmp_path)
    assert_unsharded_step(program, ranks, 2)
    assert [r["stages"] for r in ranks] == stages
    for r in ranks:
        assert r["schedule"] == torch_schedule
        assert set(r["sharded"]) == split & set(r["grads"])


def test_a_tiny_gpt_as_two_stages_of_tp2_gives_the_unsharded_loss_and_gradients(tmp_path):
    """Views, attention with q, k and v split off one projection, LayerNorm, an embedding on the
    first stage and the head on the last: run on microbatches of a program exported whole."""
    torch.manual_seed(0)
    module, ids, labels = GPT(), torch.randint(0, 64, (BATCH, 8)), torch.randn(BATCH, 8, 64)
    gpt = (module, ids, labels, torch.export.export(module, (ids,)).run_decompositions({}))
    plan = planned(gpt, tmp_path, "tp=2", "--weights", "time=1,memory_s_per_byte=1e-6")
    ranks = run_step(gpt, plan, 4, tmp_path)
    assert_unsharded_step(gpt, ranks, 2)
    assert "embed.weight" in ranks[0]["grads"] and "head.weight" in ranks[2]["grads"]
    assert {"layers.0.qkv.weight", "layers.1.fc.weight"} <= {name for r in ranks for name in r["sharded"]}


def test_the_program_is_cut_where_the_plan_cuts_it(program, plan_of_two_stages):
    imported = import_program(program[3], batch_dim=0)
    training = import_program(program[3], training=True, batch_dim=0)
    cut = read_cut(plan_of_two_stages, training.graph)
    first, second = cut_program(imported, cut.part_of, 2)
    ops = [[s.outputs[0] for s in part.steps] for part in (first, second)]
    assert ops == [[op for op in chunk["ops"] if op in imported.graph.op_by_name]
                   for stage in plan_of_two_stages["pipeline"]["stages"] for chunk in stage["chunks"]]
    assert (first.inputs, first.outputs, second.inputs, second.outputs) == (("x",), ("add_1",), ("add_1",), ("add_3",))


def test_a_plan_without_stages_is_refused(program, plan_of_two_stages):
    plan = {k: v for k, v in plan_of_two_stages.items() if k != "pipeline"}
    with pytest.raises(InputError, match="no `pipeline` section.*plan --pipeline S"):
        pipeline(program[3], plan)


def test_a_plan_of_another_program_is_refused(plan_of_two_stages):
    torch.manual_seed(0)
    other = torch.export.export(Stack(layers=3), (torch.randn(BATCH, HIDDEN),)).run_decompositions({})
    with pytest.raises(InputError, match="has no op|no stage runs|option"):
        pipeline(other, plan_of_two_stages)


def test_a_process_group_of_another_size_is_refused(program, plan_of_two_stages):
    with pytest.raises(InputError, match="not initialised: run one process per rank"):
        pipeline(program[3], plan_of_two_stages)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with pytest.raises(InputError, match=r"runs on 2 devices \(pp=2,tp=1\) but the process group has 1 ranks"):
            pipeline(program[3], plan_of_two_stages)
    finally:
        dist.destroy_process_group()


def test_parallelize_refuses_the_plan_naming_pipeline_which_runs_it(program, plan_of_two_stages):
    with pytest.raises(InputError, match=f"with {PIPELINE_ENTRY}$"):
        parallelize(program[3], plan_of_two_stages, None)
    package, _, name = PIPELINE_ENTRY.rpartition(".")
    assert getattr(importlib.import_module(package), name) is pipeline

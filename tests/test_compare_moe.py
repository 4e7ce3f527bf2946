"""`search --by-layer --compare` for llama-style graphs, dense or with routed experts: Megatron's
tensor parallelism pinned by the llama layer's value names, and expert parallelism (`ep`, carved
out of the dp data replicas) splitting the experts over ep with the dispatched tokens moved to
them and back by all-to-alls; every misuse named."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autoshard.errors import InputError
from autoshard.graph.schema import graph_from_json, load_graph
from autoshard.models import GPTConfig, gpt
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.layer_sample import layer_sample
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.search.compare import compared_key, parse_layout
from autoshard.search.layered import KeyOutcome, Queue, _keys, price_key
from autoshard.search.pipelined import stage_counts
from autoshard.search.run import SearchOptions
from autoshard.search.sample_tasks import solve_sample_task
from autoshard.search.stage_tasks import bind_stages
from autoshard.search.tasks import SearchInputs
from autoshard.sharding import Sharding

# dispatched tokens of MiBs a device, where an all-to-all beats gathering them (small ones are gathered)
MOE = GPTConfig(layers=4, hidden=4096, heads=4, kv_heads=2, seq=256, batch=16, vocab=128, style="llama",
                moe_experts=4, moe_top_k=2, moe_ffn=96, moe_group_size=64)
DENSE = GPTConfig(layers=2, hidden=64, heads=4, kv_heads=2, seq=32, batch=4, vocab=128, style="llama")


def declared_batch(document: dict) -> int:
    """The batch `search --by-layer` hands `compared_key`: the sequences, the gcd of those declared."""
    return math.gcd(*(t["shape"][t["batch_dim"]] for t in document["tensors"].values()
                      if t.get("batch_dim") is not None))


def compared(config: GPTConfig, text: str, devices: int, topology: str = "dgx-h100"):
    document = gpt(config, training=True)
    return compared_key(parse_layout(text), layer_sample(document), topology, devices, declared_batch(document))


def solved(task, pinned: dict):
    mesh = task.candidate.mesh
    result = make_plan(graph_from_json(pinned, mesh), mesh, bind_hardware("dgx-h100", mesh),
                       SolveSettings(time_limit_s=30, deterministic=True, workers=1, microbatches=task.microbatches))
    steps = {(r["tensor"], r["consumer"]): [(s["kind"], s["mesh_axes"]) for s in r["steps"]]
             for r in result.report.to_json()["reshardings"]}
    return result.plan, steps


@pytest.fixture(scope="module")
def expert_parallel():
    task, schedule, chunks, pinned = compared(MOE, "tp=1,pp=2,dp=8,ep=4", 16)
    return task, schedule, chunks, solved(task, pinned)


def test_ep_is_carved_out_of_the_data_replicas(expert_parallel):
    task, schedule, chunks, _ = expert_parallel
    # dp 8 = 2 expert-data replicas x ep 4, tensor fastest then ep then dp, all on one node's GPUs
    assert task.candidate.mesh_text == "dp=2,ep=4" and task.candidate.placement_text == "dp:gpu ep:gpu"
    # the sequences are 16 (the token groups, 64, are declared as a batch too): 16 / (dp 8 x micro 1)
    assert (task.stages, task.microbatches, schedule, chunks) == (2, 2, "1f1b", 1)


def test_the_experts_are_split_over_ep_and_replicated_over_dp(expert_parallel):
    plan = expert_parallel[3][0]
    for layer in (0, 1, 3):  # the sample's layers
        p = f"layer{layer}.mlp"
        for matrix in ("gate", "up", "down"):
            assert plan.storage[f"{p}.experts.{matrix}.w"].split_axes[0] == ("ep",)
            assert plan.storage[f"{p}.experts.{matrix}.w"].used_axes() == ("ep",)
        # the experts' loops: expert dim over ep, each ep group's tokens over dp
        assert plan.options[f"{p}.experts.gate"].loop_axes[:2] == (("ep",), ("dp",))
        assert plan.options[f"{p}.experts.down"].loop_axes[:2] == (("ep",), ("dp",))
        # attention and routing data-parallel over every replica, dp x ep
        assert plan.options[f"layer{layer}.attn.sdpa"].loop_axes[0] == ("dp", "ep")
        assert plan.options[f"{p}.dispatch_tokens"].loop_axes[0] == ("dp", "ep")
        assert plan.options[f"{p}.combine"].loop_axes[0] == ("dp", "ep")
        assert plan.storage[f"{p}.router.w"] == Sharding(((), ()))


def test_the_dispatched_tokens_go_to_their_experts_and_back_by_all_to_alls(expert_parallel):
    steps = expert_parallel[3][1]
    moved = {pair for pair, found in steps.items() if any(kind == "all_to_all" for kind, _ in found)}
    assert all(steps[pair] == [("all_to_all", ["ep"])] for pair in moved)
    for layer in (0, 1, 3):
        p = f"layer{layer}.mlp"
        assert {(f"{p}.dispatch_tokens", f"{p}.experts.gate"), (f"{p}.experts.down", f"{p}.combine")} <= moved
        # the backward's two, on the gradients of the combine's expert outputs and of the dispatched tokens
        backward = [t for t, _ in moved if t.startswith(f"grad.{p}.")]
        assert len(backward) == 2 and {t.split(".")[3] for t in backward} == {"combine", "dispatch_tokens"}
    assert len(moved) == 4 * 3  # nothing else: attention and the dense parts stay data-parallel


def test_expert_gradients_are_reduced_over_their_data_replicas_only(expert_parallel):
    steps = expert_parallel[3][1]
    for layer in (0, 1, 3):
        p = f"layer{layer}.mlp"
        for matrix in ("gate", "up", "down"):
            assert steps[(f"grad.{p}.experts.{matrix}.1", f"adam.{p}.experts.{matrix}.w.grad")] == \
                [("all_reduce", ["dp"])]
        # the router's, like attention's, over every data replica
        assert [axis for kind, axes in steps[(f"grad.{p}.router.1", f"adam.{p}.router.w.grad")]
                for axis in axes] == ["dp", "ep"]


def test_the_published_mixtral_layout_places_ep_on_a_nodes_gpus():
    # NeMo's Mixtral 8x7B: tp 1, pp 4, ep 8, dp 16 on 64 GPUs: a stage is 2 nodes, ep on each node's 8 GPUs
    config = replace(MOE, layers=8, hidden=64, seq=32, batch=32, moe_experts=8, moe_group_size=32)
    task, _, _, pinned = compared(config, "tp=1,pp=4,dp=16,ep=8", 64)
    assert task.candidate.mesh_text == "dp=2,ep=8" and task.candidate.placement_text == "dp:node ep:gpu"
    assert task.candidate.nodes == 2 and task.microbatches == 2
    pins = {c["tensor"]: c["split_axes"] for c in pinned["constraints"]}
    assert pins["layer1.mlp.experts.up.w"] == [["ep"], [], []]
    assert pins["layer1.mlp.experts.silu"] == [["ep"], ["dp"], [], []]
    assert pins["layer1.mlp.dispatch_tokens"] == [["dp", "ep"], [], [], []]
    assert pins["layer1.mlp.dispatch"] == [["dp", "ep"], [], [], []] and pins["ids"] == [["dp", "ep"], []]


def test_with_tp_the_experts_features_split_as_megatrons_expert_tensor_parallelism():
    # tp 2 x ep 2 x dp/ep 2 on a node's GPUs: the experts' features over tp as the dense MLP's, columns then rows
    config = replace(MOE, hidden=64, seq=32, batch=16, moe_group_size=16)
    task, _, _, pinned = compared(config, "tp=2,pp=2,dp=4,ep=2", 16)
    assert task.candidate.mesh_text == "dp=2,ep=2,tp=2"
    assert task.candidate.placement_text == "dp:gpu ep:gpu tp:gpu"
    pins = {c["tensor"]: c["split_axes"] for c in pinned["constraints"]}
    assert pins["layer1.mlp.experts.gate.w"] == [["ep"], [], ["tp"]]
    assert pins["layer1.mlp.experts.down.w"] == [["ep"], ["tp"], []]
    assert pins["layer1.mlp.experts.glu"] == [["ep"], ["dp"], [], ["tp"]]
    assert pins["layer1.mlp.experts.down"] == [["ep"], ["dp"], [], []]  # partial over tp or reduced: solver's
    assert pins["layer1.attn.q.w"] == [[], ["tp"]] and pins["layer1.attn.out.w"] == [["tp"], []]
    # sequence parallelism by default with tp: norms on the sequence; the router sees whole groups
    assert pins["layer1.mlp_norm"] == [["dp", "ep"], ["tp"], []]
    assert pins["layer1.mlp.groups"] == [["dp", "ep"], [], []]


def test_a_dense_llama_layer_is_pinned_as_megatrons_tensor_parallelism():
    task, _, _, pinned = compared(DENSE, "tp=2,pp=1,dp=2", 4)
    assert task.candidate.mesh_text == "dp=2,tp=2"
    plan, _ = solved(task, pinned)
    assert plan.storage["layer0.attn.q.w"].split_axes == ((), ("tp",))  # column-parallel
    assert plan.storage["layer0.attn.k.w"].split_axes == ((), ("tp",))
    assert plan.storage["layer0.attn.out.w"].split_axes == (("tp",),)  # row-parallel
    assert plan.storage["layer0.mlp.up.w"].split_axes == ((), ("tp",))
    assert plan.storage["layer0.mlp.down.w"].split_axes == (("tp",),)
    assert plan.options["layer1.attn.sdpa"].loop_axes[:2] == (("dp",), ("tp",))  # heads over tp
    assert plan.produced("layer1.mlp.glu").split_axes == (("dp",), (), ("tp",))
    # sequence parallelism: the norms and residuals split on the sequence over tp
    assert plan.produced("layer1.mlp_norm").split_axes == (("dp",), ("tp",))
    assert plan.produced("layer1.attn_residual").split_axes == (("dp",), ("tp",))


@pytest.mark.parametrize("config, text, devices, message", [
    (MOE, "tp=1,pp=2,dp=6,ep=4", 12, "ep=4 must divide dp=6"),
    (replace(MOE, moe_experts=6), "tp=1,pp=2,dp=8,ep=4", 16, "ep=4 must divide the 6 routed experts"),
    (DENSE, "tp=1,pp=1,dp=4,ep=2", 4, "ep=2 splits routed experts, but this graph has none"),
    (replace(DENSE, style="megatron", kv_heads=None), "tp=1,pp=1,dp=4,ep=2", 4,
     "ep=2 splits routed experts, but this graph has none"),
    (replace(DENSE, style="gpt"), "tp=2,pp=1,dp=2", 4, "this graph is of `--style gpt`"),
    (MOE, "tp=1,pp=2,dp=8,ep=0", 16, "ep must be a positive integer"),
    (MOE, "tp=1,pp=2,dp=8,ep=16", 16, "ep=16 must divide dp=8"),
    # ep 4 on half a node's GPUs, then 3 expert-data replicas of it straddle two nodes
    (replace(MOE, hidden=64, seq=32, batch=48, moe_group_size=32), "tp=1,pp=2,dp=12,ep=4", 24,
     "do not fit the nodes of dgx-h100"),
])
def test_misuse_is_named(config, text, devices, message):
    with pytest.raises(InputError) as error:
        compared(config, text, devices)
    assert all(p.where == "--compare" for p in error.value.problems)
    assert message in str(error.value)


def test_the_layout_reads_its_expert_degree():
    layout = parse_layout("tp=1,pp=4,dp=16,ep=8,interleave=8")
    assert (layout.expert, layout.data, layout.interleave) == (8, 16, 8)
    assert layout.words == "tp 1 x pp 4 x dp 16 (ep 8), V 8, micro 1, none"
    assert parse_layout("tp=2,pp=1,dp=2").expert == 1


def test_a_keys_solves_of_a_routed_step_start_from_expert_parallelism():
    """A key of a step with routed experts is solved from the layout Mixtral's and DeepSeek-V3's runs
    use on its sub-mesh (no tensor parallelism, the batch over every axis, the experts over the axes
    of the widest degree that divides them), which stays one of its plans: the key is never slower."""
    document = gpt(MOE, training=True)
    sample = layer_sample(document)
    task, _, _, pinned = compared(MOE, "tp=1,pp=2,dp=8,ep=4", 16)
    inputs = SearchInputs(sample.document, "dgx-h100", SolveSettings(time_limit_s=2, workers=1, deterministic=True))
    free = solve_sample_task(inputs, task, 2)
    theirs = solve_sample_task(inputs, replace(task, graph_document=pinned), 2)
    placement = bind_stages("dgx-h100", 16, task.stages, task.candidate)

    def step_s(answer: dict, variants: list) -> float:
        key = KeyOutcome(task, 0.0, outcome="solved", bound_s=0.0, solved=answer)
        return price_key(key, variants, sample, placement, None, math.inf, only=("1f1b", 1))[0].step_s

    # of dp=2 and ep=4 (4 experts), ep alone divides them widest; it is the published layout here
    start = free["roles"][-1]
    assert "experts" in start["ep"]["expert"] and "experts" in start["dp"]["data"]
    assert "attention" in start["ep"]["data"] and "attention" in start["dp"]["data"]
    assert not any("tensor" in roles for roles in start.values())
    assert free["solver"]["formulations"] == 2
    assert step_s(free, free["prices"]) <= step_s(free, free["prices"][-1:]) * (1 + 1e-9)
    assert step_s(free, free["prices"][-1:]) == pytest.approx(step_s(theirs, theirs["prices"][:1]), rel=1e-3)


def test_a_routed_steps_first_key_of_a_pair_gives_each_device_one_sample():
    """Runs with routed experts split the batch over every device of a stage (the experts carved
    out of the data replicas), so the first key solved of a (stages, sub-mesh) pair of such a step
    is one sample a device a microbatch, where a dense step's is one a replica between nodes."""
    sample = layer_sample(gpt(MOE, training=True))
    options = SearchOptions(devices=16, topology="dgx-h100", max_axes=2, jobs=1)
    counts = [1] + stage_counts(16, len(sample.layers))
    queue, first = Queue(_keys(sample, options, ("none",), counts, load_graph(sample.document))), {}
    while queue:
        key = queue.pop()
        first.setdefault((key.task.stages, key.task.candidate), key)
    assert {stages for stages, _ in first} == {1, 2, 4}
    for (stages, candidate), key in first.items():
        assert key.task.microbatches == MOE.batch // math.prod(candidate.axis_sizes), (stages, candidate.label)

"""The report's fast paths (running-total memory timeline, shardings and op costs derived once,
reshardings searched once per distinct request) against a straightforward reference: every
value added into every step it is live, every op and resharding priced on its own."""

from __future__ import annotations

import json
import random

import pytest

from autoshard.graph.model import topological_order
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, MLPConfig, MoEConfig, gpt, mlp, moe
from autoshard.planning.costs import op_cost, tensor_bytes
from autoshard.planning.formulation import formulate
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.planning.report import estimate, memory_timeline
from autoshard.resharding import plan_resharding
from autoshard.sharding import Sharding

MESH = Mesh.parse("dp=2,tp=2")
HW = bind_hardware("dgx-h100", MESH)
MODELS = {
    "gpt_training": gpt(GPTConfig(layers=2, hidden=64, heads=4, seq=32, batch=4, vocab=96), training=True),
    "mlp_training": mlp(MLPConfig(layers=2, batch=8, hidden=64), training=True),
    "moe_forward": moe(MoEConfig(batch=2, seq=16, hidden=32, experts=4)),
}


def replicated_plan(doc: dict) -> Plan:
    graph = graph_from_json(doc, MESH)
    return Plan(graph, MESH, {op.name: ShardingOption.replicated(op.nest.num_loops) for op in graph.ops},
                {t.name: Sharding() for t in graph.tensors.values() if t.role != "intermediate"})


def random_plan(doc: dict) -> Plan:
    """Every op and stored value on a seeded random legal choice: splits, partial results and
    many reshardings."""
    graph = graph_from_json(doc, MESH)
    formulation = formulate(graph, MESH, HW)
    rng = random.Random(0)
    return formulation.plan([rng.randrange(len(choices)) for choices in formulation.choices])


def budgeted_plan() -> tuple[Plan, object]:
    """A plan solved under a memory budget its weights alone exceed, so they are stored sharded."""
    mesh = Mesh.parse("dp=8")
    doc = {"format": "autoshard.graph/v1", "name": "mlp",
           "tensors": {"x": {"shape": [64, 8192], "dtype": "bf16", "role": "input"},
                       "w1": {"shape": [8192, 32768], "dtype": "bf16", "role": "parameter"},
                       "w2": {"shape": [32768, 8192], "dtype": "bf16", "role": "parameter"},
                       "h": {"shape": [64, 32768], "dtype": "bf16"},
                       "a": {"shape": [64, 32768], "dtype": "bf16"},
                       "y": {"shape": [64, 8192], "dtype": "bf16"}},
           "ops": [{"name": "fc1", "kind": "matmul", "inputs": ["x", "w1"], "outputs": ["h"]},
                   {"name": "act", "kind": "gelu", "inputs": ["h"], "outputs": ["a"]},
                   {"name": "fc2", "kind": "matmul", "inputs": ["a", "w2"], "outputs": ["y"]}],
           "outputs": ["y"]}
    hw = bind_hardware("dgx-h100", mesh)
    settings = SolveSettings(time_limit_s=20, workers=1, memory_budget_bytes=512 * 2 ** 20, deterministic=True)
    plan = make_plan(graph_from_json(doc, mesh), mesh, hw, settings).plan
    assert plan.storage["w1"] != Sharding() and plan.storage["w2"] != Sharding()
    return plan, hw


CASES = [(f"{name}_{kind}", name, kind) for name in MODELS for kind in ("replicated", "random")] + [("budgeted", None, None)]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def case(request) -> tuple[Plan, object]:
    _, name, kind = request.param
    if name is None:
        return budgeted_plan()
    return (replicated_plan if kind == "replicated" else random_plan)(MODELS[name]), HW


def reference_timeline(plan: Plan) -> tuple[list[int], list[int]]:
    """Each value's bytes added into every step from its producer (or the start) to its last
    consumer, or to the end for parameters and graph outputs; a view holds nothing, and the value
    it views is held as long as the view (or a view of it) is. A value overwritten in place is
    held until the step before its new value is produced, which counts as what it overwrites."""
    graph, mesh = plan.graph, plan.mesh
    order = topological_order(graph)
    at = {op.name: i for i, op in enumerate(order)}
    steps = max(len(order), 1)
    usage, params = [0] * steps, [0] * steps

    def last_use(name: str) -> int:
        tensor, producer = graph.tensors[name], graph.producers.get(name)
        first = at[producer.name] if producer else 0
        users = [at[op.name] for op in graph.ops if name in op.inputs]
        last = steps - 1 if tensor.role == "parameter" or name in graph.outputs else max(users, default=first)
        new = next((t.name for t in graph.tensors.values() if t.updates == name), None)
        if new is not None:
            last = at[graph.producers[new].name] - 1
        views = [op.outputs[0] for op in graph.ops if op.op_kind.view and op.inputs[0] == name]
        return max([last] + [last_use(v) for v in views])

    for name, tensor in graph.tensors.items():
        producer = graph.producers.get(name)
        first = at[producer.name] if producer else 0
        last = last_use(name)
        if producer is not None and producer.op_kind.view:
            continue
        size = tensor_bytes(tensor.shape, tensor.itemsize, plan.produced(name), mesh)
        for t in range(first, last + 1):
            usage[t] += size
            if tensor.role == "parameter" or (tensor.updates and graph.tensors[tensor.updates].role == "parameter"):
                params[t] += size
    return usage, params


def reference_reshardings(plan: Plan, hw) -> list[dict]:
    """Every resharding, each searched on its own from `Plan.produced` / `Plan.required`: a value
    read by several uses is delivered once in the sharding (as produced, or one two uses read)
    that makes its reshardings the fewest seconds, and each use reads from there."""
    graph, out, made = plan.graph, [], set()

    def search(t: str, source: Sharding, target: Sharding):
        tensor = graph.tensors[t]
        return plan_resharding(plan.mesh, tensor.shape, tensor.itemsize, source, target, hw.collective_seconds)

    def entry(t: str, consumer: str, index: int | None, source: Sharding, target: Sharding) -> dict:
        r = search(t, source, target)
        moved = sum(0.0 if s.kind == "all_slice" else s.bytes_per_device for s in r.steps)
        return {"tensor": t, "consumer": consumer, "input": index, "from": source.to_json(),
                "to": target.to_json(), "steps": [s.to_json() for s in r.steps], "seconds": r.seconds,
                "bytes_per_device": moved}

    def delivered(t: str) -> Sharding:
        source = plan.produced(t)
        targets = [plan.required(op, i) for op in topological_order(graph) for i, x in enumerate(op.inputs) if x == t]
        best, best_s = source, sum(search(t, source, d).seconds for d in targets)
        for via in dict.fromkeys(targets):
            if via != source and targets.count(via) >= 2:
                seconds = search(t, source, via).seconds + sum(search(t, via, d).seconds for d in targets if d != via)
                if seconds < best_s:
                    best, best_s = via, seconds
        return best

    for op in topological_order(graph):
        for i, t in enumerate(op.inputs):
            source, via, target = plan.produced(t), delivered(t), plan.required(op, i)
            if via != source and t not in made:
                made.add(t)
                out.append(entry(t, op.name, i, source, via))
            if via != target:
                out.append(entry(t, op.name, i, via, target))
    for t in graph.outputs:
        target = plan.final(t)
        if plan.produced(t) != target:
            out.append(entry(t, "output", None, plan.produced(t), target))
    return out


def test_memory_timeline_and_peak_match_the_reference(case):
    plan, hw = case
    usage, params = memory_timeline(plan)
    expected_usage, expected_params = reference_timeline(plan)
    assert usage.tolist() == expected_usage
    assert params.tolist() == expected_params
    report = estimate(plan, hw)
    peak = expected_usage.index(max(expected_usage))
    assert (report.peak_memory_bytes, report.peak_step) == (expected_usage[peak], peak)
    assert report.peak_op == topological_order(plan.graph)[peak].name
    assert report.parameter_bytes == expected_params[peak] > 0
    assert report.activation_peak_bytes == expected_usage[peak] - expected_params[peak]


def test_per_op_breakdown_and_reshardings_match_the_reference(case):
    plan, hw = case
    graph = plan.graph
    report = estimate(plan, hw)
    reshardings = reference_reshardings(plan, hw)
    assert report.reshardings == reshardings
    communication = {op.name: [0.0, 0.0] for op in graph.ops}
    for r in reshardings:
        if r["consumer"] != "output":
            communication[r["consumer"]][0] += r["seconds"]
            communication[r["consumer"]][1] += r["bytes_per_device"]
    expected = []
    for op in topological_order(graph):
        option = plan.options[op.name]
        cost = op_cost(graph, op, option, plan.mesh, hw)
        expected.append({"op": op.name, "kind": op.kind, "option": option.to_json(),
                         **({"ring": option.ring} if option.ring is not None else {}), "compute_s": cost.seconds, "flops_per_device": cost.flops, "bytes_per_device": cost.bytes,
                         "bound": cost.bound, "communication_s": communication[op.name][0],
                         "communication_bytes": communication[op.name][1]})
    assert report.ops == expected
    assert report.compute_s == sum(e["compute_s"] for e in expected)
    assert report.communication_s == sum(r["seconds"] for r in reshardings)


def test_the_cases_exercise_sharding_and_resharding():
    plan = random_plan(MODELS["gpt_training"])
    report = estimate(plan, HW)
    # many values resharded, several of them the same way across layers (searched once)
    distinct = {(tuple(plan.graph.tensors[r["tensor"]].shape), json.dumps(r["from"], sort_keys=True),
                 json.dumps(r["to"], sort_keys=True)) for r in report.reshardings}
    assert len(report.reshardings) > 100 and len(distinct) < len(report.reshardings)
    assert any(s != Sharding() for s in plan.storage.values())


def chain(shape: list[int], dtype: str) -> dict:
    """x -> gelu -> y -> gelu -> z, z the output."""
    return {"format": "autoshard.graph/v1", "name": "chain",
            "tensors": {"x": {"shape": shape, "dtype": dtype, "role": "input"},
                        "y": {"shape": shape, "dtype": dtype}, "z": {"shape": shape, "dtype": dtype}},
            "ops": [{"name": "g1", "kind": "gelu", "inputs": ["x"], "outputs": ["y"]},
                    {"name": "g2", "kind": "gelu", "inputs": ["y"], "outputs": ["z"]}],
            "outputs": ["z"]}


def test_a_peak_held_at_several_steps_is_reported_at_the_first():
    plan = replicated_plan(chain([4, 8], "f32"))
    usage, _ = memory_timeline(plan)
    assert usage.tolist() == [256, 256]  # x and y, then y and z
    report = estimate(plan, HW)
    assert (report.peak_step, report.peak_op, report.peak_memory_bytes) == (0, "g1", 256)

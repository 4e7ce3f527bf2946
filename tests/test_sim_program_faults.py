"""Deliberately wrong programs are caught, at the op (or collective) and device where they go wrong."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.resharding import bytes_moved_price
from autoshard.sharding import Sharding
from autoshard.sim import program as sim_program
from autoshard.sim.program import simulate_program, verify_plan
from autoshard.spmd.program import Communicate, LocalOp, partition

MESH = Mesh.of(x=2, y=2)


def mlp_plan(act_option: tuple = ((), ())) -> Plan:
    """x @ w1 with the contraction split over x (a partial sum), relu, then @ w2 split over y."""
    doc = {"format": "autoshard.graph/v1", "name": "mlp",
           "tensors": {"x": {"shape": [4, 6], "dtype": "f32", "role": "input"},
                       "w1": {"shape": [6, 5], "dtype": "f32", "role": "parameter"},
                       "w2": {"shape": [5, 3], "dtype": "f32", "role": "parameter"},
                       "h": {"shape": [4, 5], "dtype": "f32"}, "a": {"shape": [4, 5], "dtype": "f32"},
                       "y": {"shape": [4, 3], "dtype": "f32"}},
           "ops": [{"name": "fc1", "kind": "matmul", "inputs": ["x", "w1"], "outputs": ["h"]},
                   {"name": "act", "kind": "relu", "inputs": ["h"], "outputs": ["a"]},
                   {"name": "fc2", "kind": "matmul", "inputs": ["a", "w2"], "outputs": ["y"]}],
           "outputs": ["y"]}
    graph = graph_from_json(doc)
    options = {"fc1": ShardingOption(((), (), ("x",))), "act": ShardingOption(act_option),
               "fc2": ShardingOption((("y",), (), ()))}
    storage = {"x": Sharding(((), ("x",))), "w1": Sharding((("x",),)), "w2": Sharding()}
    return Plan(graph, MESH, options, storage)


def program_of(plan: Plan):
    return partition(plan, bytes_moved_price(plan.mesh))


def without(program, item):
    """The program with one Communicate removed: its consumers read its input instead."""
    replaced = {item.output.id: item.input}
    body = []
    for other in program.body:
        if other is item:
            continue
        if isinstance(other, LocalOp):
            other = dataclasses.replace(other, inputs=tuple(replaced.get(v.id, v) for v in other.inputs))
        elif other.input.id in replaced:
            other = dataclasses.replace(other, input=replaced[other.input.id])
        body.append(other)
    results = tuple(replaced.get(v.id, v) for v in program.results)
    return dataclasses.replace(program, body=tuple(body), results=results)


def collectives(program, kind: str) -> list:
    return [item for item in program.body if isinstance(item, Communicate) and item.step.kind == kind]


def test_the_correct_program_passes():
    plan = mlp_plan()
    verdict = verify_plan(plan, bytes_moved_price(MESH))
    assert verdict.passed and verdict.first_divergence is None
    assert verdict.summary().startswith("PASS max error ")


def test_dropping_the_all_reduce_of_a_partial_sum_fails_at_its_consumer():
    plan = mlp_plan()
    program = program_of(plan)
    (reduce,) = collectives(program, "all_reduce")
    assert reduce.input.tensor == "h" and reduce.input.sharding.partial_axes == ("x",)
    verdict = simulate_program(without(program, reduce))
    assert not verdict.passed
    d = verdict.first_divergence
    assert (d.op, d.tensor) == ("act", "a")
    assert d.device == (0, 0) and d.index == (0, 0)
    assert d.actual != pytest.approx(d.expected)
    assert verdict.summary().startswith("FAIL at op 'act' device [0, 0]: 'a'[0, 0] = ")


def test_one_corrupted_device_is_named_with_its_op(monkeypatch):
    plan = mlp_plan()
    run_local_op = sim_program.run_local_op

    def corrupt(mesh, op, option, inputs, outputs):
        results = run_local_op(mesh, op, option, inputs, outputs)
        if op.name == "fc2":
            results[0][(1, 0)] = results[0][(1, 0)] + np.float32(0.01)
        return results

    monkeypatch.setattr(sim_program, "run_local_op", corrupt)
    verdict = verify_plan(plan, bytes_moved_price(MESH))
    d = verdict.first_divergence
    assert not verdict.passed and (d.op, d.tensor, d.device) == ("fc2", "y", (1, 0))
    assert d.actual - d.expected == pytest.approx(0.01, rel=1e-3)
    # fc2 splits its rows over y: device (1, 0) holds rows [0, 2) of y
    assert d.index == (0, 0)


def test_an_op_reading_a_range_its_device_lacks_fails_naming_op_and_device():
    # fc2 needs whole rows of `a` split over y; skip the resharding that provides them.
    plan = mlp_plan(act_option=((), ("x",)))
    program = program_of(plan)
    consumer = next(item for item in program.body if isinstance(item, LocalOp) and item.op.name == "fc2")
    feeding = [item for item in program.body if isinstance(item, Communicate) and item.output in consumer.inputs]
    assert feeding, "fc2's input is resharded"
    verdict = simulate_program(without(program, feeding[-1]))
    d = verdict.first_divergence
    assert not verdict.passed and d.op == "fc2" and d.device == (0, 0)
    assert "reads" in d.message and "but the device holds" in d.message


def test_a_collective_over_the_wrong_axis_is_named_with_the_first_wrong_device():
    # `a` is sliced by rows over y for fc2; slicing over x instead gives every device a shard
    # of the right shape, but devices whose x and y coordinates differ hold the wrong rows.
    plan = mlp_plan()
    program = program_of(plan)
    (slicing,) = collectives(program, "all_slice")
    assert slicing.step.mesh_axes == ("y",) and slicing.step.dims["slice_axis"] == 0
    wrong = dataclasses.replace(slicing, step=dataclasses.replace(slicing.step, mesh_axes=("x",)))
    body = tuple(wrong if item is slicing else item for item in program.body)
    verdict = simulate_program(dataclasses.replace(program, body=body))
    d = verdict.first_divergence
    assert not verdict.passed
    assert (d.op, d.tensor, d.device, d.index) == ("all_slice over ['x'] of 'a'", "a", (0, 1), (2, 0))

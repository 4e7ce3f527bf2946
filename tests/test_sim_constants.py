"""A reference holding NaN fails the check, naming the value, instead of matching the same NaN on
every device; a constant whose contents the graph carries is evaluated with them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoshard.errors import InputError
from autoshard.graph.evaluate import random_inputs
from autoshard.graph.schema import graph_from_json, graph_to_json
from autoshard.mesh import Mesh
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding
from autoshard.sim.program import verify_plan

MESH = Mesh.of(x=2)
SCALE = [0.25, 4.0]


def sqrt_document(value: list[float] | None) -> dict:
    """out = x * sqrt(c), with c an input of known contents `value` (None: drawn like any input)."""
    c = {"shape": [2], "dtype": "f32", "role": "input", **({"value": value} if value is not None else {})}
    return {"format": "autoshard.graph/v1", "name": "scaled",
            "tensors": {"x": {"shape": [4, 2], "dtype": "f32", "role": "input"}, "c": c,
                        "r": {"shape": [2], "dtype": "f32"}, "out": {"shape": [4, 2], "dtype": "f32"}},
            "ops": [{"name": "root", "kind": "sqrt", "inputs": ["c"], "outputs": ["r"]},
                    {"name": "scale", "kind": "mul", "inputs": ["x", "r"], "outputs": ["out"]}],
            "outputs": ["out"]}


def sqrt_plan(value: list[float] | None) -> Plan:
    graph = graph_from_json(sqrt_document(value))
    options = {"root": ShardingOption(((),)), "scale": ShardingOption((("x",), ()))}
    return Plan(graph, MESH, options, {"x": Sharding((("x",),)), "c": Sharding()})


def test_a_reference_that_is_nan_for_the_drawn_inputs_is_reported_naming_the_value():
    plan = sqrt_plan(None)
    drawn = random_inputs(plan.graph, seed=1)["c"]
    assert (drawn < 0).any()  # this seed draws a negative c, so sqrt(c) is NaN on every device alike
    with np.errstate(invalid="ignore"):
        verdict = verify_plan(plan, seed=1)
    assert not verdict.passed
    d = verdict.first_divergence
    assert d is not None and d.op == "root" and d.tensor == "r"
    assert "the reference is NaN at" in d.message and "'r'" in d.message


def test_a_constant_under_sqrt_verifies_with_its_own_finite_values():
    plan = sqrt_plan(SCALE)
    inputs = random_inputs(plan.graph, seed=0)
    np.testing.assert_array_equal(inputs["c"], np.array(SCALE, np.float32))
    verdict = verify_plan(plan, seed=0)
    assert verdict.passed, verdict.summary()
    assert verdict.values_checked > 0 and math.isfinite(verdict.max_error)


def test_known_contents_round_trip_through_the_document():
    graph = graph_from_json(sqrt_document(SCALE))
    assert graph.tensors["c"].value == (0.25, 4.0)
    assert graph_to_json(graph)["tensors"]["c"]["value"] == SCALE


@pytest.mark.parametrize("value, problem", [([1.0], "1 values for shape [2], which holds 2"),
                                            ([1.0, float("nan")], "values must be finite")])
def test_contents_that_cannot_be_the_tensors_are_refused(value: list[float], problem: str):
    with pytest.raises(InputError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        graph_from_json(sqrt_document(value))

"""`verify_resharding`: a planned resharding passes step by step; a wrong step is named with its device."""

from __future__ import annotations

import dataclasses

from autoshard.mesh import Mesh
from autoshard.resharding import bytes_moved_price, plan_resharding
from autoshard.sharding import Sharding
from autoshard.sim.reshard_check import verify_resharding

MESH = Mesh.of(x=2, y=3)


def planned(source: str, target: str, shape=(5, 7)):
    return plan_resharding(MESH, shape, 4, Sharding.parse(source), Sharding.parse(target), bytes_moved_price(MESH))


def test_planned_reshardings_pass_with_exact_values():
    for source, target in [('{"split_axes": [["x"]], "partial": {"kind": "sum", "axes": ["y"]}}', "[[y], [x]]"),
                           ("[[x, y]]", "[[], [y, x]]"), ("[[y], [x]]", "[[x], [y]]"), ("[]", "[[], [x]]")]:
        resharding = planned(source, target)
        verdict = verify_resharding(MESH, resharding, "f32", seed=1)
        assert verdict.passed, (source, target, verdict.summary())
        assert verdict.max_error == 0.0 and verdict.values_checked == len(resharding.steps) >= 1


def test_a_step_over_the_wrong_axis_is_named_with_the_first_wrong_device():
    resharding = planned("[]", "[[y]]")
    (step,) = resharding.steps
    assert step.kind == "all_slice" and step.mesh_axes == ("y",)
    # Slicing 5 rows over x (2 ways) instead of y (3 ways) gives shards of the wrong shape.
    wrong = dataclasses.replace(resharding, steps=(dataclasses.replace(step, mesh_axes=("x",)),))
    verdict = verify_resharding(MESH, wrong)
    d = verdict.first_divergence
    assert not verdict.passed and d.op == "step 1: all_slice over ['x']" and d.device == (0, 0)
    assert "holds shape [3, 7]; sharding [[y]] of [5, 7] gives [2, 7]" in d.message


def test_steps_that_stop_short_of_the_target_fail():
    resharding = planned("[[x]]", "[[], [y]]")
    short = dataclasses.replace(resharding, steps=resharding.steps[:-1])
    verdict = verify_resharding(MESH, short)
    assert not verdict.passed and verdict.first_divergence.op == "result"
    assert "not the target [[], [y]]" in verdict.first_divergence.message

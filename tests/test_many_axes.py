"""Meshes of many axes: the options they are offered (consecutive mesh axes per loop, polynomially
many), the interchangeable axes of a placement, and resharding prices worked out once per
renaming of those axes (the same seconds as pair by pair)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from autoshard.graph.schema import load_graph
from autoshard.mesh import Mesh
from autoshard.ops import OP_KINDS
from autoshard.planning.formulation import formulate
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.options import enumerate_options, enumerate_storage
from autoshard.planning.symmetry import consecutive, interchangeable_axes, many_axes
from autoshard.resharding import PricedMoves, resharding_cost
from autoshard.resharding.relabel import representative_pair
from autoshard.sharding import Sharding

EXAMPLE = Path(__file__).parent.parent / "examples" / "mlp.json"
FOUR = Mesh.parse("a=2,b=2,c=2,d=2")  # 16 devices on dgx-h100: a across the 2 nodes, b, c, d on NVLink


def test_three_axes_are_offered_every_option_and_four_only_runs_of_consecutive_axes():
    matmul = OP_KINDS["matmul"].loops([(8, 64), (64, 256)], {})
    assert not many_axes(Mesh.parse("a=2,b=2,c=2")) and many_axes(FOUR)
    assert not many_axes(Mesh.parse("a=2,b=2,c=2,d=1"))  # axes of size 1 change nothing
    every = enumerate_options(matmul, FOUR)
    runs = enumerate_options(matmul, FOUR, runs=True)
    assert len(every) == 661 and len(runs) == 162  # 163 ways of disjoint runs, less one split m=8 over 16
    assert runs == [o for o in every if consecutive(o.loop_axes, FOUR)]  # the same order, replicated first
    assert all(consecutive(o.loop_axes, FOUR) for o in runs)
    assert consecutive([("b", "c"), ("a",), ("d",)], FOUR) and not consecutive([("a", "c")], FOUR)
    assert not consecutive([("c", "b")], FOUR)
    stored = enumerate_storage((64, 256), FOUR, runs=True)
    assert Sharding((("c", "d"), ("a", "b"))) in stored and Sharding((("b", "d"),)) not in stored


def test_interchangeable_axes_are_those_of_one_size_on_the_same_links():
    assert interchangeable_axes(FOUR, bind_hardware("dgx-h100", FOUR)) == (("b", "c", "d"),)
    five = Mesh.parse("a=2,b=2,c=2,d=2,e=2")  # 4 nodes: a and b split the nodes, c, d, e the GPUs
    assert interchangeable_axes(five, bind_hardware("dgx-h100", five)) == (("a", "b"), ("c", "d", "e"))
    three = Mesh.parse("a=2,b=2,c=2")
    assert interchangeable_axes(three, bind_hardware("dgx-h100", three)) == ()  # priced pair by pair, as before
    torus = Mesh.parse("a=2,b=2,c=2,d=2")
    assert interchangeable_axes(torus, bind_hardware("tpu-v5p", torus)) == ()


def test_a_many_axis_formulation_offers_runs_and_a_pinned_op_every_option():
    document = json.loads(EXAMPLE.read_text())
    document["constraints"] = [{"tensor": "layer0.fc1", "split_axes": [["c", "b"]], "required": True}]
    graph = load_graph(document, FOUR)
    formulation = formulate(graph, FOUR, bind_hardware("dgx-h100", FOUR))
    for (kind, name), choices in zip(formulation.nodes, formulation.choices):
        if kind == "storage":
            assert all(consecutive(s.split_axes, FOUR) for s in choices), name
        elif name != "layer0.fc1":
            assert all(consecutive(o.loop_axes, FOUR) for o in choices), name
    pinned = formulation.choices[formulation.nodes.index(("op", "layer0.fc1"))]
    assert pinned and all(o.loop_axes[0] == ("c", "b") for o in pinned)


def _random_sharding(rng: random.Random, mesh: Mesh, shape: tuple[int, ...], partial: bool) -> Sharding:
    axes = list(mesh.axis_names)
    rng.shuffle(axes)
    split: list[list[str]] = [[] for _ in shape]
    rest = []
    for axis in axes:
        slot = rng.randrange(len(shape) + 1)
        (split[slot] if slot < len(shape) else rest).append(axis)
    return Sharding(tuple(tuple(s) for s in split), tuple(a for a in rest if partial and rng.random() < 0.5))


def test_a_renamed_pair_costs_the_seconds_of_the_pair_itself():
    hw = bind_hardware("dgx-h100", FOUR)
    classes = interchangeable_axes(FOUR, hw)
    shape = (8, 16)
    rng = random.Random(7)
    shared = PricedMoves(hw.collective_seconds, classes)
    for _ in range(60):
        source = _random_sharding(rng, FOUR, shape, partial=True)
        target = _random_sharding(rng, FOUR, shape, partial=False)
        alone = resharding_cost(FOUR, shape, 2, source, target, PricedMoves(hw.collective_seconds))
        renamed = resharding_cost(FOUR, shape, 2, source, target, shared)
        assert renamed[0] == alone[0], (source, target)


def test_pairs_that_differ_by_a_renaming_have_one_representative():
    classes = (("b", "c", "d"),)
    source, target = Sharding((("d",), ("a", "c")), ("b",)), Sharding((("c", "d"),))
    swapped = {"b": "c", "c": "d", "d": "b"}

    def rename(s: Sharding) -> Sharding:
        return Sharding(tuple(tuple(swapped.get(a, a) for a in axes) for axes in s.split_axes),
                        tuple(sorted((swapped.get(a, a) for a in s.partial_axes), key=FOUR.axis_index)))

    first = representative_pair(FOUR, source, target, classes)
    assert first == representative_pair(FOUR, rename(source), rename(target), classes)
    assert first == (Sharding((("b",), ("a", "c")), ("d",)), Sharding((("c", "b"),)))
    assert representative_pair(FOUR, source, target, ()) == (source, target)

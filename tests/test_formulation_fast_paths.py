"""The fast paths of formulation give what the direct computation gives.

Resharding prices come from moves priced once per state and one Dijkstra tree per start shared
by every goal; the formulation computes each distinct node signature and each distinct edge
once for all identical layers. Here every price and every problem entry is checked against
`plan_resharding` run afresh and against node costs computed op by op."""

from __future__ import annotations

import itertools

import pytest

from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.planning.costs import op_cost, result_bytes, tensor_bytes
from autoshard.planning.formulation import DELIVER, PICOSECONDS, TIE_BREAK_PS_PER_BYTE, WRITE_BACK, Weights, formulate
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.options import enumerate_storage, operand_shardings, result_shardings
from autoshard.resharding import PricedMoves, bytes_moved_price, plan_resharding, resharding_cost
from autoshard.solver import FORBIDDEN_COST
from autoshard.sharding import Sharding


def slow_price(mesh, shape, itemsize, source, target, price) -> tuple[float, float]:
    r = plan_resharding(mesh, shape, itemsize, source, target, price)
    return r.seconds, float(sum(s.bytes_per_device for s in r.steps if s.kind != "all_slice"))


def scalar_cost(seconds: float, comm_bytes: float, memory: float, w: Weights) -> int:
    """The objective's definition, one value at a time (the formulation computes whole arrays)."""
    return int(round(seconds * PICOSECONDS * w.time + comm_bytes * PICOSECONDS * w.comm_s_per_byte
                     + memory * (w.memory_s_per_byte * PICOSECONDS + TIE_BREAK_PS_PER_BYTE)))


def with_partial(mesh: Mesh, shardings: list[Sharding], kind: str) -> list[Sharding]:
    """Each sharding made partial over every nonempty set of the axes it leaves unused."""
    out = []
    for s in shardings:
        free = [a for a in mesh.axis_names if a not in s.used_axes()]
        for k in range(1, len(free) + 1):
            out += [Sharding(s.split_axes, axes, kind) for axes in itertools.combinations(free, k)]
    return out


CASES = [
    # mesh, shape: even, uneven (5 over 3), a dim too short for some splits, three axes
    ("a=2,b=3", (6, 5)),
    ("a=2,b=2,c=2", (4, 6)),
    ("x=4,y=2", (8, 3, 2)),
]


@pytest.mark.parametrize("mesh_text,shape", CASES)
@pytest.mark.parametrize("pricing", ["ring", "dgx"])
def test_shared_resharding_prices_equal_fresh_plans(mesh_text, shape, pricing):
    mesh = Mesh.parse(mesh_text)
    price = bytes_moved_price(mesh) if pricing == "ring" else bind_hardware("dgx-h100", mesh).collective_seconds
    targets = enumerate_storage(shape, mesh)
    sources = targets + with_partial(mesh, targets[:12], "sum") + with_partial(mesh, targets[:4], "max")
    moves = PricedMoves(price)  # shared by every pair, in the order a formulation asks
    for source in sources:
        for target in targets + [Sharding(t.split_axes, (), "max") for t in targets[:3]]:
            if source == target:
                continue
            assert resharding_cost(mesh, shape, 2, source, target, moves) == slow_price(mesh, shape, 2, source, target, price), \
                (source, target)


def test_plans_with_shared_moves_equal_fresh_plans():
    mesh = Mesh.parse("a=2,b=3")
    price = bind_hardware("dgx-h100", mesh).collective_seconds
    moves = PricedMoves(price)
    shardings = enumerate_storage((6, 10), mesh)
    for source, target in itertools.product(shardings[::3], shardings):
        shared = plan_resharding(mesh, (6, 10), 4, source, target, price, moves)
        assert shared == plan_resharding(mesh, (6, 10), 4, source, target, price)


def test_offsets_sources_price_as_fresh_plans():
    mesh = Mesh.parse("a=2,b=2")
    uneven = Sharding((("a",),), dims_offsets=((0, 1, 6),))
    moves = PricedMoves(bytes_moved_price(mesh))
    for target in enumerate_storage((6, 4), mesh):
        assert resharding_cost(mesh, (6, 4), 4, uneven, target, moves) == slow_price(mesh, (6, 4), 4, uneven, target, bytes_moved_price(mesh))


def test_formulation_of_repeated_layers_equals_the_direct_computation():
    mesh = Mesh.parse("a=2,b=2")
    graph = graph_from_json(gpt(GPTConfig(layers=2, hidden=32, heads=2, seq=8, batch=4, vocab=20, style="llama"), training=True))
    hw = bind_hardware("dgx-h100", mesh)
    weights = Weights(comm_s_per_byte=1e-15)
    formulation = formulate(graph, mesh, hw, weights=weights)
    problem = formulation.problem
    slow: dict[tuple, tuple[float, float]] = {}

    def price(tensor, source, target):
        if source == target:
            return 0.0, 0.0
        key = (tensor.shape, tensor.itemsize, source, target)
        if key not in slow:
            slow[key] = slow_price(mesh, tensor.shape, tensor.itemsize, source, target, hw.collective_seconds)
        return slow[key]

    for (kind, name), choices, costs, usages in zip(formulation.nodes, formulation.choices, problem.node_costs,
                                                     problem.node_usages):
        if kind == "storage":
            tensor = graph.tensors[name]
            held = [tensor_bytes(tensor.shape, tensor.itemsize, s, mesh) for s in choices]
            assert choices == enumerate_storage(tensor.shape, mesh)
            assert usages.tolist() == held
            assert costs.tolist() == [scalar_cost(0.0, 0.0, b, weights) for b in held]
            continue
        if kind == "delivered":  # where a value read twice is resharded to once: it costs and holds nothing
            assert costs.tolist() == usages.tolist() == [0] * len(choices)
            continue
        op = graph.op_by_name[name]
        expected_costs, expected_usages = [], []
        for option in choices:
            seconds, comm = op_cost(graph, op, option, mesh, hw).seconds, 0.0
            for t, s in zip(op.outputs, result_shardings(op.nest, option)):
                if t in graph.outputs and graph.tensors[t].updates is None:
                    r_s, r_b = price(graph.tensors[t], s, s.without_partial())
                    seconds, comm = seconds + r_s, comm + r_b
            held = result_bytes(graph, op, option, mesh)
            expected_costs.append(scalar_cost(seconds, comm, held, weights))
            expected_usages.append(held)
        assert costs.tolist() == expected_costs, name
        assert usages.tolist() == expected_usages, name

    delivered = 0
    for (u, v), matrix, (t, consumer, i) in zip(problem.edges, problem.edge_costs, formulation.uses):
        tensor = graph.tensors[t]
        kind, name = formulation.nodes[u]
        producer = graph.producers.get(t)
        sources = (formulation.choices[u] if kind in ("storage", "delivered") else
                   [result_shardings(producer.nest, o)[producer.outputs.index(t)] for o in formulation.choices[u]])
        if i == DELIVER:  # into the delivered node; a partial sharding only as produced
            delivered += 1
            assert formulation.nodes[v] == ("delivered", t)
            expected = [[0 if s == d else FORBIDDEN_COST if d.is_partial else scalar_cost(*price(tensor, s, d), 0.0, weights)
                         for d in formulation.choices[v]] for s in sources]
            assert matrix.tolist() == expected, t
            continue
        if i == WRITE_BACK:  # a value written in place, into its old value's storage
            assert graph.tensors[t].updates == consumer and formulation.nodes[v] == ("storage", consumer)
            targets = formulation.choices[v]
        else:
            targets = [operand_shardings(graph.op_by_name[consumer].nest, o)[i] for o in formulation.choices[v]]
        expected = [[scalar_cost(*price(tensor, s, d), 0.0, weights) for d in targets] for s in sources]
        assert matrix.tolist() == expected, (t, consumer, i)
    assert delivered == sum(kind == "delivered" for kind, _ in formulation.nodes) > 0


def test_a_table_is_priced_without_cyclic_garbage_collection_and_leaves_it_as_it_was():
    import gc

    from autoshard.planning.formulation import ReshardingPrices

    mesh = Mesh(("a", "b"), (2, 2))
    collecting = []

    def price(kind, axes, bytes_per_device):
        collecting.append(gc.isenabled())
        return 1e-6 + bytes_per_device * 1e-12

    prices = ReshardingPrices(mesh, price)
    sources = [Sharding((("a",),)), Sharding(((), ("b",)))]
    targets = [Sharding((("b",),)), Sharding()]
    assert gc.isenabled()
    seconds, _ = prices.table((8, 8), 4, sources, targets)
    assert collecting and not any(collecting) and gc.isenabled() and (seconds > 0).all()
    gc.disable()
    try:
        ReshardingPrices(mesh, price).table((8, 8), 4, sources, targets)
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()

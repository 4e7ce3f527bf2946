"""Node numbering of the formulation: the order the memory relaxation decodes in."""

from autoshard.graph.model import topological_order
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.planning.formulation import formulate
from autoshard.planning.hardware import bind_hardware


def test_every_stored_tensor_follows_its_first_consumer():
    graph = graph_from_json(gpt(GPTConfig(layers=1, hidden=64, heads=4, seq=16, batch=4, vocab=128), training=True))
    mesh = Mesh.parse("dp=2,tp=2")
    formulation = formulate(graph, mesh, bind_hardware("dgx-h100", mesh))
    position = {name: i for i, (kind, name) in enumerate(formulation.nodes) if kind != "delivered"}
    ops = topological_order(graph)
    stored = [t for t in graph.tensors.values() if t.role != "intermediate"]
    kinds = [kind for kind, _ in formulation.nodes]
    assert sorted(k for k in kinds if k != "delivered") == sorted(["op"] * len(ops) + ["storage"] * len(stored))
    # a value read twice has a delivered node, before the first op after the value's node
    delivered = [(i, name) for i, (kind, name) in enumerate(formulation.nodes) if kind == "delivered"]
    assert delivered
    for i, name in delivered:
        holder = position[name if name in position else graph.producers[name].name]
        assert holder < i and "op" not in kinds[holder + 1:i], name
    assert [position[op.name] for op in ops] == sorted(position[op.name] for op in ops)  # ops in program order
    for tensor in stored:
        first = next(op for op in ops if tensor.name in op.inputs)
        assert position[tensor.name] > position[first.name], tensor.name
        # only the first consumer's other stored inputs may come between the two
        between = formulation.nodes[position[first.name] + 1:position[tensor.name]]
        assert all(kind == "storage" and name in first.inputs for kind, name in between), tensor.name

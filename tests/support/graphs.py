"""Small graphs and plans shared by the SPMD, MLIR and collective tests, and a per-device runner
that checks a partitioned program against the unsharded graph."""

from __future__ import annotations

from typing import Any

import numpy as np

from autoshard.graph.evaluate import evaluate_graph, random_inputs
from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.ops import Block, evaluate_block
from autoshard.planning.options import ShardingOption, enumerate_options, enumerate_storage
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding, ceildiv
from autoshard.sim.attention import combine_key_blocks, splits_keys
from autoshard.sim.layout import assemble, distribute
from autoshard.sim.reshard_exec import apply_step
from autoshard.spmd.program import Communicate, LocalOp, SpmdProgram, partition

O, S = ShardingOption, Sharding
F = "f32"


def graph_doc(name: str, tensors: dict[str, tuple], ops: list[tuple], outputs: list[str] | None = None,
              constraints: list[dict] | None = None) -> dict[str, Any]:
    """tensors: name -> (shape, dtype[, role]); ops: (name, kind, inputs, outputs, attrs)."""
    return {"format": "autoshard.graph/v1", "name": name,
            "tensors": {k: {"shape": list(v[0]), "dtype": v[1], **({"role": v[2]} if len(v) > 2 else {})}
                        for k, v in tensors.items()},
            "ops": [{"name": n, "kind": k, "inputs": i, "outputs": o, **a} for n, k, i, o, a in ops],
            **({"outputs": outputs} if outputs else {}), **({"constraints": constraints} if constraints else {})}


MLP = graph_doc("mlp", {"x": ((8, 16), F, "input"), "w1": ((16, 32), F, "parameter"), "w2": ((32, 16), F, "parameter"),
                        "h": ((8, 32), F), "a": ((8, 32), F), "y": ((8, 16), F)},
                [("fc1", "matmul", ["x", "w1"], ["h"], {}), ("act", "gelu", ["h"], ["a"], {}),
                 ("fc2", "matmul", ["a", "w2"], ["y"], {})])


# One small graph per family of op kinds; together they use every kind of the op table.
ZOO: dict[str, dict[str, Any]] = {
    "mlp": MLP,
    "reduction": graph_doc(
        "reduction", {"x": ((8, 12), F, "input"), "s": ((8,), F), "m": ((8,), F), "mean": ((1, 12), F), "total": ((), F)},
        [("rowsum", "reduce_sum", ["x"], ["s"], {"dims": [1]}), ("rowmax", "reduce_max", ["x"], ["m"], {"dims": [1]}),
         ("colmean", "reduce_mean", ["x"], ["mean"], {"dims": [0], "keepdims": True}),
         ("all", "reduce_sum", ["s"], ["total"], {})], ["m", "mean", "total"]),
    "chain": graph_doc(
        "chain", {"x": ((8, 16), F, "input"), "b": ((16,), F, "parameter"), "y": ((8, 16), F), "e": ((8, 16), F),
                  "z": ((8, 16), F), "c": ((8, 16), "bf16"), "i": ((8, 16), "i32", "input"), "j": ((8, 16), "i32")},
        [("bias", "add", ["x", "b"], ["y"], {}), ("exp", "exp", ["y"], ["e"], {}), ("mul", "mul", ["e", "x"], ["z"], {}),
         ("cast", "cast", ["z"], ["c"], {"dtype": "bf16"}), ("iabs", "abs", ["i"], ["j"], {})], ["c", "j"]),
    "transpose": graph_doc("transpose", {"x": ((4, 6, 8), F, "input"), "t": ((8, 4, 6), F)},
                           [("tr", "transpose", ["x"], ["t"], {"perm": [2, 0, 1]})]),
    "reshape": graph_doc(
        "reshape", {"x": ((8, 4, 6), F, "input"), "m": ((8, 24), F), "s": ((8, 2, 12), F), "r": ((16, 12), F)},
        [("merge", "reshape", ["x"], ["m"], {"shape": [8, 24]}), ("split", "reshape", ["m"], ["s"], {"shape": [8, 2, 12]}),
         ("mixed", "reshape", ["m"], ["r"], {"shape": [16, 12]})], ["s", "r"]),
    "softmax": graph_doc("softmax", {"x": ((8, 16), F, "input"), "p": ((8, 16), F)},
                         [("sm", "softmax", ["x"], ["p"], {"axis": 1})]),
    "norms": graph_doc(
        "norms", {"x": ((6, 8), F, "input"), "g": ((8,), F, "parameter"), "beta": ((8,), F, "parameter"),
                  "ln": ((6, 8), F), "rms": ((6, 8), F)},
        [("ln", "layer_norm", ["x", "g", "beta"], ["ln"], {}), ("rms", "rms_norm", ["ln", "g"], ["rms"], {})]),
    "attention": graph_doc(
        "attention", {"q": ((2, 2, 4, 8), F, "input"), "k": ((2, 2, 6, 8), F, "input"), "v": ((2, 2, 6, 4), F, "input"),
                      "o": ((2, 2, 4, 4), F)},
        [("sdpa", "attention", ["q", "k", "v"], ["o"], {"causal": True})]),
    "masks": graph_doc(
        "masks", {"q": ((2, 2, 4, 8), F, "input"), "k": ((2, 2, 6, 8), F, "input"), "v": ((2, 2, 6, 4), F, "input"),
                  "bias": ((4, 6), F, "input"), "low": ((4, 6), F, "input"), "rows": ((4, 6), "i32"), "cols": ((4, 6), "i32"), "seen": ((4, 6), "bool"),
                  "up": ((4, 6), "bool"), "which": ((4, 6), "i32"), "add": ((4, 6), F), "o": ((2, 2, 4, 4), F),
                  "ob": ((2, 2, 4, 4), F), "padded": ((2, 2, 6, 4), F)},
        [("rows", "iota", [], ["rows"], {"shape": [4, 6], "dimension": 0, "dtype": "i32"}),
         ("cols", "iota", [], ["cols"], {"shape": [4, 6], "dimension": 1, "dtype": "i32"}),
         ("seen", "compare", ["cols", "rows"], ["seen"], {"direction": "le"}),
         ("up", "compare", ["bias", "low"], ["up"], {"direction": "gt"}),
         ("which", "cast", ["seen"], ["which"], {"dtype": "i32"}),
         ("add", "select", ["which", "low", "bias"], ["add"], {}),
         ("sdpa", "attention", ["q", "k", "v", "add"], ["o"], {}),
         ("sdpa_bool", "attention", ["q", "k", "v", "seen"], ["ob"], {}),
         ("pad", "pad", ["o"], ["padded"], {"low": [0, 0, 1, 0], "high": [0, 0, 1, 0]})], ["padded", "ob", "up"]),
    "routing": graph_doc(
        "routing", {"x": ((8, 6), F, "input"), "router": ((6, 4), F, "parameter"), "logits": ((8, 4), F), "probs": ((8, 4), F),
                    "top": ((8, 2), F), "ids": ((8, 2), "i64"), "hot": ((8, 2, 4), F), "combine": ((8, 4), F),
                    "up": ((4, 6, 10), F, "parameter"), "h": ((8, 4, 10), F), "a": ((8, 4, 10), F),
                    "down": ((4, 10, 6), F, "parameter"), "y": ((4, 8, 6), F), "out": ((8, 6), F)},
        [("route", "matmul", ["x", "router"], ["logits"], {}),
         ("gates", "softmax", ["logits"], ["probs"], {}),
         ("top", "top_k_values", ["probs"], ["top"], {"k": 2}),
         ("ids", "top_k_indices", ["probs"], ["ids"], {"k": 2}),
         ("hot", "one_hot", ["ids"], ["hot"], {"num_classes": 4, "dtype": F}),
         ("combine", "dot_general", ["top", "hot"], ["combine"], {"lhs_batch_dims": [0], "rhs_batch_dims": [0],
                                                                   "lhs_contracting_dims": [1], "rhs_contracting_dims": [1]}),
         ("up", "dot_general", ["x", "up"], ["h"], {"lhs_contracting_dims": [1], "rhs_contracting_dims": [1]}),
         ("act", "silu", ["h"], ["a"], {}),
         ("down", "dot_general", ["a", "down"], ["y"], {"lhs_batch_dims": [1], "rhs_batch_dims": [0],
                                                         "lhs_contracting_dims": [2], "rhs_contracting_dims": [1]}),
         ("out", "dot_general", ["combine", "y"], ["out"], {"lhs_batch_dims": [0], "rhs_batch_dims": [1],
                                                             "lhs_contracting_dims": [1], "rhs_contracting_dims": [0]})],
        ["out"]),
    "conv": graph_doc(
        "conv", {"x": ((2, 6, 6, 4), F, "input"), "w": ((3, 3, 4, 8), F, "parameter"), "y": ((2, 3, 3, 8), F)},
        [("conv", "conv2d", ["x", "w"], ["y"], {"strides": [2, 2], "padding": [[1, 1], [1, 1]]})]),
    "embedding": graph_doc(
        "embedding", {"ids": ((4, 6), "i32", "input"), "table": ((16, 8), F, "parameter"), "e": ((4, 6, 8), F)},
        [("lookup", "embedding", ["ids", "table"], ["e"], {})]),
    "structural": graph_doc(
        "structural", {"a": ((4, 6), F, "input"), "b": ((4, 2), F, "input"), "c": ((4, 8), F), "s": ((4, 3), F),
                       "r": ((4,), F, "input"), "bc": ((3, 4), F)},
        [("cat", "concat", ["a", "b"], ["c"], {"axis": 1}),
         ("cut", "slice", ["c"], ["s"], {"starts": [0, 1], "limits": [4, 7], "strides": [1, 2]}),
         ("bcast", "broadcast_in_dim", ["r"], ["bc"], {"shape": [3, 4], "broadcast_dimensions": [1]})], ["s", "bc"]),
    "contractions": graph_doc(
        "contractions", {"a": ((2, 4, 6), F, "input"), "b": ((2, 6, 8), F, "input"), "c": ((2, 4, 8), F),
                         "w": ((8, 4), F, "parameter"), "d": ((2, 4, 4), F), "rows": ((2, 4), F)},
        [("bmm", "batch_matmul", ["a", "b"], ["c"], {}),
         ("dg", "dot_general", ["c", "w"], ["d"], {"lhs_contracting_dims": [2], "rhs_contracting_dims": [0]}),
         ("rowsum", "generic", ["d"], ["rows"], {"iterator_types": ["parallel", "parallel", "reduction"],
                                                  "indexing_maps": ["(d0, d1, d2) -> (d0, d1, d2)", "(d0, d1, d2) -> (d0, d1)"],
                                                  "payload": "add"})], ["rows"]),
}


MESHES = ("x=2,y=2", "x=3,y=2", "x=4", "x=2,y=2,z=2")


def cycled_plans(graph: Graph, mesh: Mesh, count: int) -> list[Plan]:
    """`count` deterministic plans: plan k gives op i its option number k*(i+3) and stored tensor i
    its storage number k*(i+2) (modulo how many there are), so plans mix splits, partial
    reductions, uneven shards and reshardings of every kind."""
    plans = []
    for k in range(count):
        options = {}
        for i, op in enumerate(graph.ops):
            choices = enumerate_options(op.nest, mesh)
            options[op.name] = choices[(k * (i + 3)) % len(choices)]
        stored = [t for t in graph.tensors.values() if t.role != "intermediate"]
        storage = {t.name: enumerate_storage(t.shape, mesh)[(k * (i + 2)) % len(enumerate_storage(t.shape, mesh))]
                   for i, t in enumerate(stored)}
        plans.append(Plan(graph, mesh, options, storage))
    return plans


def zoo_programs(meshes=MESHES, count: int = 4) -> list[tuple[str, SpmdProgram]]:
    programs = []
    for text in meshes:
        mesh = Mesh.parse(text)
        for name, doc in ZOO.items():
            graph = graph_from_json(doc, mesh)
            programs += [(f"{name}@{text}#{k}", partition(plan)) for k, plan in enumerate(cycled_plans(graph, mesh, count))]
    return programs


def device_block(mesh: Mesh, op: LocalOp, device: tuple[int, ...]) -> Block:
    starts, sizes = [], []
    for extent, axes in zip(op.op.nest.extents, op.option.loop_axes):
        step = ceildiv(extent, mesh.group_size(axes))
        start = min(mesh.in_group_linear(device, axes) * step, extent)
        starts.append(start)
        sizes.append(min(start + step, extent) - start)
    return Block(tuple(starts), tuple(sizes), op.op.nest.extents)


def run_program(program: SpmdProgram, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every device runs the body; returns each result assembled from the devices' shards."""
    mesh = program.mesh
    env = {v.id: distribute(inputs[v.tensor], mesh, v.sharding) for v in program.arguments}
    for instruction in program.body:
        if isinstance(instruction, Communicate):
            env[instruction.output.id] = apply_step(env[instruction.input.id], mesh, instruction.input.shape,
                                                    instruction.step)
            continue
        nest = instruction.op.nest
        results: list[dict] = [{} for _ in instruction.outputs]
        blocks, cuts = {}, {}
        for device in mesh.devices():
            block = blocks[device] = device_block(mesh, instruction, device)
            assert 0 not in block.sizes, "the zoo's options leave no device without work"
            cut = cuts[device] = []
            for value, map_ in zip(instruction.inputs, nest.input_maps):
                need = nest.operand_range(map_, block, value.shape)
                held = value.sharding.device_box(mesh, value.shape, device)  # halos included
                cut.append(env[value.id][device][tuple(slice(n.start - start, n.stop - start)
                                                       for n, (start, _) in zip(need, held))])
        if splits_keys(instruction.op, instruction.option):  # the key blocks meet in the op's own combine
            dtype = next(iter(cuts.values()))[0].dtype
            results[0] = combine_key_blocks(mesh, instruction.op, instruction.option, blocks, cuts, dtype)
        else:
            for device, block in blocks.items():
                for k, result in enumerate(evaluate_block(instruction.op.op_kind, nest, instruction.op.attrs,
                                                          cuts[device], block)):
                    results[k][device] = np.asarray(result)
        for value, shards in zip(instruction.outputs, results):
            env[value.id] = shards
    return {v.tensor: assemble(env[v.id], mesh, v.sharding, v.shape) for v in program.results}


def assert_runs_like_the_graph(program: SpmdProgram, seed: int = 0) -> None:
    inputs = random_inputs(program.graph, seed)
    reference = evaluate_graph(program.graph, inputs)
    for name, value in run_program(program, inputs).items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-4, atol=1e-5, err_msg=name)


def megatron(mesh: Mesh = Mesh.of(dp=2, tp=4)) -> Plan:
    graph = graph_from_json(MLP, mesh)
    return Plan(graph, mesh, {"fc1": O((("dp",), ("tp",), ())), "act": O((("dp",), ("tp",))),
                              "fc2": O((("dp",), (), ("tp",)))},
                {"x": S((("dp",),)), "w1": S(((), ("tp",))), "w2": S((("tp",),))})


def mlp2d() -> Plan:
    """The seeds' 2-D weight-stationary MLP on a 2x2x2 mesh."""
    mesh = Mesh.of(a=2, b=2, c=2)
    graph = graph_from_json(graph_doc(
        "mlp_2d_weight_stationary",
        {"x": ((2, 4, 8), "f32", "input"), "w1": ((8, 32), "f32", "parameter"), "w2": ((32, 8), "f32", "parameter"),
         "h": ((2, 4, 32), "f32"), "r": ((2, 4, 32), "f32"), "y": ((2, 4, 8), "f32")},
        [("fc1", "matmul", ["x", "w1"], ["h"], {}), ("relu", "relu", ["h"], ["r"], {}),
         ("fc2", "matmul", ["r", "w2"], ["y"], {})],
        constraints=[{"tensor": "y", "split_axes": [[], [], ["a", "b", "c"]]}]), mesh)
    return Plan(graph, mesh, {"fc1": O(((), (), ("b", "c"), ("a",))), "relu": O(((), (), ("b", "c"))),
                              "fc2": O(((), (), ("a",), ("b", "c")))},
                {"x": S(((), (), ("a", "b", "c"))), "w1": S((("a",), ("b", "c"))), "w2": S((("b", "c"), ("a",)))})

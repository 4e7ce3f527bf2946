"""Property tests: random small graphs under random legal plans, partitioned and simulated on every
device, equal the unsharded reference; so do the planner's own plans.

Graphs grow op by op from the op table (elementwise, matmul and its relatives, reductions,
transpose, reshape, normalisations, concat, slice, broadcast, cast, embedding, attention,
conv2d) on small shapes whose sizes rarely divide the mesh axes, so uneven shards are common.
Each op takes a random option of `enumerate_options`, each stored tensor a random sharding of
`enumerate_storage`, and some outputs a pinned sharding.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from autoshard.errors import InfeasibleError
from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, MLPConfig, MoEConfig, gpt, moe
from autoshard.models import mlp as mlp_model
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.options import ShardingOption, enumerate_options, enumerate_storage
from autoshard.planning.plan import Plan
from autoshard.resharding import bytes_moved_price
from autoshard.sharding import Sharding
from autoshard.sim.program import held_elements, simulate_program, verify_plan
from autoshard.spmd.program import Value, partition
from support.graphs import zoo_programs

MESHES = [Mesh.of(x=2), Mesh.of(x=4), Mesh.of(x=2, y=2), Mesh.of(x=3, y=2), Mesh.of(x=2, y=2, z=2)]

FLOAT_UNARY = ("neg", "abs", "tanh", "relu", "gelu", "sigmoid", "silu", "exp", "square")
INT_UNARY = ("neg", "abs", "relu", "square")
BINARY = ("add", "sub", "mul", "max", "min")
# Ops that need float values (normalisations, softmax, means, attention and the like).
FLOAT_ONLY = {"softmax", "layer_norm", "rms_norm", "reduce_mean", "attention", "embedding", "conv2d"}
DIM = st.sampled_from([2, 3, 4, 5, 6, 7, 1])  # mostly sizes the mesh axes split, often unevenly


class GraphBuilder:
    """A graph document grown one op at a time; tensor names t0, t1, ..."""

    def __init__(self, draw: Any, dtype: str):
        self.draw, self.dtype = draw, dtype
        self.tensors: dict[str, dict[str, Any]] = {}
        self.ops: list[dict[str, Any]] = []
        self.produced: list[str] = []

    def tensor(self, shape: tuple[int, ...], role: str = "intermediate", dtype: str | None = None) -> str:
        name = f"t{len(self.tensors)}"
        self.tensors[name] = {"shape": list(shape), "dtype": dtype or self.dtype, "role": role}
        if role != "parameter":
            self.produced.append(name)
        return name

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name]["shape"])

    def op(self, kind: str, inputs: list[str], out_shape: tuple[int, ...], out_dtype: str | None = None,
           **attrs: Any) -> str:
        out = self.tensor(out_shape, dtype=out_dtype)
        self.ops.append({"name": f"{kind}{len(self.ops)}", "kind": kind, "inputs": inputs, "outputs": [out], **attrs})
        return out

    def new_shape(self, rank: int) -> tuple[int, ...]:
        return tuple(self.draw(DIM) for _ in range(rank))

    def pick(self, min_rank: int = 0, max_rank: int = 4) -> str | None:
        """A recent value (mostly the latest, so chains form; sometimes an older one: a DAG)."""
        fits = [t for t in self.produced if min_rank <= len(self.shape(t)) <= max_rank
                and self.tensors[t]["dtype"] == self.dtype]
        if not fits:
            return None
        return fits[-1] if self.draw(st.booleans()) else self.draw(st.sampled_from(fits))

    def document(self, outputs: list[str], constraints: list[dict[str, Any]]) -> dict[str, Any]:
        return {"format": "autoshard.graph/v1", "name": "random", "tensors": self.tensors, "ops": self.ops,
                "outputs": outputs, "constraints": constraints}


def grow(b: GraphBuilder, kind: str) -> None:
    """Add one op of `kind` if some value fits it."""
    draw = b.draw
    if kind == "unary":
        x = b.pick()
        if x is None:
            return
        b.op(draw(st.sampled_from(FLOAT_UNARY if b.dtype.startswith("f") else INT_UNARY)), [x], b.shape(x))
    elif kind == "binary":
        x = b.pick()
        if x is None:
            return
        shape = b.shape(x)
        same = [t for t in b.produced if b.shape(t) == shape and b.tensors[t]["dtype"] == b.dtype]
        choice = draw(st.sampled_from(["value", "parameter", "bias", "ones"]))
        if choice == "value":
            other = draw(st.sampled_from(same))
        elif choice == "bias" and shape:
            other = b.tensor(shape[-1:], "parameter")
        elif choice == "ones" and shape:
            other = b.tensor(tuple(1 if draw(st.booleans()) else s for s in shape), "parameter")
        else:
            other = b.tensor(shape, "parameter")
        args = [x, other] if draw(st.booleans()) else [other, x]
        b.op(draw(st.sampled_from(BINARY)), args, shape)
    elif kind == "matmul":
        x = b.pick(min_rank=2, max_rank=3)
        if x is None:
            return
        shape = b.shape(x)
        w = b.tensor((shape[-1], draw(DIM)), "parameter")
        b.op("matmul", [x, w], shape[:-1] + (b.shape(w)[1],))
    elif kind == "batch_matmul":
        x = b.pick(min_rank=3, max_rank=3)
        if x is None:
            return
        bb, m, k = b.shape(x)
        w = b.tensor((bb, k, draw(DIM)), "parameter")
        b.op("batch_matmul", [x, w], (bb, m, b.shape(w)[2]))
    elif kind == "dot_general":
        x = b.pick(min_rank=2, max_rank=2)
        if x is None:
            return
        k, m = b.shape(x)
        w = b.tensor((k, draw(DIM)), "parameter")
        b.op("dot_general", [x, w], (m, b.shape(w)[1]), lhs_contracting_dims=[0], rhs_contracting_dims=[0])
    elif kind.startswith("reduce_"):
        x = b.pick(min_rank=1)
        if x is None:
            return
        shape = b.shape(x)
        dims = sorted(draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)))
        keep = draw(st.booleans())
        out = tuple(1 if d in dims else s for d, s in enumerate(shape) if keep or d not in dims)
        b.op(kind, [x], out, dims=dims, keepdims=keep)
    elif kind == "transpose":
        x = b.pick(min_rank=2)
        if x is None:
            return
        shape = b.shape(x)
        perm = draw(st.permutations(range(len(shape))))
        b.op("transpose", [x], tuple(shape[p] for p in perm), perm=list(perm))
    elif kind == "reshape":
        x = b.pick(min_rank=1, max_rank=3)
        if x is None:
            return
        shape = list(b.shape(x))
        d = draw(st.integers(0, len(shape) - 1))
        if d + 1 < len(shape) and draw(st.booleans()):
            new = shape[:d] + [shape[d] * shape[d + 1]] + shape[d + 2:]  # merge two dims
        else:
            factor = draw(st.sampled_from([f for f in range(1, shape[d] + 1) if shape[d] % f == 0]))
            new = shape[:d] + [shape[d] // factor, factor] + shape[d + 1:]  # split one
        b.op("reshape", [x], tuple(new), shape=new)
    elif kind in ("softmax", "layer_norm", "rms_norm"):
        x = b.pick(min_rank=1)
        if x is None:
            return
        shape = b.shape(x)
        axis = draw(st.integers(0, len(shape) - 1))
        params = [b.tensor((shape[axis],), "parameter") for _ in range({"softmax": 0, "layer_norm": 2, "rms_norm": 1}[kind])]
        b.op(kind, [x] + params, shape, axis=axis)
    elif kind == "concat":
        x = b.pick(min_rank=1)
        if x is None:
            return
        shape = b.shape(x)
        axis = draw(st.integers(0, len(shape) - 1))
        other = x if draw(st.booleans()) else b.tensor(shape[:axis] + (draw(DIM),) + shape[axis + 1:], "parameter")
        out = shape[:axis] + (shape[axis] + b.shape(other)[axis],) + shape[axis + 1:]
        b.op("concat", [x, other], out, axis=axis)
    elif kind == "slice":
        x = b.pick(min_rank=1)
        if x is None:
            return
        shape = b.shape(x)
        starts = [draw(st.integers(0, max(s - 2, 0))) if draw(st.booleans()) else 0 for s in shape]
        limits = [draw(st.integers(a + 1, s)) for a, s in zip(starts, shape)]
        strides = [draw(st.integers(1, 2)) for _ in shape]
        out = tuple(-(-(l - a) // s) for a, l, s in zip(starts, limits, strides))
        b.op("slice", [x], out, starts=starts, limits=limits, strides=strides)
    elif kind == "broadcast_in_dim":
        x = b.pick(max_rank=3)
        if x is None:
            return
        shape = b.shape(x)
        at = draw(st.integers(0, len(shape)))
        out = shape[:at] + (draw(DIM),) + shape[at:]
        b.op("broadcast_in_dim", [x], out, shape=list(out),
             broadcast_dimensions=[d if d < at else d + 1 for d in range(len(shape))])
    elif kind == "cast":
        x = b.pick()
        if x is None:
            return
        target = {"f32": "f64", "f64": "f32", "i32": "i64", "i64": "i32"}[b.dtype]
        y = b.op("cast", [x], b.shape(x), target, dtype=target)
        b.op("cast", [y], b.shape(x), b.dtype, dtype=b.dtype)  # back, so later ops keep one dtype
    elif kind == "embedding":
        ids = b.tensor(b.new_shape(draw(st.integers(1, 2))), "input", dtype="i32")
        table = b.tensor((draw(DIM), draw(DIM)), "parameter")
        b.op("embedding", [ids, table], b.shape(ids) + (b.shape(table)[1],), b.dtype)
    elif kind == "attention":
        bb, h, s, t, d, e = (draw(st.integers(1, 3)) for _ in range(6))
        q = b.tensor((bb, h, s, d), "input")
        k = b.tensor((bb, h, t, d), "parameter")
        v = b.tensor((bb, h, t, e), "parameter")
        b.op("attention", [q, k, v], (bb, h, s, e), causal=draw(st.booleans()))
    elif kind == "conv2d":
        n, hh, ww, c, f = (draw(st.integers(1, 4)) for _ in range(5))
        kh, kw = draw(st.integers(1, hh)), draw(st.integers(1, ww))
        x = b.tensor((n, hh, ww, c), "input")
        w = b.tensor((kh, kw, c, f), "parameter")
        b.op("conv2d", [x, w], (n, hh - kh + 1, ww - kw + 1, f))


KINDS = ["unary", "binary", "matmul", "batch_matmul", "dot_general", "reduce_sum", "reduce_max", "reduce_min",
         "reduce_mean", "transpose", "reshape", "softmax", "layer_norm", "rms_norm", "concat", "slice",
         "broadcast_in_dim", "cast", "embedding", "attention", "conv2d"]


@st.composite
def random_graphs(draw: Any, max_ops: int = 5) -> tuple[Graph, Mesh]:
    """A small graph of op-table kinds on one of `MESHES`, some outputs pinned."""
    mesh = draw(st.sampled_from(MESHES))
    dtype = draw(st.sampled_from(["f32", "f32", "f64", "i32"]))
    b = GraphBuilder(draw, dtype)
    b.tensor(b.new_shape(draw(st.integers(1, 3))), "input")
    kinds = [k for k in KINDS if dtype.startswith("f") or k not in FLOAT_ONLY]
    wanted = draw(st.integers(1, max_ops))
    for _ in range(3 * wanted):
        if len(b.ops) >= wanted:
            break
        grow(b, draw(st.sampled_from(kinds)))
    consumed = {t for op in b.ops for t in op["inputs"]}
    outputs = [t for op in b.ops for t in op["outputs"] if t not in consumed]
    constraints = []
    for t in outputs:
        if draw(st.integers(0, 3)) == 0:
            pin = draw(st.sampled_from(enumerate_storage(b.shape(t), mesh)))
            constraints.append({"tensor": t, **pin.to_json()})
    return graph_from_json(b.document(outputs, constraints), mesh), mesh


@st.composite
def random_plans(draw: Any, max_ops: int = 5) -> Plan:
    graph, mesh = draw(random_graphs(max_ops))
    return random_plan(draw, graph, mesh)


def random_plan(draw: Any, graph: Graph, mesh: Mesh) -> Plan:
    options = {op.name: draw_split(draw, enumerate_options(op.nest, mesh)) for op in graph.ops}
    storage = {t.name: draw_split(draw, enumerate_storage(t.shape, mesh))
               for t in graph.tensors.values() if t.role != "intermediate"}
    return Plan(graph, mesh, options, storage)


def draw_split(draw: Any, choices: list) -> Any:
    """One of `choices` (replicated first), three times in four one that splits something."""
    if len(choices) > 1 and draw(st.integers(0, 3)):
        return draw(st.sampled_from(choices[1:]))
    return draw(st.sampled_from(choices))


def describe_plan(plan: Plan) -> str:
    ops = "; ".join(f"{op.name}({', '.join(op.inputs)}) option {plan.options[op.name]}" for op in plan.graph.ops)
    stored = ", ".join(f"{t} {s}" for t, s in plan.storage.items())
    return f"mesh {plan.mesh}; {ops}; storage {stored}"


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(random_plans(), st.booleans())
def test_random_plans_simulate_to_the_reference(plan, widen):
    verdict = verify_plan(plan, bytes_moved_price(plan.mesh), seed=1, widen=widen)
    assert verdict.passed, f"{verdict.summary()}\n{describe_plan(plan)}"
    assert verdict.values_checked >= len(plan.graph.ops)
    if all(t.dtype.startswith("i") for t in plan.graph.tensors.values()):
        assert verdict.max_error == 0.0, "integer programs are exact"


def test_blocks_left_empty_by_uneven_splits_compute_nothing_or_the_identity():
    # 5 rows over x=4: the last device's block is empty. It holds no rows of h; for the column
    # max it contributes -inf to the partial max over x.
    mesh = Mesh.of(x=4, y=2)
    doc = {"format": "autoshard.graph/v1", "name": "uneven",
           "tensors": {"a": tensor([5, 3], "input"), "w": tensor([3, 2], "parameter"), "h": tensor([5, 2]),
                       "r": tensor([5]), "m": tensor([2])},
           "ops": [{"name": "mm", "kind": "matmul", "inputs": ["a", "w"], "outputs": ["h"]},
                   {"name": "row_max", "kind": "reduce_max", "inputs": ["h"], "outputs": ["r"], "dims": [1]},
                   {"name": "col_max", "kind": "reduce_max", "inputs": ["h"], "outputs": ["m"], "dims": [0]}],
           "outputs": ["r", "m"]}
    graph = graph_from_json(doc)
    options = {"mm": ShardingOption((("x",), (), ("y",))), "row_max": ShardingOption((("x",), ())),
               "col_max": ShardingOption((("x",), ("y",)))}
    plan = Plan(graph, mesh, options, {"a": Sharding((("x",),)), "w": Sharding()})
    program = partition(plan)
    col_max = next(i for i in program.local_ops() if i.op.name == "col_max")
    assert col_max.outputs[0].sharding == Sharding((("y",),), ("x",), "max")
    verdict = simulate_program(program, seed=5)
    assert verdict.passed, verdict.summary()


# --- generated models: forward passes and whole training steps (backward ops, Adam) ---------

MODELS = {
    "gpt-train": lambda: gpt(GPTConfig(layers=1, hidden=16, heads=2, seq=8, batch=2, vocab=32, dtype="f32"),
                             training=True),
    "llama": lambda: gpt(GPTConfig(layers=2, hidden=16, heads=4, seq=6, batch=2, vocab=24, dtype="f32", style="llama")),
    "moe": lambda: moe(MoEConfig(batch=2, seq=8, hidden=8, experts=4, top_k=2, dtype="f32")),
    "mlp-train": lambda: mlp_model(MLPConfig(layers=2, batch=4, hidden=12, dtype="f32"), training=True),
}


@functools.cache
def model_graph(name: str, mesh: Mesh) -> Graph:
    return graph_from_json(MODELS[name](), mesh)


@settings(max_examples=16, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(sorted(MODELS)), st.sampled_from([Mesh.of(x=2, y=2), Mesh.of(x=4)]), st.data())
def test_generated_models_under_random_plans_simulate_to_the_reference(name, mesh, data):
    plan = random_plan(data.draw, model_graph(name, mesh), mesh)
    verdict = verify_plan(plan, bytes_moved_price(mesh), seed=3)
    assert verdict.passed, verdict.summary()
    assert verdict.values_checked >= len(plan.graph.ops)


# --- plans from the planner -------------------------------------------------------------------

@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(random_graphs(), st.sampled_from([None, 0.5, 0.25]))
def test_planner_plans_of_random_graphs_simulate_to_the_reference(graph_and_mesh, budget_share):
    """Random graphs planned by the solver, unconstrained or with a budget of a half or a quarter
    of the unsharded footprint (which makes it store or split values, when anything fits)."""
    graph, mesh = graph_and_mesh
    hw = bind_hardware("tpu-v5e", mesh)
    footprint = sum(t.bytes for t in graph.tensors.values()) if budget_share else None
    settings_ = SolveSettings(time_limit_s=2, workers=1, deterministic=True,
                              memory_budget_bytes=footprint * budget_share if footprint else None)
    try:
        result = make_plan(graph, mesh, hw, settings_)
    except InfeasibleError:
        assume(False)
    if budget_share:
        assert result.report.peak_memory_bytes <= footprint * budget_share
    verdict = verify_plan(result.plan, hw.collective_seconds, seed=4)
    assert verdict.passed, f"{verdict.summary()}\n{describe_plan(result.plan)}"


def tensor(shape: list[int], role: str | None = None, dtype: str = "f32") -> dict[str, Any]:
    return {"shape": shape, "dtype": dtype, **({"role": role} if role else {})}


def mlp(batch: int, hidden: int, ffn: int, pin: list | None = None) -> dict[str, Any]:
    doc = {"format": "autoshard.graph/v1", "name": "mlp",
           "tensors": {"x": tensor([batch, hidden], "input"), "w1": tensor([hidden, ffn], "parameter"),
                       "w2": tensor([ffn, hidden], "parameter"), "h": tensor([batch, ffn]),
                       "a": tensor([batch, ffn]), "y": tensor([batch, hidden])},
           "ops": [{"name": "fc1", "kind": "matmul", "inputs": ["x", "w1"], "outputs": ["h"]},
                   {"name": "act", "kind": "gelu", "inputs": ["h"], "outputs": ["a"]},
                   {"name": "fc2", "kind": "matmul", "inputs": ["a", "w2"], "outputs": ["y"]}],
           "outputs": ["y"]}
    if pin is not None:
        doc["constraints"] = [{"tensor": "y", "split_axes": pin}]
    return doc


def attention_block(b: int = 2, s: int = 8, d: int = 32, h: int = 4) -> dict[str, Any]:
    """Projections, heads split by reshape and transpose, causal attention, output projection,
    residual and layer norm."""
    dh = d // h
    tensors = {"x": tensor([b, s, d], "input"), "gamma": tensor([d], "parameter"), "beta": tensor([d], "parameter")}
    tensors |= {f"w{n}": tensor([d, d], "parameter") for n in "qkvo"}
    ops: list[dict[str, Any]] = []
    for n in "qkv":
        tensors |= {n: tensor([b, s, d]), f"{n}4": tensor([b, s, h, dh]), f"{n}h": tensor([b, h, s, dh])}
        ops += [{"name": f"proj_{n}", "kind": "matmul", "inputs": ["x", f"w{n}"], "outputs": [n]},
                {"name": f"split_{n}", "kind": "reshape", "inputs": [n], "outputs": [f"{n}4"], "shape": [b, s, h, dh]},
                {"name": f"heads_{n}", "kind": "transpose", "inputs": [f"{n}4"], "outputs": [f"{n}h"], "perm": [0, 2, 1, 3]}]
    tensors |= {"o": tensor([b, h, s, dh]), "ot": tensor([b, s, h, dh]), "om": tensor([b, s, d]),
                "p": tensor([b, s, d]), "r": tensor([b, s, d]), "y": tensor([b, s, d])}
    ops += [{"name": "attn", "kind": "attention", "inputs": ["qh", "kh", "vh"], "outputs": ["o"], "causal": True},
            {"name": "unheads", "kind": "transpose", "inputs": ["o"], "outputs": ["ot"], "perm": [0, 2, 1, 3]},
            {"name": "merge", "kind": "reshape", "inputs": ["ot"], "outputs": ["om"], "shape": [b, s, d]},
            {"name": "proj_o", "kind": "matmul", "inputs": ["om", "wo"], "outputs": ["p"]},
            {"name": "residual", "kind": "add", "inputs": ["p", "x"], "outputs": ["r"]},
            {"name": "norm", "kind": "layer_norm", "inputs": ["r", "gamma", "beta"], "outputs": ["y"]}]
    return {"format": "autoshard.graph/v1", "name": "block", "tensors": tensors, "ops": ops, "outputs": ["y"]}


def embedding_head(batch: int = 4, seq: int = 6, vocab: int = 64, dim: int = 16) -> dict[str, Any]:
    """Token lookup, rms norm, logits against the table's transpose, softmax."""
    return {"format": "autoshard.graph/v1", "name": "lm",
            "tensors": {"ids": tensor([batch, seq], "input", "i32"), "table": tensor([vocab, dim], "parameter"),
                        "g": tensor([dim], "parameter"), "e": tensor([batch, seq, dim]), "n": tensor([batch, seq, dim]),
                        "tt": tensor([dim, vocab]), "logits": tensor([batch, seq, vocab]), "p": tensor([batch, seq, vocab])},
            "ops": [{"name": "lookup", "kind": "embedding", "inputs": ["ids", "table"], "outputs": ["e"]},
                    {"name": "norm", "kind": "rms_norm", "inputs": ["e", "g"], "outputs": ["n"]},
                    {"name": "tied", "kind": "transpose", "inputs": ["table"], "outputs": ["tt"]},
                    {"name": "head", "kind": "matmul", "inputs": ["n", "tt"], "outputs": ["logits"]},
                    {"name": "probs", "kind": "softmax", "inputs": ["logits"], "outputs": ["p"]}],
            "outputs": ["p"]}


# Memory budgets below the unsharded footprint make the planner shard.
PLANNER_CASES = [
    ("mlp", mlp(8, 64, 256), "tp=4", 60e3),
    ("mlp-pinned", mlp(8, 64, 256, pin=[["tp"]]), "tp=4", 60e3),
    ("mlp-2d", mlp(8, 64, 256), "dp=2,tp=4", 40e3),
    ("attention-block", attention_block(), "tp=4", 16e3),
    ("embedding-head", embedding_head(), "tp=4", 12e3),
]


@pytest.mark.parametrize("name, doc, mesh_text, budget", PLANNER_CASES, ids=[c[0] for c in PLANNER_CASES])
def test_planner_plans_simulate_to_the_reference(name, doc, mesh_text, budget):
    mesh = Mesh.parse(mesh_text)
    graph = graph_from_json(doc, mesh)
    hw = bind_hardware("dgx-h100", mesh)
    result = make_plan(graph, mesh, hw, SolveSettings(time_limit_s=2, workers=1, deterministic=True,
                                                      memory_budget_bytes=budget))
    assert any(o.split_loops() for o in result.plan.options.values()), "the budget makes the planner shard"
    verdict = verify_plan(result.plan, hw.collective_seconds, seed=2)
    assert verdict.passed, f"{verdict.summary()}\n{describe_plan(result.plan)}"


@pytest.mark.parametrize("mesh_text", ["x=3,y=2", "x=2,y=2,z=2"])
def test_the_memory_a_simulation_needs_counts_every_devices_shard_of_every_value(mesh_text):
    mesh = Mesh.parse(mesh_text)
    values = [v for _, program in zoo_programs((mesh_text,), count=3) for v in program.values()]
    values += [Value(0, "uneven", Sharding((("x", "y"),)), (7,), "f32"),
               Value(1, "offsets", Sharding((("y",), ()), dims_offsets=((0, 3, 10), ())), (10, 5), "f32")]
    for value in values:
        walked = sum(math.prod(value.local_shape(mesh, device)) for device in mesh.devices())
        assert held_elements(mesh, value) == walked, value

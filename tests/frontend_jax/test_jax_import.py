"""Importing JAX functions: the graph computes what the function computes (run in numpy by the
reference evaluator on the same arguments), inputs keep their pytree paths, calls are inlined,
and what the graph cannot express is an opaque op with a warning, or an error under strict."""

from __future__ import annotations

import json
import textwrap
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax_models import CASES, mlp, mlp_args
from proofs import pinned_plan

import autoshard
from autoshard.cli.main import main
from autoshard.errors import InputError
from autoshard.frontends.jax import from_function
from autoshard.frontends.jax.importer import UnsupportedPrimitiveWarning, import_function
from autoshard.frontends.user_code import UserCodeError
from autoshard.graph.evaluate import evaluate_graph, random_inputs
from autoshard.graph.schema import graph_from_json


def run_graph(imported, args):
    """The imported graph's results, evaluated in numpy on the function's own arguments."""
    graph = graph_from_json(imported.document)
    values = dict(imported.constants)
    for argument, leaf in zip(imported.program.arguments, jax.tree_util.tree_leaves(args)):
        values[imported.tensors[argument.id]] = np.asarray(leaf)
    computed = evaluate_graph(graph, values)
    return graph, [computed[t] for t in imported.outputs]


@pytest.mark.parametrize("name", list(CASES))
def test_the_imported_graph_computes_what_the_function_computes(name):
    f, make_args = CASES[name]
    args = make_args()
    imported = import_function(f, args)
    graph, results = run_graph(imported, args)
    expected = jax.tree_util.tree_leaves(f(*args))
    assert len(results) == len(expected) > 0
    for got, want in zip(results, expected):
        np.testing.assert_allclose(got, np.asarray(want), rtol=2e-5, atol=2e-5)
    assert imported.opaque == {} and "opaque" not in {op.kind for op in graph.ops}


def test_inputs_are_named_by_pytree_path_with_their_roles():
    def layered(params, x):
        return mlp(params["layers"][0], x)

    params, x = mlp_args()
    graph = graph_from_json(from_function(layered, {"layers": [params]}, x))
    roles = {t.name: t.role for t in graph.tensors.values() if t.role != "intermediate" and not t.name.startswith("const")}
    assert roles == {"params['layers'][0]['w1']": "parameter", "params['layers'][0]['w2']": "parameter", "x": "input"}
    assert graph.tensors["params['layers'][0]['w1']"].shape == params["w1"].shape


def test_dot_general_keeps_contracting_and_batch_dims():
    def batched(a, b):
        return jnp.einsum("bmk,kbn->bmn", a, b)

    graph = graph_from_json(from_function(batched, jnp.ones((2, 3, 4)), jnp.ones((4, 2, 5))))
    (dot,) = [op for op in graph.ops if op.kind == "dot_general"]
    assert {k: list(v) for k, v in dot.attrs.items()} == {"lhs_batch_dims": [0], "rhs_batch_dims": [1],
                                                        "lhs_contracting_dims": [2], "rhs_contracting_dims": [0]}
    assert dot.nest.iterator_types == ("parallel", "parallel", "parallel", "reduction")


def test_nested_calls_and_closed_over_constants_are_inlined():
    table = np.arange(12.0, dtype=np.float32).reshape(3, 4)

    @jax.custom_vjp
    def doubled(v):
        return 2.0 * v

    doubled.defvjp(lambda v: (doubled(v), None), lambda _, ct: (2.0 * ct,))

    @jax.jit
    def inner(v):
        return jax.checkpoint(lambda u: jnp.tanh(u))(doubled(v)) + table

    def outer(v):
        return jax.nn.softmax(inner(v))

    v = jnp.linspace(-1, 1, 12).reshape(3, 4)
    imported = import_function(outer, (v,))
    graph, (result,) = run_graph(imported, (v,))
    np.testing.assert_allclose(result, np.asarray(outer(v)), rtol=1e-6)
    kinds = Counter(op.kind for op in graph.ops)
    assert kinds["tanh"] == 1 and kinds["exp"] == 1 and kinds["opaque"] == 0
    (table_tensor,) = [t for t, value in imported.constants.items() if value.shape == (3, 4)]
    np.testing.assert_array_equal(imported.constants[table_tensor], table)
    pins = {c.tensor: c for c in graph.constraints}
    assert set(pins) == set(imported.constants) and all(c.required and c.sharding.split_axes == () for c in pins.values())


def test_a_constant_under_sqrt_carries_its_value_and_verifies_with_finite_values():
    scale = np.array([0.25, 1.0, 4.0, 9.0], np.float32)
    weights = np.ones((64, 8), np.float32)  # above CONSTANT_VALUE_LIMIT: drawn, not carried

    def f(x):
        return jnp.sum(x * jnp.sqrt(scale) * jax.lax.rsqrt(jnp.float32(2.0)), axis=1) + jnp.sum(weights)

    x = jnp.linspace(-1, 1, 32).reshape(8, 4)
    imported = import_function(f, (x,))
    carried = {t: e["value"] for t, e in imported.document["tensors"].items() if "value" in e}
    by_shape = {tuple(imported.constants[t].shape): t for t in imported.constants}
    assert carried[by_shape[(4,)]] == scale.tolist() and carried[by_shape[()]] == [2.0]
    assert by_shape[(64, 8)] not in carried
    graph, hardware, result = pinned_plan(f, (x,), autoshard.Mesh.parse("dp=2"), {"x": [["dp"]]})
    verdict = autoshard.verify_plan(result.plan, hardware.collective_seconds)
    assert verdict.passed and verdict.values_checked > 0, verdict.summary()
    np.testing.assert_array_equal(random_inputs(graph)[by_shape[(4,)]], scale)


def test_values_no_result_depends_on_are_left_out():
    def f(x):
        unused = jnp.exp(x) @ x
        return x.sum(), unused.shape

    graph = graph_from_json(from_function(f, jnp.ones((4, 4))))
    assert [op.kind for op in graph.ops] == ["reduce_sum"]


def test_a_primitive_without_a_row_is_an_opaque_op_with_a_warning_or_refused_under_strict():
    def f(x, w):
        return jnp.sort(x @ w, axis=0) * 2.0

    x, w = jnp.ones((8, 4)), jnp.ones((4, 6))
    with pytest.warns(UnsupportedPrimitiveWarning, match=r"sort \(1x\)"):
        graph = graph_from_json(from_function(f, x, w))
    (opaque,) = [op for op in graph.ops if op.kind == "opaque"]
    assert opaque.attrs["primitive"] == "sort" and graph.tensors[opaque.outputs[0]].shape == (8, 6)
    assert set(opaque.nest.iterator_types) == {"invalid"}
    with pytest.raises(InputError, match="primitive 'sort' cannot be imported"):
        from_function(f, x, w, strict=True)


def test_import_command_writes_the_graph_of_a_factory(tmp_path, capsys):
    source = tmp_path / "model.py"
    source.write_text(textwrap.dedent("""
        import jax.numpy as jnp

        def make():
            def f(params, x):
                return jnp.tanh(x @ params["w"])
            return f, ({"w": jnp.ones((8, 4))}, jnp.ones((2, 8)))
    """))
    out = tmp_path / "graph.json"
    assert main(["import", "jax", f"{source}:make", "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    graph = graph_from_json(json.loads(out.read_text()))
    assert [op.kind for op in graph.ops] == ["dot_general", "tanh"]
    assert graph.tensors["params['w']"].role == "parameter" and graph.tensors["x"].role == "input"


@pytest.mark.parametrize("spec, message", [
    ("model.py", "expected FILE.py:FACTORY"),
    ("missing.py:make", "no such file"),
    ("model.py:nothing", "defines no function 'nothing'"),
    ("model.py:bad", "must return (f, args) with args a tuple"),
])
def test_import_command_names_what_is_wrong_with_the_factory(tmp_path, monkeypatch, capsys, spec, message):
    (tmp_path / "model.py").write_text("def bad():\n    return 1\n")
    monkeypatch.chdir(tmp_path)
    assert main(["import", "jax", spec, "-o", "graph.json"]) == 2
    assert message in capsys.readouterr().err


# the user's file, broken in each way their code can fail -> (the line the error names, what it says)
BROKEN = {
    "syntax error": ("def make(:\n    pass\n", 1, "importing model.py raised SyntaxError: invalid syntax"),
    "import error": ("import no_such_module_here\n", 1,
                     "importing model.py raised ModuleNotFoundError: No module named 'no_such_module_here'"),
    "factory raises": ("def load():\n    raise ValueError('no checkpoint')\n\ndef make():\n    return load()\n", 2,
                       "make() raised ValueError: no checkpoint"),
    "factory takes arguments": ("def make(size, depth=2):\n    return None\n", 1,
                                "make() must take no arguments; it needs size"),
    "shape mismatch": ("import jax.numpy as jnp\n\ndef f(x, w):\n    return x @ w\n\n"
                       "def make():\n    return f, (jnp.ones((2, 4)), jnp.ones((3, 4)))\n", 4,
                       "tracing f raised TypeError: dot_general requires contracting dimensions to have the same shape"),
    "control flow on a traced value": ("import jax.numpy as jnp\n\ndef f(x):\n    if x.sum() > 0:\n        return x\n"
                                       "    return -x\n\ndef make():\n    return f, (jnp.ones((2, 4)),)\n", 4,
                                       "tracing f raised TracerBoolConversionError: Attempted boolean conversion"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_failure_in_the_users_code_exits_2_naming_file_line_and_exception(tmp_path, capsys, case):
    text, line, message = BROKEN[case]
    source = tmp_path / "model.py"
    source.write_text(text)
    assert main(["import", "jax", f"{source}:make", "-o", str(tmp_path / "graph.json")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "autoshard import: 1 problem(s):"
    assert lines[1].startswith(f"  {source}:{line}: {message}"), lines
    assert len(lines) == 2, lines


def branches(x):
    if x.sum() > 0:
        return x
    return -x


def test_from_function_raises_the_users_tracing_error_at_its_line():
    with pytest.raises(UserCodeError) as error:
        from_function(branches, jnp.ones((2, 4)))
    where = error.value.problems[0].where
    assert where == f"{__file__}:{branches.__code__.co_firstlineno + 1}"
    assert "TracerBoolConversionError" in error.value.problems[0].message


def stack(weights, x):
    """Three layers under named scopes, one of them through a nested jit."""
    inner = jax.jit(jnp.tanh)
    with jax.named_scope("blocks"):
        for i in range(3):
            with jax.named_scope(f"layers.{i}"):
                x = inner(x @ weights[i])
    return x.sum()


def test_named_scopes_give_each_op_its_module_path_and_repeated_ones_its_layer():
    graph = graph_from_json(from_function(stack, jnp.ones((3, 4, 4)), jnp.ones((2, 4))))
    for op in graph.ops:
        if op.kind == "tanh":  # traced inside the jit: its scope is the caller's
            assert op.module.startswith("blocks.layers.")
        if op.module.startswith("blocks.layers."):
            assert op.layer == int(op.module.rsplit(".", 1)[1])
        else:
            assert op.layer is None
    assert {op.layer for op in graph.ops} == {0, 1, 2, None}


def test_a_gradient_program_keeps_the_scopes_and_drops_layers_it_cannot_cut():
    with pytest.warns(UserWarning, match="layers are not kept"):
        document = from_function(jax.grad(stack), jnp.ones((3, 4, 4)), jnp.ones((2, 4)))
    graph = graph_from_json(document)
    # the transposed ops keep their forward scope; without declared gradients, the backward ops
    # read as forward and interleave the layers, so no op has one
    assert {op.module for op in graph.ops if op.kind == "dot_general"} == {f"blocks.layers.{i}" for i in range(3)}
    assert all(op.layer is None for op in graph.ops)

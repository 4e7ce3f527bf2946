"""`jax.lax.scan` is imported as the iterations it runs: each reads its slice of the stacked
operands, runs the body as a layer of its own (scope `scan.<i>`), and the stacked results are
put back together; the graph counts every iteration's FLOPs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_jax_import import run_graph

from autoshard.errors import InputError
from autoshard.frontends.jax.importer import import_function

LAYERS, WIDTH = 3, 8
KEY = jax.random.split(jax.random.key(3), 3)
STACKED = {"w": jax.random.normal(KEY[0], (LAYERS, WIDTH, WIDTH)) / WIDTH ** 0.5,
           "b": jax.random.normal(KEY[1], (LAYERS, WIDTH))}
X = jax.random.normal(KEY[2], (4, WIDTH))


def layer(h, p):
    return jnp.tanh(h @ p["w"] + p["b"])


def scanned(params, x, reverse=False):
    """The layers as a scan, with a closed-over constant, a per-layer output and a second carry."""
    scale = jnp.float32(0.5)

    def body(carry, p):
        h, total = carry
        h = layer(h, p) * scale
        return (h, total + h.sum()), h.mean(axis=0)

    with jax.named_scope("decoder"):
        (h, total), means = jax.lax.scan(body, (x, jnp.float32(0.0)), params, reverse=reverse)
    return h, total, means


@pytest.mark.parametrize("reverse", [False, True])
def test_a_scan_computes_what_it_computes_with_each_iteration_a_layer(reverse):
    f = lambda params, x: scanned(params, x, reverse)  # noqa: E731
    imported = import_function(f, (STACKED, X), strict=True)
    graph, results = run_graph(imported, (STACKED, X))
    for got, want in zip(results, f(STACKED, X), strict=True):
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-6)
    order = range(LAYERS - 1, -1, -1) if reverse else range(LAYERS)
    layers = {}
    for op in graph.ops:
        if op.module.startswith("decoder.scan."):
            layers.setdefault(op.layer, set()).add(op.module)
    # layers numbered in the order the iterations run
    assert layers == {n: {f"decoder.scan.{i}"} for n, i in enumerate(order)}
    # each iteration reads its own slice of each stacked parameter
    for name in ("params['w']", "params['b']"):
        slices = [op for op in graph.ops if op.kind == "slice" and op.inputs == (name,)]
        assert sorted(op.attrs["starts"][0] for op in slices) == list(range(LAYERS))
        assert all(op.layer is not None and f"decoder.scan.{op.attrs['starts'][0]}" == op.module for op in slices)


def test_the_graph_counts_every_iterations_flops():
    stacked = import_function(lambda p, x: jax.lax.scan(lambda h, q: (layer(h, q), None), x, p)[0], (STACKED, X))
    one = import_function(layer, (X, {"w": STACKED["w"][0], "b": STACKED["b"][0]}))
    flops = [sum(op.flops() for op in run_graph(i, a)[0].ops)
             for i, a in ((stacked, (STACKED, X)), (one, (X, {"w": STACKED["w"][0], "b": STACKED["b"][0]})))]
    assert flops[0] == LAYERS * flops[1] > 0


def test_a_scan_of_no_iterations_is_refused_naming_it():
    with pytest.raises(InputError, match="a scan of length 0"):
        import_function(lambda x: jax.lax.scan(lambda h, _: (h, None), x, None, length=0)[0], (X,))

"""The gradient of a strided slice (as GPT-J's rotate-every-two and DeepSeek-V3 write them): the
output gradient back at the positions the slice read, zeros elsewhere, built from table ops."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.graph.builder import GraphBuilder
from autoshard.graph.evaluate import evaluate_graph
from autoshard.graph.schema import graph_from_json
from autoshard.ops.differentiate import add_backward


# (starts, limits, strides) of a slice of x [3, 8]: the last dim's stride lands past its end or not
@pytest.mark.parametrize("starts, limits, strides", [
    ([0, 1], [3, 8], [1, 3]),  # columns 1, 4, 7: three strides reach 10, past the 8 columns
    ([0, 0], [3, 8], [1, 2]),  # columns 0, 2, 4, 6: four strides end exactly at 8
    ([1, 1], [3, 7], [2, 3]),  # rows 1 and columns 1, 4, both dims strided
])
def test_a_strided_slice_gives_the_gradient_back_at_the_positions_it_read(starts, limits, strides):
    b = GraphBuilder("strided", "f32")
    x = b.parameter("x", (3, 8))
    y = b.op("slice", [x], "y", starts=starts, limits=limits, strides=strides)
    dy = b.input("dy", b.shape(y))
    grad = add_backward(b, {y: dy}, [x])[x]
    b.mark_outputs(grad)
    graph = graph_from_json(b.document())
    seed = np.arange(1, np.prod(graph.tensors[dy].shape) + 1, dtype=np.float32).reshape(graph.tensors[dy].shape)
    got = evaluate_graph(graph, {x: np.zeros((3, 8), np.float32), dy: seed})[grad]
    want = np.zeros((3, 8), np.float32)
    want[tuple(slice(a, c, s) for a, c, s in zip(starts, limits, strides))] = seed
    np.testing.assert_array_equal(got, want)

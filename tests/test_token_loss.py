"""The training loss of a language model takes token ids: its value is the mean token
cross-entropy, its gradient (softmax - one_hot(labels)) / tokens, and no input is shaped like the
logits."""

from __future__ import annotations

import numpy as np

from autoshard.graph.evaluate import evaluate_graph
from autoshard.graph.schema import graph_from_json
from autoshard.models import GraphBuilder
from autoshard.models.training import cross_entropy_loss


def test_token_cross_entropy_is_the_mean_over_tokens_with_its_closed_form_gradient():
    batch, seq, vocab = 2, 3, 7
    b = GraphBuilder("loss", "f64")
    logits = b.input("logits", (batch, seq, vocab), batch_dim=0)
    loss, seeds = cross_entropy_loss(b, logits)
    b.mark_outputs(loss, seeds[logits])
    graph = graph_from_json(b.document())
    assert graph.tensors["labels"].shape == (batch, seq) and graph.tensors["labels"].dtype == "i32"
    assert graph.tensors["labels"].batch_dim == 0 and graph.tensors["loss.token_weight"].shape == ()

    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, seq, vocab))
    labels = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    values = evaluate_graph(graph, {"logits": x, "labels": labels, "loss.token_weight": np.float64(1 / (batch * seq))})
    log_p = x - np.log(np.exp(x).sum(-1, keepdims=True))
    one_hot = np.eye(vocab)[labels]
    np.testing.assert_allclose(values[loss], -np.mean(np.take_along_axis(log_p, labels[..., None], -1)))
    np.testing.assert_allclose(values[seeds[logits]], (np.exp(log_p) - one_hot) / (batch * seq))

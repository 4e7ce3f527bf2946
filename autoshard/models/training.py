"""A whole training step on a built forward graph: loss, backward ops, Adam update.

Losses come with the gradient of the loss w.r.t. their input in closed form, so the backward
pass starts from table ops and needs no constant seed. Each parameter's gradient is declared
(`grad_of`), and the new parameters and moments overwrite the old ones in place (`updates`), as
real runs keep one copy of the state. Adam keeps its moments as parameters in
f32 and takes its step-dependent scalars as inputs (they change every step, as a learning-rate
schedule does), in Kingma and Ba's folded form:

    m' = m + (1 - beta1) (g - m)          v' = v + (1 - beta2) (g^2 - v)
    p' = p - step_size * m' / (sqrt(v') + eps_hat)
    step_size = lr sqrt(1 - beta2^t) / (1 - beta1^t),   eps_hat = eps sqrt(1 - beta2^t)

The precision of the step (`PRECISIONS`) says what is kept in which float; `fp16-mixed` also
scales the loss (`scaled_seeds`) and unscales in the optimizer. `adam32` is the step
as generated before precisions were named: weights, activations and gradients in the weights'
dtype, Adam moments in f32. The mixed modes (`bf16-mixed`, `fp16-mixed`) are Megatron-LM's: the
forward and backward read the weights in bf16 (fp16), each gradient is written in f32 (its
contraction or reduction accumulates there, else a cast follows it) and that f32 main gradient is
the declared one, which microbatches accumulate and data replicas reduce; the optimizer keeps an
f32 master copy of each narrower weight beside the moments, updates it in place and casts it back
to the weight. So a parameter costs 2 (weight) + 4 (main gradient) + 4 (master) + 4 + 4 (moments)
= 18 bytes, 6 + 12/d with the master and moments split over d data replicas.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator, Sequence

from autoshard.dtypes import DTYPES
from autoshard.errors import InputError
from autoshard.graph.builder import GraphBuilder
from autoshard.ops import OP_KINDS
from autoshard.ops.differentiate import add_backward
from autoshard.ops.table import accumulated_dtype

OPTIMIZER_DTYPE = "f32"
ADAM_SCALARS = ("adam.one_minus_beta1", "adam.one_minus_beta2", "adam.step_size", "adam.eps_hat")


@dataclass(frozen=True, slots=True)
class Precision:
    name: str
    dtype: str | None  # what forward and backward compute in (weights, activations); None: the graph's own
    master_weights: bool  # f32 main gradients and master weights for weights narrower than f32
    doc: str
    loss_scale: bool = False  # the backward runs on the loss times `loss.scale`; the optimizer unscales


PRECISIONS = {p.name: p for p in (
    Precision("adam32", None, False, "weights, activations and gradients in the graph's dtype, Adam moments in f32, "
                                     "no master weights (the step as generated before precisions were named)"),
    Precision("bf16-mixed", "bf16", True, "bf16 weights and activations, f32 main gradients, master weights and "
                                          "Adam moments (Megatron-LM's mixed precision)"),
    Precision("fp16-mixed", "f16", True, "as bf16-mixed with f16 weights and activations and the loss scaled: the "
                                         "backward runs on the loss times the input loss.scale, the optimizer "
                                         "multiplies each main gradient by loss.inverse_scale and outputs its "
                                         "largest magnitude (adam.<p>.grad_max) for the overflow check",
              loss_scale=True),
    Precision("fp32", "f32", False, "everything in f32"),
)}
LOSS_SCALE, INVERSE_LOSS_SCALE = "loss.scale", "loss.inverse_scale"
DEFAULT_PRECISION = "adam32"
_precision: ContextVar[str] = ContextVar("precision", default=DEFAULT_PRECISION)


def check_precision(name: object, field: str = "precision") -> Precision:
    if name not in PRECISIONS:
        raise InputError(f"must be one of {list(PRECISIONS)}, got {name!r}", field)
    return PRECISIONS[name]  # type: ignore[index]


@contextmanager
def training_precision(name: str) -> Iterator[Precision]:
    """Build the training steps added inside the block in precision `name` (as `decimal.localcontext`
    scopes a precision): generators call `add_training_step` themselves, so this reaches them
    without threading an argument through each."""
    precision = check_precision(name)
    token = _precision.set(precision.name)
    try:
        yield precision
    finally:
        _precision.reset(token)


def weighted_sum_loss(b: GraphBuilder, y: str, batch_dim: int | None = 0) -> tuple[str, dict[str, str]]:
    """loss = sum(y * labels), so d loss / d y = labels (an input of y's shape, whose batch dim is
    `batch_dim`, as y's is)."""
    labels = b.input("labels", b.shape(y), b.dtype_of(y), batch_dim=batch_dim)
    loss = b.op("reduce_sum", [b.op("mul", [y, labels], "loss.mul")], "loss")
    return loss, {y: labels}


def cross_entropy_loss(b: GraphBuilder, logits: str) -> tuple[str, dict[str, str]]:
    """The token cross-entropy of `logits` [..., vocab] against token ids, summed over tokens
    and weighted: loss = weight * sum(log_sum_exp(logits) - logits[label]).

    Inputs: `labels`, integer ids shaped like the logits without the vocabulary dim, and
    `loss.token_weight`, a scalar a run feeds as 1 / the step's tokens (1 / (M * tokens) with M
    microbatches, whose gradients are summed), making the loss and its gradient the mean over
    tokens. The one-hot targets are compared in the graph (ids against an iota of the
    vocabulary) and the log-softmax is written with max, exp and sums rather than `softmax`, so
    the vocabulary dim stays splittable (partial maxima and sums). The gradient, in closed form,
    is weight * (softmax(logits) - one_hot(labels)).
    """
    shape, dtype = b.shape(logits), b.dtype_of(logits)
    last, vocab = len(shape) - 1, shape[-1]
    labels = b.input("labels", shape[:-1], "i32", batch_dim=0)
    weight = b.input("loss.token_weight", (), dtype)
    ids = b.op("reshape", [labels], "loss.label_ids", shape=[*shape[:-1], 1])
    classes = b.op("iota", [], "loss.classes", shape=[vocab], dimension=0, dtype="i32")
    hit = b.op("compare", [ids, classes], "loss.label_hit", direction="eq")
    target = b.op("cast", [hit], "loss.one_hot", dtype=dtype)
    shifted = b.op("sub", [logits, b.op("reduce_max", [logits], "loss.max", dims=[last], keepdims=True)], "loss.shift")
    e = b.op("exp", [shifted], "loss.exp")
    total = b.op("reduce_sum", [e], "loss.sum_exp", dims=[last], keepdims=True)
    picked = b.op("reduce_sum", [b.op("mul", [target, shifted], "loss.label_logit_terms")], "loss.label_logit",
                  dims=[last], keepdims=True)
    per_token = b.op("sub", [b.op("log", [total], "loss.log_sum_exp"), picked], "loss.per_token")
    loss = b.op("mul", [b.op("reduce_sum", [per_token], "loss.sum"), weight], "loss")
    p = b.op("div", [e, total], "loss.softmax")
    grad = b.op("mul", [b.op("sub", [p, target], "grad.logits.unweighted"), weight], "grad.logits")
    return loss, {logits: grad}


def add_adam(b: GraphBuilder, params: Sequence[str], grads: dict[str, str], master_weights: bool = False,
             loss_scale: bool = False) -> list[str]:
    """Adam update of every parameter, in place: returns the new parameters and moments, each
    declared to overwrite the old one, and with `loss_scale` each gradient's largest magnitude.
    A parameter's update ops belong to its layer. `master_weights`: a parameter narrower than
    f32 is updated through an f32 master copy (`adam.<p>.master`, optimizer state), which the new
    parameter is cast from. `loss_scale`: the gradients are of the scaled loss; each is first
    multiplied by `loss.inverse_scale`, and its largest magnitude (`adam.<p>.grad_max`, NaN or
    inf when it overflowed) is an output for the run's overflow check, which skips the update
    and lowers the scale (that choice is the run's: the step here always updates)."""
    c1, c2, step, eps = (b.input(name, (), OPTIMIZER_DTYPE) for name in ADAM_SCALARS)
    inverse = b.input(INVERSE_LOSS_SCALE, (), OPTIMIZER_DTYPE) if loss_scale else None
    layers = b.parameter_layers()
    outer = b.layer
    outputs = []
    for p in params:
        b.layer = layers.get(p)
        g = grads[p]
        if b.dtype_of(g) != OPTIMIZER_DTYPE:
            g = b.op("cast", [g], f"adam.{p}.grad", dtype=OPTIMIZER_DTYPE)
        if inverse is not None:
            g = b.op("mul", [g, inverse], f"adam.{p}.unscaled")
            magnitude = b.op("abs", [g], f"adam.{p}.grad_abs")
            outputs.append(b.op("reduce_max", [magnitude], f"adam.{p}.grad_max", dims=list(range(len(b.shape(g))))))
        m = b.parameter(f"adam.{p}.m", b.shape(p), OPTIMIZER_DTYPE)
        v = b.parameter(f"adam.{p}.v", b.shape(p), OPTIMIZER_DTYPE)
        new_m = b.op("add", [m, b.op("mul", [b.op("sub", [g, m], f"adam.{p}.m_delta"), c1], f"adam.{p}.m_step")], f"adam.{p}.new_m")
        square = b.op("square", [g], f"adam.{p}.grad_square")
        new_v = b.op("add", [v, b.op("mul", [b.op("sub", [square, v], f"adam.{p}.v_delta"), c2], f"adam.{p}.v_step")], f"adam.{p}.new_v")
        # abs: v' >= 0 for any real state, so it only keeps the update finite on arbitrary inputs
        root = b.op("sqrt", [b.op("abs", [new_v], f"adam.{p}.v_abs")], f"adam.{p}.v_sqrt")
        ratio = b.op("div", [new_m, b.op("add", [root, eps], f"adam.{p}.denominator")], f"adam.{p}.ratio")
        update = b.op("mul", [ratio, step], f"adam.{p}.update")
        if master_weights and b.dtype_of(p) != OPTIMIZER_DTYPE:
            master = b.parameter(f"adam.{p}.master", b.shape(p), OPTIMIZER_DTYPE)
            new_master = b.op("sub", [master, update], f"adam.{p}.new_master")
            new_p = b.op("cast", [new_master], f"{p}.new", dtype=b.dtype_of(p))
            b.update_in_place(new_master, master)
            outputs.append(new_master)
        else:
            if b.dtype_of(p) != OPTIMIZER_DTYPE:
                update = b.op("cast", [update], f"adam.{p}.update_cast", dtype=b.dtype_of(p))
            new_p = b.op("sub", [p, update], f"{p}.new")
        for new, old in ((new_p, p), (new_m, m), (new_v, v)):
            b.update_in_place(new, old)
        outputs += [new_p, new_m, new_v]
    b.layer = outer
    return outputs


def declare_gradients(b: GraphBuilder, grads: dict[str, str]) -> dict[str, str]:
    """Declare each parameter's gradient (`grad_of`). A gradient that is not an op's own result
    (a seed such as the labels) or that two parameters share is first copied, so that each
    parameter has a value of its own to accumulate microbatches into."""
    layers = b.parameter_layers()
    outer = b.layer
    declared: dict[str, str] = {}
    taken: set[str] = set()
    for p, g in grads.items():
        if b.tensors[g].role != "intermediate" or g in taken:
            b.layer = layers.get(p)
            g = b.op("cast", [g], f"grad.{p}", dtype=b.dtype_of(g))
        taken.add(g)
        b.declare_gradient(g, p)
        declared[p] = g
    b.layer = outer
    return declared


# ops that move a gradient into its parameter's layout and keep its dtype (a linear layer's weight
# gradient comes out of its GEMM transposed)
_MOVES = ("transpose", "reshape")


def main_gradients(b: GraphBuilder, grads: dict[str, str]) -> dict[str, str]:
    """Each float gradient narrower than f32 written in f32: by the contraction or reduction
    making it, when nothing else reads it or what lies between (a transpose, a reshape) (a
    weight gradient's GEMM accumulates in f32, as Megatron-LM's fused gradient accumulation does,
    so its reduction across data replicas is an f32 one), else by a cast in its parameter's layer
    (a `grad` op's result, a shared value)."""
    layers = b.parameter_layers()
    producers = {op.output: op for op in b.ops}
    reads = Counter(t for op in b.ops for t in op.inputs) + Counter(grads.values())
    outer = b.layer
    wide: dict[str, str] = {}
    for p, g in grads.items():
        info = DTYPES[b.dtype_of(g)]
        if not info.is_float or info.itemsize >= DTYPES[OPTIMIZER_DTYPE].itemsize:
            wide[p] = g
            continue
        chain = [g]  # g, then back through the moves to what computes it
        while chain[-1] in producers and producers[chain[-1]].kind in _MOVES and reads[chain[-1]] == 1:
            chain.append(producers[chain[-1]].inputs[0])
        source = producers.get(chain[-1])
        if source is not None and OP_KINDS[source.kind].out_dtypes is accumulated_dtype and reads[chain[-1]] == 1:
            b.write_in(chain[-1], OPTIMIZER_DTYPE)
            for moved in reversed(chain[:-1]):
                b.follow_inputs(moved)
            wide[p] = g
        else:
            b.layer = layers.get(p)
            # right behind its producer: the backward runs the layers in reverse order
            wide[p] = b.op("cast", [g], f"grad.{p}.main", after=g if g in producers else None, dtype=OPTIMIZER_DTYPE)
    b.layer = outer
    return wide


def language_model_head(b: GraphBuilder, x: str, hidden: int, vocab: int, training: bool) -> None:
    """The LM head on the final norm's output `x`: logits as the output, or with `training` the
    token cross-entropy and the whole training step after it."""
    logits = b.op("matmul", [x, b.parameter("lm_head.w", (hidden, vocab))], "logits")
    if training:
        add_training_step(b, *cross_entropy_loss(b, logits))
    else:
        b.mark_outputs(logits)


def add_training_step(b: GraphBuilder, loss: str, seeds: dict[str, str], precision: str | None = None) -> None:
    """Backward from the loss gradients to every parameter, then Adam; outputs the loss and the
    updated parameters and moments. `precision`: a name in `PRECISIONS` (default: the one
    `training_precision` scopes, else `DEFAULT_PRECISION`)."""
    mode = check_precision(precision if precision is not None else _precision.get())
    params = b.tensors_with_role("parameter")
    other = [p for p in params if DTYPES[b.dtype_of(p)].is_float and b.dtype_of(p) != (mode.dtype or b.dtype_of(p))]
    if other:
        raise InputError(f"{mode.name} computes in {mode.dtype}, but parameter {other[0]!r} is {b.dtype_of(other[0])} "
                         f"({len(other)} of {len(params)} are not {mode.dtype}); give the model in {mode.dtype}, or use "
                         f"adam32, which keeps its dtypes", "precision")
    if mode.loss_scale:
        seeds = scaled_seeds(b, seeds)
    grads = add_backward(b, seeds, params)
    if mode.master_weights:
        grads = main_gradients(b, grads)
    grads = declare_gradients(b, grads)
    b.mark_outputs(loss, *add_adam(b, params, grads, mode.master_weights, mode.loss_scale))


def scaled_seeds(b: GraphBuilder, seeds: dict[str, str]) -> dict[str, str]:
    """The loss gradients times the input `loss.scale` (in their dtype): every gradient of the
    backward is of the loss times the scale, so small fp16 gradients stay above the smallest
    normal f16 (Micikevicius et al., 2018). The scale is an input because a run changes it (the
    dynamic scaling Megatron-LM and torch.amp do)."""
    scales: dict[str, str] = {}
    scaled = {}
    for y, g in seeds.items():
        dtype = b.dtype_of(g)
        if dtype not in scales:
            scales[dtype] = b.input(LOSS_SCALE if not scales else f"{LOSS_SCALE}.{dtype}", (), dtype)
        scaled[y] = b.op("mul", [g, scales[dtype]], f"{g}.scaled")
    return scaled

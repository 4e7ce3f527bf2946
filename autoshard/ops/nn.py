"""Neural-network blocks: scaled-dot-product attention, channels-last convolutions (1-D, 2-D, 3-D)
and 2-D max/average pooling.

Context parallelism: attention's key loop `t` may be split (the "combined" iterator type below).
A device holding a block of the keys computes its block's partial state of the online softmax:
the row maximum `m_j` (a partial `max` over the key axis), the exponent sums `l_j` and the
un-normalised weighted values `o_j`, both taken against `m_j`. The blocks are combined by
`all_reduce` max of `m_j` giving `M`, the rescaling `l_j * exp(m_j - M)`, `o_j * exp(m_j - M)`,
`all_reduce` sum of both, and `o / l` (the flash-decoding combine).

Why the op combines its own blocks rather than leaving a partial result: a sharding's partial
value is one tensor per device combined elementwise with one reduction kind, and a block of
attention's output cannot be combined without its row statistics (the output alone loses the
weight each block carries). So a split key loop is neither `reduction` (its results would claim a
partial kind no collective can finish) nor `invalid`: it is `combined`, a loop the op's own
realisation reduces over the loop's axes (the collectives above, priced by
`planning.costs.attention_combine_seconds`). Its results are complete and replicated over those
axes, exactly what the loop nest's maps say of a loop no result indexes. Nor is the split op
rewritten into its parts as graph ops (scores, max, exp, sum, weighted sum): that puts the
[B, H, S, T] scores in the graph, priced and held as a tensor where a fused kernel never writes
them, and the graph rather than the solver would choose between the fused and the split form.
The simulator runs the combine through the mesh collectives (`sim.attention`) and the
partitioned IR prints them (`mlir.lower`). With `t` whole the fused op is computed as before.
The gradient splits `t` the same way, combining only its row statistics first (`ops.grads`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from autoshard.affine import AffineExpr, AffineMap
from autoshard.ops.loops import INVALID, PARALLEL, REDUCTION, LoopNest
from autoshard.ops.table import Attrs, Context, OpError, OpKind, Shape, int_list_attr, register, shape_error

# A loop whose blocks the op combines itself over the loop's axes: splittable, its results whole.
COMBINED = "combined"
QUERY_LOOP, KEY_LOOP = 2, 4  # attention's loops: b0 h1 s2 e3 t4 d5


# --- scaled-dot-product attention -------------------------------------------------------
def _sdpa_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    """Loops b, h, s (queries), e (value features): parallel; t (keys): combined; d (query
    features): invalid.

    A split of t is combined by the op itself (the online-softmax combine, see the module
    docstring); splitting d makes the scores partial before the softmax, so it stays whole. An
    optional fourth input is a mask that broadcasts (numpy rules) to the scores [B, H, S, T]: a
    bool mask keeps the scores where it is true, any other mask is added to them.
    """
    q, k, v = shapes[:3]
    if len(q) != 4 or len(k) != 4 or len(v) != 4 or q[:2] != k[:2] or k[:3] != v[:3] or q[3] != k[3]:
        raise shape_error("q [B, H, S, D], k [B, H, T, D], v [B, H, T, E]", shapes)
    b, h, s, d = q
    t, e = k[2], v[3]
    balanced_devices(attrs, s, t)  # checked here so a bad layout is named when the graph is read
    L = lambda *loops: AffineMap(6, tuple(AffineExpr.loop(i) for i in loops))  # noqa: E731
    # loop order: b0 h1 s2 e3 t4 d5
    maps = (L(0, 1, 2, 5), L(0, 1, 4, 5), L(0, 1, 4, 3))
    if len(shapes) == 4:
        maps += (_mask_map(shapes[3], (b, h, s, t), shapes),)
    return LoopNest((b, h, s, e, t, d), (PARALLEL, PARALLEL, PARALLEL, PARALLEL, COMBINED, INVALID),
                    maps, (L(0, 1, 2, 3),))


def _mask_map(mask: Shape, scores: Shape, shapes: Sequence[Shape]) -> AffineMap:
    """The mask's dims, right-aligned to the scores' loops b, h, s, t; a size-1 dim reads index 0."""
    if len(mask) > 4 or any(m not in (1, n) for m, n in zip(mask, scores[4 - len(mask):])):
        raise shape_error("a mask that broadcasts to the scores [B, H, S, T]", shapes)
    loops = (0, 1, 2, 4)[4 - len(mask):]
    return AffineMap(6, tuple(AffineExpr.constant(0) if m == 1 and n != 1 else AffineExpr.loop(l)
                              for m, n, l in zip(mask, scores[4 - len(mask):], loops)))


# --- the load-balanced causal layout ------------------------------------------------------
# With the attribute `balanced_over` = n the query and key axes hold the sequence in the order
# that balances a causal split over n devices (Megatron-LM's and Llama 3's context parallelism):
# the sequence in 2n equal chunks, stored as chunk 0, chunk 2n - 1, chunk 1, chunk 2n - 2, ...
# so that the k-th of n contiguous blocks of the stored order holds chunks k and 2n - 1 - k, one
# early and one late: every block then keeps the same number of (query, key) pairs under the
# causal mask. The graph is written in the stored order where the sequence enters it (token ids,
# labels, position ids, masks, rotary tables: see `layout_order`); only the causal mask needs the
# true positions, which this attribute gives attention. Any split of the stored order is correct
# (the mask reads each slot's position); a contiguous split over n is the balanced layout.
BALANCED = "balanced_over"


def balanced_devices(attrs: Attrs, queries: int, keys: int) -> int | None:
    """The attribute `balanced_over` (None: the sequence in its own order), checked against the
    query and key lengths: each must divide into its 2n chunks."""
    if BALANCED not in attrs:
        return None
    n = attrs[BALANCED]
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise OpError(f"attribute {BALANCED!r} must be a positive integer (the devices the causal layout "
                      f"balances), got {n!r}", BALANCED)
    for what, length in (("queries", queries), ("keys", keys)):
        if length % (2 * n):
            raise OpError(f"attribute {BALANCED!r} = {n} stores the sequence in {2 * n} equal chunks, but the "
                          f"{length} {what} do not divide into them", BALANCED)
    return n


def chunk_at(slot: int, n: int) -> int:
    """The chunk of the sequence the `slot`-th stored chunk holds (of 2n)."""
    return slot // 2 if slot % 2 == 0 else 2 * n - 1 - slot // 2


def layout_order(length: int, n: int | None) -> np.ndarray:
    """The sequence position each stored index holds: `x[..., layout_order(S, n)]` is a sequence
    axis in the balanced order for n devices (None or n = 1: the identity)."""
    if not n or n == 1:
        return np.arange(length)
    chunk = length // (2 * n)
    return np.concatenate([np.arange(chunk) + chunk_at(slot, n) * chunk for slot in range(2 * n)])


def position_segments(start: int, size: int, length: int, n: int | None) -> list[tuple[int, int]]:
    """The stored indices [start, start + size) as runs of consecutive positions (first, count):
    one run in the sequence's own order, one per chunk touched in the balanced one."""
    if not n or n == 1 or size <= 0:
        return [(start, size)] if size > 0 else []
    chunk = length // (2 * n)
    runs = []
    for slot in range(start // chunk, (start + size - 1) // chunk + 1):
        lo, hi = max(start, slot * chunk), min(start + size, (slot + 1) * chunk)
        runs.append((chunk_at(slot, n) * chunk + lo - slot * chunk, hi - lo))
    return runs


def block_positions(ctx: Context, loop: int, count: int, length: int) -> np.ndarray:
    """Global positions of the block's `count` indices of `loop` (attention's queries or keys)."""
    n = ctx.attrs.get(BALANCED)
    return layout_order(length, n)[ctx.block.starts[loop] + np.arange(count)]


def attention_scores(inputs: Sequence[np.ndarray], ctx: Context) -> np.ndarray:
    """q k^T * scale with the causal mask and the mask input applied (-inf where masked);
    `inputs` are q, k, v and the optional mask, each cut to the block."""
    q, k = inputs[0], inputs[1]
    scale = ctx.attrs.get("scale", 1.0 / np.sqrt(ctx.block.extents[5]))
    scores = np.einsum("bhsd,bhtd->bhst", q, k) * scale
    if ctx.attrs.get("causal", False):
        # Positions are global: a block of queries from s0 and keys from t0 masks each query's later keys
        # (in the balanced layout each stored index's position, `layout_order`).
        s, t = ctx.block.extents[QUERY_LOOP], ctx.block.extents[KEY_LOOP]
        rows = block_positions(ctx, QUERY_LOOP, q.shape[2], s)[:, None]
        cols = block_positions(ctx, KEY_LOOP, k.shape[2], t)[None, :]
        scores = np.where(cols <= rows, scores, -np.inf)
    if len(inputs) == 4:
        mask = inputs[3]
        scores = np.where(mask, scores, -np.inf) if mask.dtype == np.bool_ else scores + mask
    return scores


def attention_weights(inputs: Sequence[np.ndarray], ctx: Context) -> np.ndarray:
    """softmax(q k^T * scale) over the keys, with the causal mask and the mask input applied;
    `inputs` are q, k, v and the optional mask, each cut to the block."""
    scores = attention_scores(inputs, ctx)
    scores = scores - np.max(scores, axis=-1, keepdims=True)
    weights = np.exp(scores)
    return weights / np.sum(weights, axis=-1, keepdims=True)


def _sdpa(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    return [np.einsum("bhst,bhte->bhse", attention_weights(inputs, ctx), inputs[2])]


def attention_block_state(inputs: Sequence[np.ndarray], ctx: Context) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One block of keys' online-softmax state: the row maximum m [B, H, S], the exponent sums
    l [B, H, S] and the weighted values o [B, H, S, E], both against m. A row whose keys are all
    masked in this block has m = -inf and l = o = 0, so it weighs nothing in the combine."""
    scores = attention_scores(inputs, ctx)
    row_max = np.max(scores, axis=-1)
    shift = np.where(np.isneginf(row_max), 0.0, row_max)[..., None]
    weights = np.exp(scores - shift)
    return row_max, np.sum(weights, axis=-1), np.einsum("bhst,bhte->bhse", weights, inputs[2])


def rescale_block_state(row_max: np.ndarray, exp_sum: np.ndarray, weighted: np.ndarray,
                        global_max: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A block's exponent sums and weighted values against the global row maximum (the
    rescaling between the combine's `all_reduce` max and its `all_reduce` sum)."""
    # exp(-inf) = 0 for a block whose row is all masked; a row masked everywhere stays 0 / 0 as unsplit
    factor = np.exp(row_max - np.where(np.isneginf(global_max), 0.0, global_max))
    return exp_sum * factor, weighted * factor[..., None]


def causal_pairs(queries: int, keys: int, first_query: int = 0, first_key: int = 0) -> int:
    """(query, key) pairs the causal mask keeps for `queries` consecutive queries from position
    `first_query` over `keys` consecutive keys from position `first_key`: query i sees keys up
    to i."""
    def seen_before(n: int) -> int:  # pairs of the queries before position first_key + n
        return 0 if n <= 0 else n * (n + 1) // 2 if n <= keys else keys * (keys + 1) // 2 + (n - keys) * keys
    return seen_before(first_query + queries - first_key) - seen_before(first_query - first_key)


def attention_pairs(nest: LoopNest, attrs: Attrs) -> float:
    """(batch, head, query, key) points attention computes: every pair, or under the causal
    mask only the unmasked ones (about half the square plus its diagonal); the masked ones cost
    nothing in a kernel that skips them, as flash attention's causal kernels do."""
    b, h, s, _, t, _ = nest.extents
    return float(b * h * (causal_pairs(s, t) if attrs.get("causal", False) else s * t))


def _sdpa_flops(nest: LoopNest, attrs: Attrs) -> float:
    d, e = nest.extents[5], nest.extents[3]
    return (2.0 * (d + e) + 5.0) * attention_pairs(nest, attrs)


def block_causal_pairs(first_query: int, queries: int, first_key: int, keys: int, s: int, t: int,
                       balanced: int | None = None) -> int:
    """Unmasked (query, key) pairs of a block of stored queries and keys: in the balanced layout
    (`balanced` devices) the sum over the runs of consecutive positions the block holds."""
    return sum(causal_pairs(q_count, k_count, q_first, k_first)
               for q_first, q_count in position_segments(first_query, queries, s, balanced)
               for k_first, k_count in position_segments(first_key, keys, t, balanced))


def block_pair_counts(nest: LoopNest, attrs: Attrs, splits: Sequence[int]) -> list[int]:
    """Unmasked (query, key) pairs of each (query block, key block) of a split of the queries
    and keys into `splits` contiguous blocks of the stored order (every pair without the causal
    mask), per batch and head."""
    s, t = nest.extents[QUERY_LOOP], nest.extents[KEY_LOOP]
    rows, cols = -(-s // splits[QUERY_LOOP]), -(-t // splits[KEY_LOOP])
    starts = [(i, j) for i in range(0, s, rows) for j in range(0, t, cols)]
    if not attrs.get("causal", False):
        return [min(rows, s - i) * min(cols, t - j) for i, j in starts]
    return [block_causal_pairs(i, min(rows, s - i), j, min(cols, t - j), s, t, attrs.get(BALANCED)) for i, j in starts]


def attention_block_share(nest: LoopNest, attrs: Attrs, splits: Sequence[int]) -> float:
    """The busiest device's share of attention's FLOPs. Its (query, key) pairs are its block's:
    under the causal mask the unmasked area of its query and key blocks (with the queries in n
    contiguous blocks the last does 2n - 1 times the first's work; in the balanced layout over n
    they all do the same). Of each pair's work only the weighted values' 2e FLOPs divide with a
    split of the value features e: every device of such a split computes the scores and the
    softmax (2d + 5) of its pairs whole."""
    b, h, s, e, t, d = nest.extents
    if attrs.get("causal", False):
        busiest = max(block_pair_counts(nest, attrs, splits))
    else:
        busiest = -(-s // splits[QUERY_LOOP]) * -(-t // splits[KEY_LOOP])
    pairs = -(-b // splits[0]) * -(-h // splits[1]) * busiest / attention_pairs(nest, attrs)
    per_pair = 2.0 * (d + e) + 5.0
    return pairs * (2.0 * d + 5.0 + 2.0 * -(-e // splits[3])) / per_pair


register(OpKind("attention", (3, 4), _sdpa_loops, _sdpa, _sdpa_flops, attrs=("causal", "scale", BALANCED),
                float_only=True,
                block_share=attention_block_share,
                doc="softmax(q k^T * scale [causal mask] [mask]) v over [B, H, S, D] heads, optional mask input; "
                    "balanced_over = n: the sequence stored in the load-balanced causal order for n devices"))


# --- convolution and pooling, channels last -----------------------------------------------
# Spatial loops read the input through windows `d_out * stride + d_kernel - pad`: they split with
# halos (see `LoopNest.window`); kernel loops stay whole. Reads outside the input see the
# padding: zero for convolutions and average pooling, the lowest value for max pooling (the
# identity of each op's `window_fill` reduction), so a halo's padding cells hold the same.
SPATIAL_NAMES = {1: "W", 2: "H, W", 3: "D, H, W"}


def window_params(attrs: Attrs, rank: int, default_strides: Sequence[int] | None = None
                  ) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """Strides and (before, after) padding of each of `rank` spatial dims."""
    strides = int_list_attr(attrs, "strides", default_strides or (1,) * rank)
    pad = attrs.get("padding", [[0, 0]] * rank)
    if len(strides) != rank or min(strides) < 1:
        raise OpError(f"attribute 'strides' must be {rank} positive integers, got {list(strides)}", "strides")
    if (not isinstance(pad, (list, tuple)) or len(pad) != rank
            or not all(isinstance(p, (list, tuple)) and len(p) == 2
                       and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in p) for p in pad)):
        raise OpError(f"attribute 'padding' must be {rank} [before, after] pairs of non-negative integers "
                      f"(one per spatial dim {SPATIAL_NAMES[rank]}), got {pad!r}", "padding")
    return tuple(strides), tuple((p[0], p[1]) for p in pad)


def _window_outputs(spatial: Shape, kernel: Shape, strides: Sequence[int], pad: Sequence[tuple[int, int]],
                    shapes: Sequence[Shape]) -> tuple[int, ...]:
    out = tuple((n + a + b - k) // s + 1 for n, k, s, (a, b) in zip(spatial, kernel, strides, pad))
    if min(out) < 1:
        raise shape_error("a window no larger than the padded input", shapes)
    return out


def _window_exprs(out_loops: Sequence[int], kernel_loops: Sequence[int], strides: Sequence[int],
                  pad: Sequence[tuple[int, int]]) -> tuple[AffineExpr, ...]:
    return tuple(AffineExpr.loop(o, s) + AffineExpr.loop(k) + (-a)
                 for o, k, s, (a, _) in zip(out_loops, kernel_loops, strides, pad))


def windows(x: np.ndarray, kernel_at: Sequence[int], strides: Sequence[int], out: Sequence[int]) -> np.ndarray:
    """The input cells the window at kernel offset `kernel_at` reads for every output (spatial
    dims 1..r of a block already padded to the range it reads)."""
    return x[(slice(None),) + tuple(slice(k, k + s * (o - 1) + 1, s) for k, s, o in zip(kernel_at, strides, out))]


def _conv_loops(rank: int) -> Callable[[Sequence[Shape], Attrs], LoopNest]:
    def loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
        x, w = shapes
        if len(x) != rank + 2 or len(w) != rank + 2 or x[-1] != w[-2]:
            raise shape_error(f"x [N, {SPATIAL_NAMES[rank]}, C] and filter [K.., C, F] of rank {rank + 2}", shapes)
        strides, pad = window_params(attrs, rank)
        out = _window_outputs(x[1:-1], w[:rank], strides, pad, shapes)
        # loops: n, the outputs' spatial dims, f, the kernel's, c
        n_loops = 2 * rank + 3
        spatial, f, kernel, c = range(1, rank + 1), rank + 1, range(rank + 2, 2 * rank + 2), 2 * rank + 2
        d = AffineExpr.loop
        x_map = AffineMap(n_loops, (d(0),) + _window_exprs(spatial, kernel, strides, pad) + (d(c),))
        w_map = AffineMap(n_loops, tuple(d(k) for k in kernel) + (d(c), d(f)))
        out_map = AffineMap(n_loops, (d(0),) + tuple(d(o) for o in spatial) + (d(f),))
        iterators = (PARALLEL,) * (rank + 2) + (INVALID,) * rank + (REDUCTION,)
        return LoopNest((x[0],) + out + (w[-1],) + tuple(w[:rank]) + (x[-1],), iterators, (x_map, w_map), (out_map,),
                        input_shapes=(tuple(x), tuple(w)))
    return loops


def _conv(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    x, w = inputs
    rank = x.ndim - 2
    strides, _ = window_params(ctx.attrs, rank)
    out_shape = ctx.out_shapes[0]
    out = np.zeros(out_shape, dtype=np.result_type(x, w))
    for kernel_at in np.ndindex(*w.shape[:rank]):
        out += np.tensordot(windows(x, kernel_at, strides, out_shape[1:-1]), w[kernel_at], axes=([-1], [0]))
    return [out]


def _conv_flops(nest: LoopNest, attrs: Attrs) -> float:
    return 2.0 * nest.points()


for _rank, _layout in ((1, "NWC input, [KW, C, F] filter"), (2, "NHWC input, [KH, KW, C, F] filter"),
                       (3, "NDHWC input, [KD, KH, KW, C, F] filter")):
    register(OpKind(f"conv{_rank}d", (2, 2), _conv_loops(_rank), _conv, _conv_flops, attrs=("strides", "padding"),
                    window_fill=lambda attrs: "sum",
                    doc=f"{_layout}, strides, explicit padding (spatial dims split with halos)"))


def _pool_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    (x,) = shapes
    if len(x) != 4:
        raise shape_error("x [N, H, W, C]", shapes)
    window = int_list_attr(attrs, "window")
    if len(window) != 2 or min(window) < 1:
        raise OpError(f"attribute 'window' must be two positive integers, got {list(window)}", "window")
    strides, pad = window_params(attrs, 2, window)
    out = _window_outputs(x[1:3], window, strides, pad, shapes)
    # loops: n0 oh1 ow2 c3 kh4 kw5
    d = AffineExpr.loop
    x_map = AffineMap(6, (d(0),) + _window_exprs((1, 2), (4, 5), strides, pad) + (d(3),))
    out_map = AffineMap(6, (d(0), d(1), d(2), d(3)))
    return LoopNest((x[0],) + out + (x[3],) + tuple(window), (PARALLEL,) * 4 + (INVALID,) * 2, (x_map,), (out_map,),
                    input_shapes=(tuple(x),))


def _pool(reduce: Callable[[np.ndarray, np.ndarray], np.ndarray], scale: bool
          ) -> Callable[[list[np.ndarray], Context], list[np.ndarray]]:
    def compute(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
        (x,) = inputs
        strides, _ = window_params(ctx.attrs, 2, int_list_attr(ctx.attrs, "window"))
        kernel = ctx.block.sizes[4:6]
        parts = [windows(x, at, strides, ctx.out_shapes[0][1:3]) for at in np.ndindex(*kernel)]
        out = parts[0]
        for part in parts[1:]:
            out = reduce(out, part)
        # average pooling counts the padding cells (count_include_pad)
        return [out / np.prod(kernel) if scale else out]
    return compute


register(OpKind("max_pool2d", (1, 1), _pool_loops, _pool(np.maximum, False), lambda n, a: float(n.points()),
                attrs=("window", "strides", "padding"), window_fill=lambda attrs: "max",
                doc="NHWC max over windows [KH, KW] (strides default to the window); padding reads as the lowest value"))
register(OpKind("avg_pool2d", (1, 1), _pool_loops, _pool(np.add, True), lambda n, a: float(n.points()),
                attrs=("window", "strides", "padding"), window_fill=lambda attrs: "sum",
                doc="NHWC mean over windows [KH, KW] (strides default to the window), padding counted as zeros"))

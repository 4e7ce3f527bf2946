"""Routed experts: the sort-and-grouped-matmul dispatch of a mixture-of-experts layer, rewritten
as a dense dispatch made of op-table rows.

`transformers` runs a layer's experts (Mixtral, Qwen-MoE and the others that share its experts
implementation) on tokens x [T, H], each routed to k experts `ids` [T, k] with weights `w` [T, k]:

    flat = ids.reshape(-1); sorted_ids, perm = sort(flat)            S = T * k slots
    offs = cumsum(histc(sorted_ids, E, 0, E - 1))                    slots per expert
    h = grouped_mm(x[perm // k], up [E, H, F1], offs)                each slot through its expert
    y = grouped_mm(act(h), down [E, F2, H], offs) * w.reshape(-1)[perm][:, None]
    inv[perm] = arange(S); out = y[inv].reshape(T, k, H).sum(1)

that is out[t] = sum_j w[t, j] * f_{ids[t, j]}(x[t]), with f_e(x) = act(x up[e]) down[e]. The
dense form computes every expert on every token and weighs it by the combine matrix

    c [T, E]     = dot_general(w [T, k], one_hot(ids) [T, k, E])        zero for unpicked experts
    h [T, E, F1] = dot_general(x, up);  a = act(h)  (the program's own elementwise ops)
    y [E, T, H]  = dot_general(a, down)                                 batch E
    out [T, H]   = dot_general(c, y)                                    contract E

which equals the routed one up to float rounding (for finite expert outputs): an unpicked
expert adds 0 * f_e(x). It costs E / k times the experts' FLOPs, and the expert loop is an
ordinary loop of the contractions, so splitting it over a mesh axis is expert parallelism.

Only this exact chain is rewritten: any other shape of it stays opaque, op by op, as before.
`capacity` writes the same chain as routed computation at a static capacity instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoshard.frontends.torch.aten import ATEN, CHECKS, arg, target_key
from autoshard.frontends.torch.lowering import Lowering
from autoshard.frontends.torch.runtime import require_torch
from autoshard.frontends.torch.values import dtype_name

torch = require_torch()

GROUPED_MM = ("grouped_mm_fallback.default", "_grouped_mm.default")
RESHAPES = ("view.default", "reshape.default", "_unsafe_view.default")
# aten ops allowed between the two grouped matmuls: elementwise over the slots, so they apply
# unchanged to the dense [T, E, F] values (a split must be of the last dim, counted from the end)
ACTIVATION = ("silu.default", "gelu.default", "relu.default", "sigmoid.default", "tanh.default",
              "mul.Tensor", "add.Tensor", "sub.Tensor", "div.Tensor", "mul.Scalar", "add.Scalar",
              "split.Tensor", "split_with_sizes.default", "getitem", "clone.default", "alias.default")


class NoMatch(Exception):
    pass


@dataclass(frozen=True)
class RoutedExperts:
    anchor: Any  # the FX node of the experts' output [T, H]
    covered: tuple[Any, ...]  # the FX nodes the rewrite replaces, anchor included, in program order
    tokens: Any  # [T, H]
    expert_ids: Any  # [T, k]
    weights: Any  # [T, k]
    up: Any  # [E, H, F1]
    down: Any  # [E, F2, H]
    first: Any  # the grouped matmul with `up`
    second: Any  # the grouped matmul with `down`
    activation: tuple[Any, ...]  # the nodes from `first`'s value to `second`'s input, in program order


def find_routed_experts(nodes: list[Any]) -> list[RoutedExperts]:
    """Every routed-experts chain of the program (`nodes` in program order)."""
    order = {n.name: i for i, n in enumerate(nodes)}
    found = []
    for node in nodes:
        if _key(node) == "sum.dim_IntList":
            try:
                found.append(_match(node, order))
            except (NoMatch, ValueError, TypeError, IndexError, AttributeError):
                continue  # another sum, or arguments of another form than the chain's
    return found


def lower_routed_experts(lw: Lowering, m: RoutedExperts) -> str:
    """The dense dispatch of `m` into `lw`; returns the graph tensor of the experts' output."""
    x, ids, w = lw.tensor(m.tokens), lw.tensor(m.expert_ids), lw.tensor(m.weights)
    up, down = lw.tensor(m.up), lw.tensor(m.down)
    name, experts = m.anchor.name, lw.shape(up)[0]
    out_dtype = m.anchor.meta["val"].dtype
    w_dtype = m.weights.meta["val"].dtype
    hot = lw.op("one_hot", [ids], f"{name}.one_hot",
                lambda i: torch.nn.functional.one_hot(i, experts).to(w_dtype),
                num_classes=experts, dtype=lw.builder.dtype_of(w))
    combine = lw.op("dot_general", [w, hot], f"{name}.combine_weights", einsum_call("tk,tke->te"),
                    lhs_batch_dims=[0], rhs_batch_dims=[0], lhs_contracting_dims=[1], rhs_contracting_dims=[1])
    lw.values[m.first.name] = lw.op("dot_general", [x, up], m.first.name, einsum_call("th,ehf->tef"),
                                    lhs_contracting_dims=[1], rhs_contracting_dims=[1])
    for node in m.activation:
        lw.values[node.name] = ATEN[_key(node)](lw, node)
    y = lw.op("dot_general", [lw.tensor(m.second.args[0]), down], m.second.name, einsum_call("tef,efh->eth"),
              lhs_batch_dims=[1], rhs_batch_dims=[0], lhs_contracting_dims=[2], rhs_contracting_dims=[1])
    # the routed form multiplies in the promoted dtype of the expert outputs and the weights
    combine, y = (cast_to(lw, t, out_dtype, f"{name}.{role}")
                  for t, role in ((combine, "combine_cast"), (y, "experts_cast")))
    return lw.op("dot_general", [combine, y], name, einsum_call("te,eth->th"),
                 lhs_batch_dims=[0], rhs_batch_dims=[1], lhs_contracting_dims=[1], rhs_contracting_dims=[0])


def einsum_call(spec: str) -> Any:
    return lambda a, b: torch.einsum(spec, a, b)


def cast_to(lw: Lowering, tensor: str, dtype: Any, name: str) -> str:
    ours = dtype_name(dtype)
    if lw.builder.dtype_of(tensor) == ours:
        return tensor
    return lw.op("cast", [tensor], name, lambda t: t.to(dtype), dtype=ours)


# --- matching -------------------------------------------------------------------------------
def _key(node: Any) -> str:
    return target_key(node.target) if getattr(node, "op", None) == "call_function" else ""


def _expect(node: Any, *keys: str) -> Any:
    if _key(node) not in keys:
        raise NoMatch
    return node


def _shape(node: Any) -> tuple[int, ...]:
    value = node.meta.get("val") if hasattr(node, "meta") else None
    if not isinstance(value, torch.Tensor):
        raise NoMatch
    return tuple(int(s) for s in value.shape)


def _is_float(node: Any) -> bool:
    return node.meta["val"].dtype.is_floating_point


def _match(anchor: Any, order: dict[str, int]) -> RoutedExperts:
    covered = [anchor]

    def take(node: Any, *keys: str) -> Any:
        covered.append(_expect(node, *keys))
        return node

    # out = y[inv].reshape(T, k, H).sum(1)
    if list(arg(anchor, 1, "dim") or []) not in ([1], [-2]) or arg(anchor, 2, "keepdim", False):
        raise NoMatch
    t, k, h = _shape(take(anchor.args[0], *RESHAPES))
    restored = take(anchor.args[0].args[0], "index.Tensor")
    weighted, (inverse,) = restored.args[0], restored.args[1]
    # inv[perm] = arange(S)
    take(inverse, "index_put.default")
    empty, (perm,), ramp = inverse.args[:3]
    if arg(inverse, 3, "accumulate", False) or _key(empty) != "empty_like.default" or empty.args[0] is not perm:
        raise NoMatch
    take(empty, "empty_like.default")
    take(ramp, "arange.default", "arange.start")
    if _shape(ramp) != (t * k,) or (_key(ramp) == "arange.start" and ramp.args[0] != 0) or ramp.args[-1] != t * k:
        raise NoMatch
    # y = grouped_mm(...) * w.reshape(-1)[perm][:, None]
    take(weighted, "mul.Tensor")
    second, scale = weighted.args if _key(weighted.args[0]) in GROUPED_MM else weighted.args[::-1]
    take(second, *GROUPED_MM)
    take(scale, "unsqueeze.default")
    if scale.args[1] not in (1, -1):
        raise NoMatch
    picked = take(scale.args[0], "index.Tensor")
    flat_w, (perm_w,) = picked.args
    take(flat_w, *RESHAPES)
    weights = flat_w.args[0]
    if perm_w is not perm or _shape(flat_w) != (t * k,) or _shape(weights) != (t, k) or not _is_float(weights):
        raise NoMatch
    # perm: the slots sorted by expert, ascending
    sort = take(perm, "getitem").args[0]
    take(sort, "sort.default", "sort.stable")
    if perm.args[1] != 1 or arg(sort, 2 if _key(sort) == "sort.default" else 3, "descending", False) \
            or arg(sort, 1 if _key(sort) == "sort.default" else 2, "dim", -1) not in (0, -1):
        raise NoMatch
    flat_ids = take(sort.args[0], *RESHAPES)
    expert_ids = flat_ids.args[0]
    if _shape(flat_ids) != (t * k,) or _shape(expert_ids) != (t, k) or _is_float(expert_ids):
        raise NoMatch
    # both grouped matmuls run on the same offsets, cumsum(histc(sorted ids, E, 0, E - 1))
    first, activation = _activation(second)
    covered += [first, *activation]
    up, down = _grouped_weight(first), _grouped_weight(second)
    experts = _shape(up)[0]
    if _offsets(first) is not _offsets(second) or _shape(down)[0] != experts or _shape(up)[1] != h or _shape(down)[2] != h:
        raise NoMatch
    offsets = _offsets(first)
    while _key(offsets) == "_to_copy.default":
        offsets = take(offsets, "_to_copy.default").args[0]
    take(offsets, "cumsum.default")
    if offsets.args[1] not in (0, -1):
        raise NoMatch
    histogram = offsets.args[0]
    while _key(histogram) == "_to_copy.default":
        histogram = take(histogram, "_to_copy.default").args[0]
    take(histogram, "histc.default")
    if list(histogram.args[1:4]) != [experts, 0, experts - 1]:
        raise NoMatch
    sorted_ids = histogram.args[0]
    while _key(sorted_ids) == "_to_copy.default":
        sorted_ids = take(sorted_ids, "_to_copy.default").args[0]
    take(sorted_ids, "getitem")
    if sorted_ids.args != (sort, 0):
        raise NoMatch
    # the tokens: x[perm // k]
    gathered = take(first.args[0], "index.Tensor")
    tokens, (slot_token,) = gathered.args
    take(slot_token, "floor_divide.default")
    if slot_token.args != (perm, k) or _shape(tokens) != (t, h):
        raise NoMatch
    _check_closed(covered, anchor)
    by_order = lambda nodes: tuple(sorted(dict.fromkeys(nodes), key=lambda n: order[n.name]))  # noqa: E731
    return RoutedExperts(anchor, by_order(covered), tokens, expert_ids, weights, up, down, first, second,
                         by_order(activation))


def _activation(second: Any) -> tuple[Any, list[Any]]:
    """The first grouped matmul, and the nodes from its value to the second's input: elementwise
    over the slots (every tensor they make is [S, F]), reading nothing else (numbers aside)."""
    first, chain, stack = None, [], [second.args[0]]
    while stack:
        node = stack.pop()
        if node is first or node in chain:
            continue
        key = _key(node)
        if key in GROUPED_MM and first is None:
            first = node
            continue
        if key not in ACTIVATION:
            raise NoMatch
        if key in ("split.Tensor", "split_with_sizes.default") and arg(node, 2, "dim", 0) >= 0:
            raise NoMatch  # counted from the end, the split dim is the same in the dense values
        chain.append(node)
        stack += list(node.all_input_nodes)
    if first is None:
        raise NoMatch
    slots = _shape(first)[0]
    if any(isinstance(n.meta.get("val"), torch.Tensor) and (len(_shape(n)) != 2 or _shape(n)[0] != slots) for n in chain):
        raise NoMatch
    return first, chain


def _grouped_weight(node: Any) -> Any:
    weight = node.args[1]
    if len(_shape(weight)) != 3 or len(_shape(node.args[0])) != 2:
        raise NoMatch
    if _key(node) == "_grouped_mm.default" and (arg(node, 3, "bias") is not None or arg(node, 4, "out_dtype") is not None):
        raise NoMatch
    return weight


def _offsets(node: Any) -> Any:
    offsets = arg(node, 2, "offs")
    if offsets is None:
        raise NoMatch
    return offsets


def _check_closed(covered: list[Any], anchor: Any) -> None:
    """No value inside the chain is read outside it: only the anchor's is."""
    inside = {n.name for n in covered}
    for node in covered:
        if node is anchor:
            continue
        for user in node.users:
            if user.name not in inside and _key(user) not in CHECKS:
                raise NoMatch

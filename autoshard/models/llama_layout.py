"""Megatron-LM's layout of a llama-style step (`generate gpt --style llama`, dense or with routed
experts), as required shardings by the layer's value names, for `search --compare` (axes `tp`, `ep`,
`dp`) and the layouts the search's keys start from (any axis names).

Tensor parallelism over the tensor axes as in Megatron's own layer (`layouts.megatron_constraints`): the
query, key and value projections column-parallel (heads split), the output projection and the
MLP's down projection row-parallel, the SwiGLU's features split; with sequence parallelism the
norms and residuals (and the embedding, layer 0's input) split on the sequence.

Expert parallelism as Megatron-LM and NeMo set `expert_model_parallel_size`: the expert devices
are carved out of the data-parallel ones. The batch of attention, the router and every dense part
is split over all data axes (for `--compare`, `dp` then `ep`, with dp the data replicas left per
expert group: the layout's dp / ep); the routed experts' weights split on their expert dim over
the expert axes (with their features over the tensor axes, expert tensor parallelism equal to
tp), replicated over the other data axes (expert data parallelism). The dispatched tokens leave
the dispatch split on their groups over every data axis and enter the experts split on the
expert dim over the expert axes and on the groups over the other data axes only: the all-to-all
over the expert axes, and again on the way back to the combine."""

from __future__ import annotations

from typing import Any

ATTENTION_HEADS = ("attn.q.heads", "attn.k.heads", "attn.v.heads", "attn.sdpa")  # [B, heads, S, hd]
FEATURES = ("attn.merged", "mlp.gate", "mlp.up", "mlp.silu", "mlp.glu",  # [B, S, features]
            "mlp.shared.gate", "mlp.shared.up", "mlp.shared.silu", "mlp.shared.glu")
COLUMN = ("attn.q.w", "attn.k.w", "attn.v.w", "mlp.gate.w", "mlp.up.w", "mlp.shared.gate.w", "mlp.shared.up.w")
ROW = ("attn.out.w", "mlp.down.w", "mlp.shared.down.w")
SEQUENCE = ("attn_norm", "mlp_norm", "attn_residual", "mlp_residual")  # [B, S, H]
ROUTING = ("mlp.groups", "mlp.router", "mlp.gates", "mlp.combine_weights", "mlp.dispatch_tokens",
           "mlp.combine")  # the groups dim first, as dispatched
EXPERT_FEATURES = ("mlp.experts.gate", "mlp.experts.up", "mlp.experts.silu", "mlp.experts.glu")  # [E, G, C, F]
EXPERT_OUT = "mlp.experts.down"  # [E, G, C, H]
EXPERT_COLUMN, EXPERT_ROW = ("mlp.experts.gate.w", "mlp.experts.up.w"), ("mlp.experts.down.w",)
ROUTER = "mlp.router.w"


def routed_experts(document: dict[str, Any]) -> int:
    """The routed experts of each layer of a llama-style graph (0: a dense MLP)."""
    shapes = [t["shape"] for name, t in document["tensors"].items() if name.endswith("." + EXPERT_COLUMN[0])]
    return shapes[0][0] if shapes else 0


def llama_constraints(document: dict[str, Any], sequence_parallel: bool, data_axes: tuple[str, ...], *,
                      tensor_axes: tuple[str, ...] = (), expert_axes: tuple[str, ...] = ()
                      ) -> list[dict[str, Any]]:
    """Required shardings of a llama-style step's layer values, matrices and batch inputs: the
    batch over `data_axes` (the expert axes among them: expert parallelism takes its devices from
    the data replicas), heads and features over `tensor_axes`, the routed experts over
    `expert_axes` and their groups over the data axes left."""
    batch, tp = [list(data_axes)], list(tensor_axes)
    ep, replicas = list(expert_axes), [a for a in data_axes if a not in expert_axes]
    constraints = []
    for name, tensor in document["tensors"].items():
        local, rank = name.split(".", 1)[-1], len(tensor["shape"])
        in_layer = name.startswith("layer")
        if in_layer and local in ATTENTION_HEADS:
            axes = batch + [tp] + [[]] * (rank - 2)
        elif in_layer and local in FEATURES:
            axes = batch + [[]] * (rank - 2) + [tp]
        elif in_layer and local in COLUMN:
            axes = [[], tp]
        elif in_layer and local in ROW:
            axes = [tp, []]
        elif (in_layer and local in SEQUENCE) or name == "embed":
            axes = batch + ([tp, []] if sequence_parallel else [[]] * (rank - 1))
        elif in_layer and local in ROUTING:
            axes = batch + [[]] * (rank - 1)
        elif in_layer and local in EXPERT_FEATURES:
            axes = [ep, replicas, [], tp]
        elif in_layer and local == EXPERT_OUT:  # with tp, a partial sum or reduced: the solver's choice
            axes = [ep, replicas, [], []]
        elif in_layer and local in EXPERT_COLUMN:
            axes = [ep, [], tp]
        elif in_layer and local in EXPERT_ROW:
            axes = [ep, tp, []]
        elif in_layer and local == ROUTER:
            axes = [[], []]
        elif tensor.get("role") == "input" and tensor.get("batch_dim") == 0:
            axes = batch + [[]] * (rank - 1)
        else:
            continue
        constraints.append({"tensor": name, "split_axes": axes, "required": True})
    return constraints

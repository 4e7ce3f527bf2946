"""`search --by-layer --compare 'tp=8,pp=16,dp=8,interleave=1,micro=1,recompute=full'`: a user's own
layout in Megatron-LM's words, priced by the same model as the search's configurations with
Megatron's shardings pinned (column- then row-parallel projections over tp, the batch over dp,
norms and residuals split on the sequence with sequence parallelism), and ranked among them.
Graphs of `generate gpt --style megatron` are pinned by `layouts.megatron_constraints`, those of
`--style llama` (dense or routed experts) by `llama_layout.llama_constraints`.

`ep` is Megatron-LM's and NeMo's `expert_model_parallel_size`: the routed experts split over ep
of the dp data replicas (ep divides dp; tp x pp x dp is every device, as without experts), the
experts replicated over the dp / ep groups of them (expert data parallelism).

The layout is a key of the search's space (`SampleTask`): S = pp stages, a sub-mesh
`dp/ep x ep x tp` (its axes `dp`, `ep`, `tp`; each of size 1 left out) with tp innermost (on a
node's GPUs), then ep, then dp, M = batch / (dp x micro) microbatches, its recomputation; its
schedule is 1F1B, or interleaved with `interleave` chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cost_models import load_profile

from autoshard.errors import InputError, Problem
from autoshard.graph.recompute import MODES
from autoshard.models.layouts import layer_style, megatron_constraints
from autoshard.models.llama_layout import llama_constraints, routed_experts
from autoshard.planning.layer_sample import LayerSample
from autoshard.search.candidates import Candidate
from autoshard.search.pipelined import stage_counts
from autoshard.search.sample_tasks import SampleTask

KEYS = ("tp", "pp", "dp", "ep", "interleave", "micro", "recompute", "sp")
YES_NO = {"1": True, "yes": True, "true": True, "0": False, "no": False, "false": False}


@dataclass(frozen=True)
class Layout:
    tensor: int
    pipeline: int
    data: int
    interleave: int
    micro: int
    recompute: str
    sequence_parallel: bool
    expert: int = 1  # of the data replicas, how many split the routed experts between them

    @property
    def words(self) -> str:
        experts = f" (ep {self.expert})" if self.expert > 1 else ""
        return (f"tp {self.tensor} x pp {self.pipeline} x dp {self.data}{experts}, V {self.interleave}, "
                f"micro {self.micro}, {self.recompute}{', SP' if self.sequence_parallel else ''}")


def parse_layout(text: str, where: str = "--compare") -> Layout:
    """`tp=8,pp=16,dp=8,interleave=1,micro=1,recompute=full[,sp=1][,ep=8]`; tp, pp and dp are
    required, ep (dividing dp), interleave and micro default to 1, recompute to none, sp to yes
    wherever tp > 1."""
    fields: dict[str, str] = {}
    problems = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, _, value = part.partition("=")
        key = key.strip().lower()
        if key not in KEYS or not value.strip():
            problems.append(Problem(where, f"expected key=value with keys {', '.join(KEYS)}, got {part!r}"))
        elif key in fields:
            problems.append(Problem(where, f"{key} is given twice"))
        else:
            fields[key] = value.strip().lower()
    numbers: dict[str, int] = {}
    for key, default in (("tp", None), ("pp", None), ("dp", None), ("ep", 1), ("interleave", 1), ("micro", 1)):
        value = fields.get(key)
        if value is None and default is None:
            problems.append(Problem(where, f"{key} is required (e.g. tp=8,pp=16,dp=8)"))
        elif value is not None and not (value.isascii() and value.isdigit() and int(value) >= 1):
            problems.append(Problem(where, f"{key} must be a positive integer, got {value!r}"))
        else:
            numbers[key] = int(value) if value is not None else default
    recompute = fields.get("recompute", "none")
    if recompute not in MODES:
        problems.append(Problem(where, f"recompute must be one of {', '.join(MODES)}, got {recompute!r}"))
    sp = fields.get("sp")
    if sp is not None and sp not in YES_NO:
        problems.append(Problem(where, f"sp must be 1 or 0, got {sp!r}"))
    if not problems and numbers["dp"] % numbers["ep"]:
        problems.append(Problem(where, f"ep={numbers['ep']} must divide dp={numbers['dp']}: the expert-parallel "
                                       f"devices are data replicas of the attention and dense parts (as Megatron-LM's "
                                       f"expert_model_parallel_size)"))
    if problems:
        raise InputError(problems)
    tensor = numbers["tp"]
    return Layout(tensor, numbers["pp"], numbers["dp"], numbers["interleave"], numbers["micro"], recompute,
                  YES_NO[sp] if sp is not None else tensor > 1, numbers["ep"])


def compared_key(layout: Layout, sample: LayerSample, topology: str, devices: int, batch: int
                 ) -> tuple[SampleTask, str, int, dict[str, Any]]:
    """The layout as a key of the search (its task, schedule and chunks) and the sample with
    Megatron's shardings pinned; every way it does not fit the model, devices or machine named.
    `batch`: the sequences a step takes (the greatest common divisor of the batches the sample
    declares: a routed MoE declares its token groups as a batch too)."""
    layers = len(sample.layers)
    problems = []
    if layout.tensor * layout.pipeline * layout.data != devices:
        problems.append(f"tp x pp x dp = {layout.tensor * layout.pipeline * layout.data}, but the search has "
                        f"{devices} devices")
    if layout.pipeline > 1 and layout.pipeline not in stage_counts(devices, layers):
        problems.append(f"pp={layout.pipeline} does not cut {layers} layers on {devices} devices "
                        f"(possible: {stage_counts(devices, layers)})")
    if batch % (layout.data * layout.micro):
        problems.append(f"the batch of {batch} does not split into dp x micro = {layout.data * layout.micro}")
    microbatches = max(batch // (layout.data * layout.micro), 1)
    if layout.interleave > 1 and (layout.pipeline == 1 or microbatches % layout.pipeline
                                  or layers % (layout.pipeline * layout.interleave)):
        problems.append(f"interleave={layout.interleave} needs pp > 1, the {microbatches} microbatches a multiple "
                        f"of pp and the {layers} layers a multiple of pp x interleave")
    candidate = _candidate(topology, layout) if not problems else None
    if not problems and candidate is None:
        problems.append(f"tp={layout.tensor}, ep={layout.expert} and dp={layout.data} do not fit the nodes of "
                        f"{topology}: tp inside one node, then ep, then dp / ep, each within a node or on whole nodes")
    pinned = dict(sample.document)
    constraints = _constraints(layout, sample.document, problems)
    if problems:
        raise InputError([Problem("--compare", message) for message in problems])
    pinned["constraints"] = list(sample.document.get("constraints", [])) + constraints
    assert candidate is not None
    task = SampleTask(layout.pipeline, candidate, microbatches, layout.recompute, sample.represented_by)
    schedule, chunks = ("interleaved", layout.interleave) if layout.interleave > 1 else ("1f1b", 1)
    return task, schedule, chunks, pinned


def _constraints(layout: Layout, document: dict[str, Any], problems: list[str]) -> list[dict[str, Any]]:
    """The layout's pins for a Megatron-style graph, else a llama-style one; a problem for each
    way the graph cannot hold it."""
    experts = routed_experts(document)
    if layout.expert > 1 and not experts:
        problems.append(f"ep={layout.expert} splits routed experts, but this graph has none (a `generate gpt --style "
                        f"llama --moe-experts N` graph has)")
    elif experts % layout.expert:
        problems.append(f"ep={layout.expert} must divide the {experts} routed experts of a layer")
    named = "pins Megatron-LM's layout by the value names of `generate gpt --style megatron` or `--style llama`"
    style = layer_style(document)
    if style == "megatron":
        constraints = megatron_constraints(document, layout.sequence_parallel, data_parallel=layout.data > 1)
    elif style == "gpt":
        problems.append(f"{named}; this graph is of `--style gpt` (biases, layer norms)")
        return []
    else:
        axes = tuple(axis for axis, size in (("dp", layout.data // layout.expert), ("ep", layout.expert)) if size > 1)
        constraints = llama_constraints(document, layout.sequence_parallel, axes,
                                        tensor_axes=("tp",) if layout.tensor > 1 else (),
                                        expert_axes=("ep",) if layout.expert > 1 else ())
    if not any(c["tensor"].startswith("layer") for c in constraints):
        problems.append(f"{named}; this graph has none of them")
    return constraints


def _candidate(topology: str, layout: Layout) -> Candidate | None:
    """The stage's sub-mesh: `tp` on the GPUs of a node, then `ep`, then the rest of the data
    replicas `dp` (dp / ep of them), each axis on the node's GPUs while they last, then across
    nodes (Megatron-LM's rank order, tensor fastest); None when tp does not fit in a node or an
    axis straddles nodes unevenly."""
    node = load_profile(topology).nvlink.domain_gpus
    inner, axes = 1, []
    for name, size in (("tp", layout.tensor), ("ep", layout.expert), ("dp", layout.data // layout.expert)):
        if size == 1:
            continue
        if name == "tp" and (size > node or node % size):
            return None  # tensor parallelism stays inside a node
        if inner < node < inner * size and (node % inner or inner * size % node):
            return None  # the axis would straddle nodes unevenly
        dims = ("gpu",) if inner * size <= node else ("node",) if inner >= node else ("node", "gpu")
        axes.insert(0, (name, size, dims))
        inner *= size
    if not axes:
        return None
    return Candidate(tuple(a[0] for a in axes), tuple(a[1] for a in axes), tuple((a[0], a[2]) for a in axes),
                     max(inner // node, 1), None)

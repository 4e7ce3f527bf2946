"""`search --by-layer --compare 'tp=8,pp=16,dp=8,interleave=1,micro=1,recompute=full'`: a user's own
layout in Megatron-LM's words, priced by the same model as the search's configurations with
Megatron's shardings pinned (column- then row-parallel projections over tp, the batch over dp,
norms and residuals split on the sequence with sequence parallelism), and ranked among them.

The layout is a key of the search's space (`SampleTask`): S = pp stages, a sub-mesh `dp x tp`
with tp inside a node (its inner axis on the GPUs) and dp outside it, M = batch / (dp x micro)
microbatches, its recomputation; its schedule is 1F1B, or interleaved with `interleave` chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cost_models import load_profile

from autoshard.errors import InputError, Problem
from autoshard.graph.recompute import MODES
from autoshard.models.layouts import megatron_constraints
from autoshard.planning.layer_sample import LayerSample
from autoshard.search.candidates import Candidate
from autoshard.search.pipelined import stage_counts
from autoshard.search.sample_tasks import SampleTask

KEYS = ("tp", "pp", "dp", "interleave", "micro", "recompute", "sp")
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

    @property
    def words(self) -> str:
        return (f"tp {self.tensor} x pp {self.pipeline} x dp {self.data}, V {self.interleave}, micro {self.micro}, "
                f"{self.recompute}{', SP' if self.sequence_parallel else ''}")


def parse_layout(text: str, where: str = "--compare") -> Layout:
    """`tp=8,pp=16,dp=8,interleave=1,micro=1,recompute=full[,sp=1]`; tp, pp and dp are required,
    interleave and micro default to 1, recompute to none, sp to yes wherever tp > 1."""
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
    for key, default in (("tp", None), ("pp", None), ("dp", None), ("interleave", 1), ("micro", 1)):
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
    if problems:
        raise InputError(problems)
    tensor = numbers["tp"]
    return Layout(tensor, numbers["pp"], numbers["dp"], numbers["interleave"], numbers["micro"], recompute,
                  YES_NO[sp] if sp is not None else tensor > 1)


def compared_key(layout: Layout, sample: LayerSample, topology: str, devices: int, batch: int
                 ) -> tuple[SampleTask, str, int, dict[str, Any]]:
    """The layout as a key of the search (its task, schedule and chunks) and the sample with
    Megatron's shardings pinned; every way it does not fit the model, devices or machine named."""
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
        problems.append(f"tp={layout.tensor} does not fit inside one node of {topology}")
    pinned = dict(sample.document)
    constraints = megatron_constraints(sample.document, layout.sequence_parallel, data_parallel=layout.data > 1)
    if not constraints:
        problems.append("pins Megatron-LM's layout by the value names of `generate gpt --style megatron`; this "
                        "graph has none of them")
    if problems:
        raise InputError([Problem("--compare", message) for message in problems])
    pinned["constraints"] = list(sample.document.get("constraints", [])) + constraints
    assert candidate is not None
    task = SampleTask(layout.pipeline, candidate, microbatches, layout.recompute, sample.represented_by)
    schedule, chunks = ("interleaved", layout.interleave) if layout.interleave > 1 else ("1f1b", 1)
    return task, schedule, chunks, pinned


def _candidate(topology: str, layout: Layout) -> Candidate | None:
    """The stage's sub-mesh: `tp` on the GPUs of a node, `dp` outside it (across nodes, and the
    node's other GPUs first when tp leaves some); None when tp does not fit in a node or the
    stage's devices fill no whole nodes."""
    node = load_profile(topology).nvlink.domain_gpus
    size = layout.tensor * layout.data
    if layout.tensor > node or node % layout.tensor or (size > node and size % node):
        return None
    nodes = max(size // node, 1)
    outer = ("node",) if layout.tensor == node else ("node", "gpu") if nodes > 1 else ("gpu",)
    axes = [("dp", layout.data, outer)] if layout.data > 1 else []
    axes += [("tp", layout.tensor, ("gpu",))] if layout.tensor > 1 else []
    if not axes:
        return None
    return Candidate(tuple(a[0] for a in axes), tuple(a[1] for a in axes), tuple((a[0], a[2]) for a in axes),
                     nodes, None)

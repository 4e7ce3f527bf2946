"""A step time in the words users compare runs by: tokens per second per device and model FLOPs
utilisation (MFU).

- Model FLOPs: the forward and backward ops' FLOPs as the graph states them (a causal fused
  attention counts its unmasked pairs), without the recomputed copies and without the optimizer:
  work a plan adds to save memory does not count as useful work, so MFU compares plans that
  recompute with plans that do not.
- Tokens per step: the elements of the step's integer batch input (the token ids, [batch, seq]);
  a graph without one (an MLP on features) has samples, not tokens, and gets no token rate.
- The peak: the chip's peak rate for the dtype doing most of the model FLOPs (bf16 for a
  mixed-precision step), times the devices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from cost_models import load_profile

from autoshard.dtypes import DTYPES
from autoshard.graph.model import Graph
from autoshard.graph.recompute import PREFIX


@dataclass(frozen=True)
class Throughput:
    model_flops: float  # per step
    tokens: int | None  # per step
    peak_flops_per_s: float  # per device

    def of(self, step_s: float, devices: int) -> dict[str, Any]:
        """The rates of a plan whose step takes `step_s` on `devices`."""
        mfu = self.model_flops / (step_s * devices * self.peak_flops_per_s) if step_s > 0 else None
        tokens = self.tokens / step_s / devices if self.tokens is not None and step_s > 0 else None
        return {"tokens_per_s_per_device": tokens, "mfu": mfu}


def throughput(graph: Graph, topology: str, repeats: Mapping[str, int] | None = None) -> Throughput:
    """`repeats`: op name -> how many ops of the whole step it stands for (a layer sample's)."""
    phases = graph.phases
    by_dtype: dict[str, float] = {}
    for op in graph.ops:
        if phases[op.name] in ("forward", "backward") and not op.name.startswith(PREFIX) and op.outputs:
            dtype = graph.tensors[op.outputs[0]].dtype
            by_dtype[dtype] = by_dtype.get(dtype, 0.0) + op.flops() * (repeats or {}).get(op.name, 1)
    flops = sum(by_dtype.values())
    profile = load_profile(topology)
    peaks = profile.peak_flops_per_s
    main = max(by_dtype, key=by_dtype.get) if flops else profile.fallback_dtype
    peak = peaks.get(main, peaks[profile.fallback_dtype])
    token_inputs = [t for t in graph.tensors.values() if t.batch_dim is not None and t.name not in graph.producers
                    and not DTYPES[t.dtype].is_float and t.dtype != "bool"]
    tokens = max((math.prod(t.shape) for t in token_inputs), default=None)
    return Throughput(flops, tokens, peak)

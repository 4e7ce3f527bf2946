"""Which communication a step can run behind its compute, by the role of the tensor it moves.

- Hideable: a parameter's gradient reduction (an `all_reduce` or `reduce_scatter` of a
  `gradient` value: it runs behind the backward of the layers before it) and a parameter's
  `all_gather` (a `parameter` value, its in-place new value included: it is prefetched while
  the layer before it computes).
- Exposed: everything else (activations and their gradients between tensor-parallel ops, a
  gradient's other moves, the optimizer state's).

The step is then max(compute, hideable) + exposed: the hideable communication runs beside the
compute and costs only what exceeds it. A microbatched step reduces its gradients once, after
the last microbatch: only that microbatch's backward runs beside them, so a once-per-step
gradient reduction is hideable up to the last microbatch's backward compute, the rest exposed.
Pipeline transfers are hidden by the schedule's event simulation itself (sends do not stop a
stage), and a pipelined stage's tail by `pipeline_plan`.

This is a report beside the additive step (compute + communication), never above it: the
solver minimises and bounds the additive price (`make_plan`), and the overlapped step of the
same plan is at most that price.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from autoshard.resharding import step_kind

DESCRIPTION = ("by tensor role: a parameter's gradient reduction and all_gather run behind compute, the rest is "
               "exposed; step = max(compute, hideable) + exposed")


def hideable(kind: str, role: str) -> bool:
    """Whether a collective step of `kind` moving a value of tensor role `role` can run behind compute."""
    return (role == "gradient" and step_kind(kind).reduces) or (role == "parameter" and kind == "all_gather")


@dataclass
class OverlapTally:
    """Hideable communication seconds as a report adds them up, per mesh axis and in total; the
    once-per-step gradient reductions of a microbatched step apart, with the backward compute of
    the last microbatch that may hide them."""

    hideable_s: float = 0.0
    hideable_s_per_axis: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    after_last_s: float = 0.0  # gradient reductions run once after the last microbatch
    after_last_s_per_axis: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    last_backward_s: float = 0.0  # the last microbatch's backward compute

    def add(self, seconds: float, axes: tuple[str, ...], after_last: bool) -> None:
        if after_last:
            self.after_last_s += seconds
            per_axis = self.after_last_s_per_axis
        else:
            self.hideable_s += seconds
            per_axis = self.hideable_s_per_axis
        for axis in axes:  # a collective over several axes is charged to each of them, as the report does
            per_axis[axis] += seconds


@dataclass(frozen=True)
class Overlap:
    """What runs behind compute and what does not: in total and per mesh axis, hidden + exposed is
    the additive communication."""

    hideable_s: float  # communication that may run behind compute
    hidden_s: float
    exposed_s: float
    step_s: float  # max(compute, hideable) + exposed
    hidden_s_per_axis: dict[str, float]
    exposed_s_per_axis: dict[str, float]

    @classmethod
    def of(cls, tally: OverlapTally, compute_s: float, communication_s: float,
           seconds_per_axis: dict[str, float]) -> "Overlap":
        # a once-per-step reduction beyond the last microbatch's backward has nothing to run beside
        kept = min(1.0, tally.last_backward_s / tally.after_last_s) if tally.after_last_s > 0 else 0.0
        hideable_s = tally.hideable_s + tally.after_last_s * kept
        hidden_s = min(compute_s, hideable_s)
        share = hidden_s / hideable_s if hideable_s > 0 else 0.0  # each axis hides the same share of its hideable
        hidden = {axis: (tally.hideable_s_per_axis.get(axis, 0.0) + tally.after_last_s_per_axis.get(axis, 0.0) * kept)
                  * share for axis in seconds_per_axis}
        exposed = {axis: max(0.0, seconds - hidden[axis]) for axis, seconds in seconds_per_axis.items()}
        exposed_s = max(0.0, communication_s - hidden_s)
        return cls(hideable_s, hidden_s, exposed_s, compute_s + exposed_s, hidden, exposed)

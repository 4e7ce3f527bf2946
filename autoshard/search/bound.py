"""A certified lower bound on the objective any plan on a candidate's mesh can reach, and the
least peak memory any such plan needs, from the candidate's formulation alone (no solving).

The objective of a plan is the sum of its nodes' costs (each op's compute time on its option,
spread over the devices its option splits it on, plus the memory tie-break) and of its edges'
costs (the resharding each use pays). Charging every edge to its consumer,

    objective = sum_v [ c_v(s_v) + sum_{(u, v)} e_uv(s_u, s_v) ]
             >= sum_v min_s [ c_v(s) + sum_{(u, v)} min_t e_uv(t, s) ],

since every edge has exactly one consumer. The bound therefore holds the least compute a mesh
allows each op (an axis that divides no loop of the op leaves its work replicated) plus the least
communication the op's inputs need to reach any of its options (a partial sum reduced, a value
gathered), whichever plan the solver finds.

A few passes of TRW-S on the problem without its memory rows (the solver's own relaxation, with
every multiplier at 0) lift it further: their dual bound weighs every edge against both its ends,
so an op that splits its work is charged for the communication its neighbours then need. Dropping
the memory rows only relaxes the problem, so that bound holds too; the larger of the two is taken.

A candidate whose formulation the search had no time for gets `analytic_bound_ps` instead, which
needs no formulation: every term of the objective is at least 0, an op's node cost at least its
FLOPs spread over every device at the chip's rate (`least_compute_s`), and a stored tensor (an
input or parameter: weights and optimizer state) is held at least its bytes over the devices.
"""

from __future__ import annotations

import math

import numpy as np

from autoshard.graph.model import Graph
from autoshard.planning.costs import Hardware, least_compute_s
from autoshard.planning.formulation import PICOSECONDS, TIE_BREAK_PS_PER_BYTE, Weights
from autoshard.solver.flat import flatten
from autoshard.solver.lagrange import Relaxation
from autoshard.solver.problem import Problem, certified_lower

TRWS_PASSES = 8  # a few: the bound rises fastest in the first passes, and a solve runs hundreds
# Below 1 by far more than the rounding of a float product or quotient: the formulation computes
# a share of the work in another order than `least_compute_s`.
_ROUNDING_MARGIN = 1 - 1e-9


def objective_lower_bound_ps(problem: Problem, passes: int = TRWS_PASSES) -> int:
    """The larger of the two bounds above, in the solver's integer picoseconds of objective."""
    consumer = consumer_bound_ps(problem)
    if not problem.num_nodes or passes <= 0:
        return consumer
    relaxation = Relaxation(flatten(problem))
    relaxation.run(passes)
    return max(consumer, certified_lower(relaxation.bound()))


def consumer_bound_ps(problem: Problem) -> int:
    """Every node's cheapest strategy with its in-edges' cheapest costs into it."""
    incoming = [np.zeros(len(costs), dtype=np.int64) for costs in problem.node_costs]
    for (u, v), matrix in zip(problem.edges, problem.edge_costs):
        incoming[int(v)] += matrix.min(axis=0)
    return int(sum(int((costs + extra).min()) for costs, extra in zip(problem.node_costs, incoming)))


def least_peak_bytes(problem: Problem) -> int:
    """The least per-device peak of any plan: at every step, each live value at its smallest sharding."""
    if not problem.num_nodes:
        return 0
    steps = int(problem.intervals[:, 1].max())
    live = np.zeros(steps + 1, dtype=np.int64)
    for (start, end), usage in zip(problem.intervals, problem.node_usages):
        live[start:end] += int(usage.min())
    return int(live.max())


def analytic_bound_ps(graph: Graph, devices: int, hw: Hardware, weights: Weights) -> int:
    """A lower bound on the objective of any plan of `graph` on any mesh of `devices` devices of
    `hw`'s chip, without formulating it. Each node's cost is rounded to whole picoseconds on its
    own, so each term here is rounded down on its own."""
    bound = 0
    for op in graph.ops:
        seconds = least_compute_s(graph, op, devices, hw) * _ROUNDING_MARGIN
        bound += math.floor(seconds * PICOSECONDS * weights.time)
    ps_per_byte = weights.memory_s_per_byte * PICOSECONDS + TIE_BREAK_PS_PER_BYTE
    for tensor in graph.tensors.values():
        if tensor.role != "intermediate" and tensor.name not in graph.producers:
            held = math.prod(tensor.shape) * tensor.itemsize / devices * _ROUNDING_MARGIN
            bound += math.floor(held * ps_per_byte)
    return bound

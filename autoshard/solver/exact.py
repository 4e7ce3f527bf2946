"""Exact solver: the problem as a CP-SAT model in the tight "marginal" form.

Variables: one boolean per (node, strategy) with `add_exactly_one`; for an edge (u, v) between
two nodes with a choice, one boolean per allowed strategy pair with
`sum_t y[s, t] == x[u, s]` and `sum_s y[s, t] == x[v, t]` (its LP relaxation is the local
polytope, much tighter than the usual `y >= x_u + x_v - 1`). Forbidden pairs get no variable.
A node with a single strategy folds its edges into its neighbours' costs. Memory: one row per
row of `flat.py` (the live sets that can overflow), over the usage each choice adds to the
node's smallest.

Costs are made integers explicitly: each node's and edge's minimum is moved into a constant
offset (exact), then the remainders are divided by `scale` and rounded down, with `scale` the
smallest integer keeping the sum of all coefficient maxima below 2**50. The model's objective
carries `offset / scale` as CP-SAT's objective offset, so its objective values and bounds are
flat costs divided by `scale`. Rounding down keeps `scale * bound` a valid lower bound on the
true optimum; the cost of the returned solution is always recomputed exactly from the Problem.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from ortools.sat.python import cp_model

from autoshard.solver.flat import FORBIDDEN, FlatProblem

COEF_BUDGET = 2**50
EXACT_PAIR_LIMIT = 400_000
# Memory rows over long live sets are quadratic in the depth of a graph: a 96-layer training
# step on 8 devices has 113M row terms, minutes of model building and presolve.
EXACT_TERM_LIMIT = 2_000_000
# A model that need not prove anything, only improve on its hint, may be larger: 26M terms over
# 24k free nodes build in 13 s and improve a 65k-node contest answer by 1.6% within 25 s.
HINTED_TERM_LIMIT = 40_000_000


@dataclass(frozen=True)
class ExactResult:
    x: np.ndarray | None      # kept-strategy indices, None when no solution was found
    bound: float              # lower bound on the optimum (flat costs)
    optimal: bool
    infeasible: bool
    wall_s: float
    status: str


@dataclass
class _Model:
    model: cp_model.CpModel
    xs: list[list[cp_model.IntVar] | None]   # None for nodes with one strategy
    ys: list[tuple[int, dict[tuple[int, int], cp_model.IntVar]]]
    scale: int


def pair_count(fp: FlatProblem) -> int:
    """Edge variables of the model: one per strategy pair of an edge between two nodes with a choice."""
    sizes = fp.sizes()
    both = (sizes[fp.eu] > 1) & (sizes[fp.ev] > 1)
    return int((sizes[fp.eu] * sizes[fp.ev])[both].sum())


def row_terms(fp: FlatProblem) -> int:
    """Terms of the model's memory rows: a strategy with a usage, of a node with a choice,
    appears in every row the node is live on."""
    sizes = fp.sizes()
    node_of = np.repeat(np.arange(fp.n), sizes)
    counted = (fp.use > 0) & (sizes[node_of] > 1)
    return int((fp.r1 - fp.r0)[node_of][counted].sum())


def model_fits(fp: FlatProblem, term_limit: int | None = None) -> bool:
    """Whether the CP-SAT model of fp is small enough to build and search in seconds (its
    memory rows at most `term_limit` terms, by default `EXACT_TERM_LIMIT`)."""
    limit = EXACT_TERM_LIMIT if term_limit is None else term_limit
    return pair_count(fp) <= EXACT_PAIR_LIMIT and row_terms(fp) <= limit


def _build(fp: FlatProblem) -> _Model:
    model = cp_model.CpModel()
    sizes = fp.sizes()
    unary = [fp.cost[fp.soff[v]:fp.soff[v + 1]].copy() for v in range(fp.n)]
    offset = 0.0
    pair_terms: list[tuple[int, np.ndarray]] = []
    for e in range(fp.m):
        u, v = int(fp.eu[e]), int(fp.ev[e])
        matrix = fp.mat[fp.moff[e]:fp.moff[e + 1]].reshape(sizes[u], sizes[v])
        if sizes[u] == 1 or sizes[v] == 1:
            # The fixed side's choice is known: the edge is a cost on the other node.
            if sizes[u] == 1:
                unary[v] = np.minimum(unary[v] + matrix[0, :], FORBIDDEN)
            else:
                unary[u] = np.minimum(unary[u] + matrix[:, 0], FORBIDDEN)
            continue
        allowed = matrix < FORBIDDEN
        low = float(matrix[allowed].min()) if allowed.any() else 0.0
        offset += low
        pair_terms.append((e, np.where(allowed, matrix - low, np.inf)))
    node_terms = []
    for v in range(fp.n):
        costs = unary[v]
        allowed = costs < FORBIDDEN
        if not allowed.any():
            allowed = np.ones_like(allowed)
        low = float(costs[allowed].min())
        offset += low
        node_terms.append(np.where(allowed, costs - low, np.inf))
    total = sum(float(t[np.isfinite(t)].max(initial=0.0)) for t in node_terms)
    total += sum(float(t[np.isfinite(t)].max(initial=0.0)) for _, t in pair_terms)
    scale = max(1, math.ceil(total / COEF_BUDGET))

    def coef(value: float) -> int:
        return int(value // scale)

    objective = []
    xs: list[list[cp_model.IntVar] | None] = []
    for v in range(fp.n):
        terms = node_terms[v]
        if sizes[v] == 1:
            xs.append(None)
            continue
        row = [model.new_bool_var(f"x[{v},{s}]") for s in range(sizes[v])]
        model.add_exactly_one(row)
        for s, var in enumerate(row):
            if not np.isfinite(terms[s]):
                model.add(var == 0)
            elif coef(terms[s]):
                objective.append(coef(terms[s]) * var)
        xs.append(row)
    ys = []
    for e, terms in pair_terms:
        u, v = int(fp.eu[e]), int(fp.ev[e])
        pairs: dict[tuple[int, int], cp_model.IntVar] = {}
        for s in range(sizes[u]):
            for t in range(sizes[v]):
                if np.isfinite(terms[s, t]):
                    var = model.new_bool_var(f"y[{u},{v},{s},{t}]")
                    pairs[(s, t)] = var
                    if coef(terms[s, t]):
                        objective.append(coef(terms[s, t]) * var)
        for s in range(sizes[u]):
            model.add(sum(pairs[(s, t)] for t in range(sizes[v]) if (s, t) in pairs) == xs[u][s])
        for t in range(sizes[v]):
            model.add(sum(pairs[(s, t)] for s in range(sizes[u]) if (s, t) in pairs) == xs[v][t])
        ys.append((e, pairs))
    if fp.num_rows:
        _add_memory_rows(model, fp, xs)
    model.minimize(sum(objective))
    model.proto.objective.offset = offset / scale
    return _Model(model, xs, ys, scale)


def _add_memory_rows(model: cp_model.CpModel, fp: FlatProblem, xs: list) -> None:
    """Per row, `sum use * x <= cap` over the live (node, strategy) pairs with a usage, written into
    the model's proto from index arrays: one Python step per row, not one per term."""
    var_of = np.full(len(fp.cost), -1, dtype=np.int64)
    for v, row in enumerate(xs):
        if row is not None:
            var_of[fp.soff[v]:fp.soff[v + 1]] = [var.index for var in row]
    node_of = np.repeat(np.arange(fp.n), fp.sizes())
    entries = np.flatnonzero((var_of >= 0) & (fp.use > 0))
    entries = entries[np.argsort(fp.r0[node_of[entries]], kind="stable")]
    first, last = fp.r0[node_of[entries]], fp.r1[node_of[entries]]
    for r in range(fp.num_rows):
        started = np.searchsorted(first, r, side="right")
        live = np.sort(entries[:started][last[:started] > r])
        if len(live):
            linear = model.proto.constraints.add().linear
            linear.vars.extend(var_of[live].tolist())
            linear.coeffs.extend(fp.use[live].tolist())
            linear.domain.extend([cp_model.INT_MIN, int(fp.cap[r])])
        elif fp.cap[r] < 0:
            model.add_bool_or([])  # base load alone exceeds the limit


class _Progress(cp_model.CpSolverSolutionCallback):
    def __init__(self, scale: int, callback: Callable[[float, float, float], None] | None):
        super().__init__()
        self._scale, self._callback = scale, callback
        self._start = time.monotonic()

    def on_solution_callback(self) -> None:
        if self._callback is not None:
            self._callback(self.objective_value * self._scale, self.best_objective_bound * self._scale,
                           time.monotonic() - self._start)


def solve_exact(fp: FlatProblem, *, time_limit_s: float, workers: int = 1, seed: int = 0,
                hint: np.ndarray | None = None, deterministic_time: float | None = None,
                progress: Callable[[float, float, float], None] | None = None, gap_limit: float = 0.0
                ) -> ExactResult:
    """Solve `fp` with CP-SAT; `deterministic_time` (CP-SAT's own units) replaces the wall limit
    for reproducible runs. `progress(cost, bound, elapsed_s)` is called on each new solution.
    The search stops once (cost - bound) / cost <= `gap_limit`; `optimal` only on a proof."""
    start = time.monotonic()
    built = _build(fp)
    if hint is not None:
        for v, row in enumerate(built.xs):
            if row is not None:
                for s, var in enumerate(row):
                    built.model.add_hint(var, int(hint[v] == s))
        for e, pairs in built.ys:
            su, sv = hint[fp.eu[e]], hint[fp.ev[e]]
            for (s, t), var in pairs.items():
                built.model.add_hint(var, int(s == su and t == sv))
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.num_workers = max(1, workers)
    params.random_seed = seed
    # CP-SAT's relative gap is |O - B| / max(1, |O|) on its objective including the offset, here
    # O = cost / scale and B = bound / scale: with scale 1 exactly (cost - bound) / cost of the
    # flat costs. With scale > 1 the rounded-down coefficients can put the true cost a little
    # above scale * O, so the gap of the answer (recomputed exactly) may exceed the limit by that.
    params.relative_gap_limit = gap_limit
    remaining = max(0.01, time_limit_s - (time.monotonic() - start))
    if deterministic_time is not None:
        params.max_deterministic_time = deterministic_time
        params.interleave_search = workers > 1
    else:
        params.max_time_in_seconds = remaining
    status = solver.solve(built.model, _Progress(built.scale, progress))
    wall = time.monotonic() - start
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        x = np.zeros(fp.n, dtype=np.int64)
        for v, row in enumerate(built.xs):
            if row is not None:
                x[v] = next(s for s, var in enumerate(row) if solver.boolean_value(var))
        bound = solver.best_objective_bound * built.scale
        # Stopping on the gap limit also reports OPTIMAL: only a bound that meets the cost proves it.
        proved = solver.best_objective_bound >= solver.objective_value
        optimal = status == cp_model.OPTIMAL and proved and built.scale == 1
        return ExactResult(x, bound, optimal, False, wall, solver.status_name(status))
    if status == cp_model.INFEASIBLE:
        return ExactResult(None, math.inf, False, True, wall, "INFEASIBLE")
    if status == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT rejected the model: {built.model.validate()}")
    return ExactResult(None, -math.inf, False, False, wall, solver.status_name(status))

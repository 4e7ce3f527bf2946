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

import contextlib
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
from ortools.sat.python import cp_model

from autoshard.solver.flat import FORBIDDEN, FlatProblem
from autoshard.solver.schedule import gained
from autoshard.solver.stopping import cp_solver, stoppable

COEF_BUDGET = 2**50
EXACT_PAIR_LIMIT = 400_000
# Memory rows over long live sets are quadratic in the depth of a graph: a deep training step's
# rows take minutes of model building and presolve (benchmarks/RESULTS.md, "Where the solver's
# limits come from").
EXACT_TERM_LIMIT = 2_000_000
# A model that need not prove anything, only improve on its hint, may be larger: a relink of this
# size builds and improves a contest answer well within a solve's time (ibid.).
HINTED_TERM_LIMIT = 40_000_000


@dataclass(frozen=True)
class ExactResult:
    x: np.ndarray | None      # kept-strategy indices, None when no solution was found
    bound: float              # lower bound on the optimum (flat costs)
    optimal: bool
    infeasible: bool
    wall_s: float
    status: str
    stalled: bool = False     # stopped by `patience_s` without a gain, not by the time limit


@dataclass
class _Model:
    model: cp_model.CpModel
    x_var: np.ndarray       # int64[S]: the boolean of each strategy, -1 at nodes with one strategy
    pair_var: np.ndarray    # int64[P]: the boolean of each allowed strategy pair of an edge
    pair_first: np.ndarray  # int64[P]: its strategy (an index into fp.cost) at the edge's first node
    pair_second: np.ndarray  # int64[P]: and at the second
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


def _segment_min(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Minimum of each non-empty segment values[offsets[k]:offsets[k + 1]]."""
    return np.minimum.reduceat(values, offsets[:-1]) if len(offsets) > 1 else np.zeros(0)


def _ranges(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., counts[0] - 1, 0, 1, ..., counts[1] - 1, ..."""
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(int(counts.sum())) - starts


class _Entries(NamedTuple):
    """Every entry of every edge matrix: its edge and the strategies (indices into fp.cost) it pairs."""
    edge: np.ndarray
    first: np.ndarray
    second: np.ndarray


class _Terms(NamedTuple):
    """The objective's terms above each node's and edge's least allowed cost."""
    allowed: np.ndarray     # bool[S]: the strategy is allowed (its node's all are when none is)
    node_term: np.ndarray   # float64[S]
    entry_term: np.ndarray  # float64[M]
    is_pair: np.ndarray     # bool[M]: the entry gets a pair variable
    offset: float           # the least costs, summed
    scale: int


def _entries(fp: FlatProblem) -> _Entries:
    sizes = fp.sizes()
    edge = np.repeat(np.arange(fp.m), np.diff(fp.moff))
    row, col = np.divmod(np.arange(len(fp.mat)) - fp.moff[edge], sizes[fp.ev][edge])
    return _Entries(edge, fp.soff[fp.eu][edge] + row, fp.soff[fp.ev][edge] + col)


def _terms(fp: FlatProblem, entries: _Entries, pair_edge: np.ndarray) -> _Terms:
    """Costs as the model's terms: an edge to a node with one strategy (not `pair_edge`) is a cost
    on its other node; each node's and pair edge's least allowed cost moves into the offset."""
    sizes = fp.sizes()
    node_of = np.repeat(np.arange(fp.n), sizes)
    folded = ~pair_edge[entries.edge]
    unary = fp.cost.copy()
    onto = np.where((sizes[fp.eu] == 1)[entries.edge], entries.second, entries.first)
    np.add.at(unary, onto[folded], fp.mat[folded])
    unary = np.minimum(unary, FORBIDDEN)
    allowed_entry = fp.mat < FORBIDDEN
    edge_low = _segment_min(np.where(allowed_entry, fp.mat, np.inf), fp.moff)
    edge_low = np.where(np.isfinite(edge_low) & pair_edge, edge_low, 0.0)
    allowed = unary < FORBIDDEN
    allowed |= ~np.logical_or.reduceat(allowed, fp.soff[:-1])[node_of]  # nothing allowed: all are
    node_low = _segment_min(np.where(allowed, unary, np.inf), fp.soff)
    offset = float(node_low.sum() + edge_low.sum())
    node_term = unary - node_low[node_of]
    entry_term = fp.mat - edge_low[entries.edge]
    is_pair = pair_edge[entries.edge] & allowed_entry
    most = np.maximum.reduceat(np.where(allowed, node_term, 0.0), fp.soff[:-1]).sum() if fp.n else 0.0
    most += np.maximum.reduceat(np.where(is_pair, entry_term, 0.0), fp.moff[:-1]).sum() if fp.m else 0.0
    return _Terms(allowed, node_term, entry_term, is_pair, offset, max(1, math.ceil(float(most) / COEF_BUDGET)))


def _build(fp: FlatProblem) -> _Model:
    """The model, written into CP-SAT's proto from index arrays: one Python step per constraint,
    none per variable or objective term, so that the largest models the heuristic builds take seconds."""
    model = cp_model.CpModel()
    proto = model.proto
    sizes = fp.sizes()
    movable = sizes > 1
    node_of = np.repeat(np.arange(fp.n), sizes)
    entries = _entries(fp)
    pair_edge = movable[fp.eu] & movable[fp.ev]
    terms = _terms(fp, entries, pair_edge)
    # Variables: the strategies of nodes with a choice (a forbidden one fixed at 0), then the pairs.
    x_var = np.full(len(fp.cost), -1, dtype=np.int64)
    x_var[movable[node_of]] = np.arange(int(movable[node_of].sum()))
    for fixed in (~terms.allowed[x_var >= 0]).tolist():
        proto.variables.add().domain.extend((0, 0) if fixed else (0, 1))
    pairs = np.flatnonzero(terms.is_pair)
    pair_var = len(np.flatnonzero(x_var >= 0)) + np.arange(len(pairs))
    for _ in range(len(pairs)):
        proto.variables.add().domain.extend((0, 1))
    for v in np.flatnonzero(movable).tolist():
        proto.constraints.add().exactly_one.literals.extend(x_var[fp.soff[v]:fp.soff[v + 1]].tolist())
    _add_marginals(model, fp, entries, pair_edge, pairs, pair_var, x_var)
    if fp.num_rows:
        _add_memory_rows(model, fp, x_var)
    coefs = np.concatenate([np.where(terms.allowed, terms.node_term, 0.0)[x_var >= 0],
                            terms.entry_term[pairs]]) // terms.scale
    variables = np.concatenate([x_var[x_var >= 0], pair_var])
    nonzero = coefs > 0
    proto.objective.vars.extend(variables[nonzero].tolist())
    proto.objective.coeffs.extend(coefs[nonzero].astype(np.int64).tolist())
    proto.objective.offset = terms.offset / terms.scale
    return _Model(model, x_var, pair_var, entries.first[pairs], entries.second[pairs], terms.scale)


def _add_marginals(model: cp_model.CpModel, fp: FlatProblem, entries: _Entries, pair_edge: np.ndarray,
                   pairs: np.ndarray, pair_var: np.ndarray, x_var: np.ndarray) -> None:
    """The pairs of an edge with strategy s at one end sum to that end's x[s] (no allowed pair
    with s: x[s] = 0)."""
    proto = model.proto
    sizes = fp.sizes()
    edges = np.flatnonzero(pair_edge)
    for side, end_node in ((entries.first, fp.eu), (entries.second, fp.ev)):
        code = entries.edge[pairs] * len(fp.cost) + side[pairs]
        order = np.argsort(code, kind="stable")
        node = end_node[edges]
        strategy = np.repeat(fp.soff[node], sizes[node]) + _ranges(sizes[node])
        wanted = np.repeat(edges, sizes[node]) * len(fp.cost) + strategy
        lo = np.searchsorted(code[order], wanted, side="left").tolist()
        hi = np.searchsorted(code[order], wanted, side="right").tolist()
        summed = pair_var[order].tolist()
        for s, a, b in zip(x_var[strategy].tolist(), lo, hi):
            linear = proto.constraints.add().linear
            linear.vars.extend(summed[a:b] + [s])
            linear.coeffs.extend([1] * (b - a) + [-1])
            linear.domain.extend((0, 0))


def _add_memory_rows(model: cp_model.CpModel, fp: FlatProblem, var_of: np.ndarray) -> None:
    """Per row, `sum use * x <= cap` over the live (node, strategy) pairs with a usage, written into
    the model's proto from index arrays: one Python step per row, not one per term."""
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


class Stall:
    """Stops a CP-SAT search (`stop`) once it has gone `patience_s` seconds without a gain: a
    better solution, or, when `bounds` count, a bound that closes `bound_gain` of the gap
    (`schedule.gained`). A neighbourhood's bound is its own, not the instance's: there only
    solutions count. The watch runs in a thread of its own while the search runs (`watch`)."""

    def __init__(self, patience_s: float, stop: Callable[[], None], bounds: bool, bound_gain: float = 1e-3):
        self.patience_s, self.stop, self.bounds, self.bound_gain = patience_s, stop, bounds, bound_gain
        self.best, self.bound = math.inf, -math.inf
        self.last = time.monotonic()
        self.stalled = False
        self._done = threading.Event()

    def note(self, best: float, bound: float) -> None:
        """A solution of cost `best`, or a bound `bound`, from the search's callbacks."""
        if gained(best, bound if self.bounds else -math.inf, self.best, self.bound, self.bound_gain):
            self.best, self.bound = min(best, self.best), max(bound if self.bounds else -math.inf, self.bound)
            self.last = time.monotonic()

    def _watch(self) -> None:
        while not self._done.wait(min(0.05, self.patience_s)):
            if time.monotonic() - self.last >= self.patience_s:
                self.stalled = True
                self.stop()
                return

    def watch(self) -> "Stall":
        self.last = time.monotonic()
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def __enter__(self) -> "Stall":
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()


class _Progress(cp_model.CpSolverSolutionCallback):
    """Each new solution (and, through `on_bound`, each better bound) goes to `progress(cost,
    bound, elapsed_s)`, the solution to `solution(x)`, and both to the stall watch."""

    def __init__(self, scale: int, callback: Callable[[float, float, float], None] | None,
                 solution: Callable[[np.ndarray], None] | None, decode: Callable[[np.ndarray], np.ndarray],
                 stall: Stall | None):
        super().__init__()
        self._scale, self._callback = scale, callback
        self._solution, self._decode = solution, decode
        self._stall = stall
        self._start = time.monotonic()
        self.found = False
        self.cost, self.bound = math.inf, -math.inf

    def on_solution_callback(self) -> None:
        self.found = True
        self.cost = self.objective_value * self._scale
        self.bound = max(self.bound, self.best_objective_bound * self._scale)
        self._tell()
        if self._solution is not None:
            self._solution(self._decode(np.asarray(self.response_proto.solution, dtype=np.int64)))

    def on_bound(self, bound: float) -> None:
        """CP-SAT's best-bound callback (objective units): bound progress without a solution."""
        if bound * self._scale > self.bound:
            self.bound = bound * self._scale
            self._tell()

    def _tell(self) -> None:
        if self._stall is not None:
            self._stall.note(self.cost, self.bound)
        if self._callback is not None:
            self._callback(self.cost, self.bound, time.monotonic() - self._start)


def solve_exact(fp: FlatProblem, *, time_limit_s: float, workers: int = 1, seed: int = 0,
                hint: np.ndarray | None = None, deterministic_time: float | None = None,
                progress: Callable[[float, float, float], None] | None = None, gap_limit: float = 0.0,
                light_presolve: bool = False, solution: Callable[[np.ndarray], None] | None = None,
                give_up_s: float | None = None, patience_s: float | None = None,
                bounds_count: bool = True) -> ExactResult:
    """Solve `fp` with CP-SAT; `deterministic_time` (CP-SAT's own units) replaces the wall limit
    for reproducible runs. `progress(cost, bound, elapsed_s)` is called on each new solution, and
    `solution(x)` with it (kept-strategy indices), and on each better bound (its cost then the
    last solution's, inf before one).
    The search stops once (cost - bound) / cost <= `gap_limit`; `optimal` only on a proof.
    `light_presolve` (for neighbourhoods that only need to improve on their hint): one presolve
    pass, no probing, no symmetry detection: a large relink otherwise spends most of its time in
    presolve and finds the same answer (benchmarks/RESULTS.md). `give_up_s` (wall-clock runs
    only): stop, status UNKNOWN, when no solution has been found after that many seconds.
    `patience_s` (wall-clock runs only): stop (`stalled` in the result) after that many seconds
    without a better solution or, when `bounds_count`, a better bound (`Stall`)."""
    start = time.monotonic()
    built = _build(fp)
    if hint is not None:
        hint = np.asarray(hint, dtype=np.int64)
        chosen = np.zeros(len(fp.cost), dtype=bool)
        chosen[fp.soff[:-1] + hint] = True
        movable = built.x_var >= 0
        built.model.proto.solution_hint.vars.extend(built.x_var[movable].tolist() + built.pair_var.tolist())
        built.model.proto.solution_hint.values.extend(
            chosen[movable].astype(np.int64).tolist()
            + (chosen[built.pair_first] & chosen[built.pair_second]).astype(np.int64).tolist())
    solver = cp_solver()
    params = solver.parameters
    params.num_workers = max(1, workers)
    params.random_seed = seed
    # CP-SAT's relative gap is |O - B| / max(1, |O|) on its objective including the offset, here
    # O = cost / scale and B = bound / scale: with scale 1 exactly (cost - bound) / cost of the
    # flat costs. With scale > 1 the rounded-down coefficients can put the true cost a little
    # above scale * O, so the gap of the answer (recomputed exactly) may exceed the limit by that.
    params.relative_gap_limit = gap_limit
    if light_presolve:
        params.max_presolve_iterations = 1
        params.cp_model_probing_level = 0
        params.symmetry_level = 0
    remaining = max(0.01, time_limit_s - (time.monotonic() - start))
    if deterministic_time is not None:
        params.max_deterministic_time = deterministic_time
        params.interleave_search = workers > 1
    else:
        params.max_time_in_seconds = remaining

    def decode(values: np.ndarray) -> np.ndarray:
        """The chosen strategy of each node from the values of CP-SAT's variables."""
        movable = built.x_var >= 0
        picked = np.zeros(len(fp.cost), dtype=bool)
        picked[movable] = values[built.x_var[movable]] > 0
        picked[fp.soff[:-1][fp.sizes() == 1]] = True
        return np.flatnonzero(picked) - fp.soff[:-1]

    stall = None
    if patience_s is not None and deterministic_time is None:
        stall = Stall(patience_s, solver.stop_search, bounds_count)
    callback = _Progress(built.scale, progress, solution, decode, stall)
    solver.best_bound_callback = callback.on_bound
    timer = None
    if give_up_s is not None and deterministic_time is None:
        timer = threading.Timer(give_up_s, lambda: None if callback.found else solver.stop_search())
        timer.start()
    try:
        with stoppable(solver), (stall.watch() if stall is not None else contextlib.nullcontext()):
            status = solver.solve(built.model, callback)
    finally:
        if timer is not None:
            timer.cancel()
    wall = time.monotonic() - start
    stalled = stall is not None and stall.stalled
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        x = decode(np.asarray(solver.response_proto.solution, dtype=np.int64))
        bound = solver.best_objective_bound * built.scale
        # Stopping on the gap limit also reports OPTIMAL: only a bound that meets the cost proves it.
        proved = solver.best_objective_bound >= solver.objective_value
        optimal = status == cp_model.OPTIMAL and proved and built.scale == 1
        return ExactResult(x, bound, optimal, False, wall, solver.status_name(status), stalled)
    if status == cp_model.INFEASIBLE:
        return ExactResult(None, math.inf, False, True, wall, "INFEASIBLE")
    if status == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT rejected the model: {built.model.validate()}")
    return ExactResult(None, -math.inf, False, False, wall, solver.status_name(status), stalled)

"""The anytime heuristic for large instances: relax memory, decode, repair, improve.

1. Start from the smallest-usage choice of every node: it fits whenever anything fits.
2. Repeat: TRW-S under the current memory multipliers decodes an assignment; tree moves on
   the penalised costs clean it up; if it fits in memory it seeds the feasible search; if it
   is cheaper than the best solution but does not fit, CP-SAT looks for the best mix of the
   two (`Search.relink`). The multipliers then move (see `lagrange.py`). Every round also
   tightens the certified lower bound.
3. Every improving relink is followed by a descent within the best solution's usages
   (`descent.py`: the memory-free problem over the strategies that use no more memory).
4. If the best solution is still more than 1% above the bound and the whole instance is too
   large for CP-SAT with all its rows, CP-SAT solves it under the few rows the multipliers mark
   as binding (`Search.on_rows`); its answer is kept, or relinked when it breaks another row.
5. The feasible search alternates tree moves with CP-SAT neighbourhoods: the hubs together,
   a ball around each hub, then around the most expensive edges and random seeds, always from
   the best solution, with a descent after each improvement.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from autoshard.solver import kernels
from autoshard.solver.descent import descend
from autoshard.solver.exact import model_fits
from autoshard.solver.flat import FORBIDDEN, FlatProblem, flatten
from autoshard.solver.lagrange import Relaxation, StepLength
from autoshard.solver.problem import Problem, within_gap
from autoshard.solver.search import BALL_STRATEGIES, Search

Progress = Callable[[str, float, float, float], None]  # (phase, cost, bound, elapsed_s)
BINDING_ROWS = 16  # memory rows kept by the whole-instance CP-SAT model (`solve_on_binding_rows`)
BINDING_ROWS_GAP = 0.01  # ... which runs when the certified gap is larger (and the full model too large)


@dataclass(frozen=True)
class HeuristicResult:
    x: np.ndarray
    objective: float
    bound: float
    stats: dict


def smallest_usage(fp: FlatProblem) -> np.ndarray:
    """Each node's smallest-usage strategy, the cheapest among ties."""
    x = np.zeros(fp.n, dtype=np.int64)
    for v in range(fp.n):
        use = fp.use[fp.soff[v]:fp.soff[v + 1]]
        cost = fp.cost[fp.soff[v]:fp.soff[v + 1]]
        x[v] = int(np.lexsort((cost, use))[0])
    return x


def _penalised_cleanup(fp: FlatProblem, x: np.ndarray, pen: np.ndarray, moves: int, seed: int) -> None:
    """Tree moves on cost + pen * use, memory ignored (x updated in place)."""
    node_of = np.repeat(np.arange(fp.n), fp.sizes())
    cost = fp.cost + pen[node_of] * fp.use
    best = x.copy()
    kernels.block_moves(fp.arrays._replace(cost=cost), kernels.ignore_memory(fp.n), x, best, math.inf,
                        num_moves=moves, kmax=8, temperature=0.0, movable=fp.sizes() > 1, seed=seed)
    x[:] = best


_compiled = False


def compile_kernels() -> None:
    """Compile every kernel the heuristic calls (or load it from numba's cache on disk) by solving
    a tiny instance once per process, so that no time limit pays for compilation: that takes
    seconds the first time after an install or an upgrade, enough to leave a 10 s solve no time."""
    global _compiled
    if _compiled:
        return
    three_in_a_row = Problem(
        node_costs=tuple(np.array([0, 3]) for _ in range(3)), node_usages=tuple(np.array([2, 1]) for _ in range(3)),
        intervals=np.array([[0, 2], [0, 2], [1, 3]]), edges=np.array([[0, 1], [1, 2]]),
        edge_costs=(np.array([[0, 5], [5, 0]]), np.array([[0, 5], [5, 0]])), usage_limit=5)
    run_heuristic(flatten(three_in_a_row), time_limit_s=1.0, deterministic=True)
    _compiled = True


def run_heuristic(fp: FlatProblem, *, time_limit_s: float, seed: int = 0, hint: np.ndarray | None = None,
                  progress: Progress | None = None, deterministic: bool = False,
                  gap_limit: float = 0.0, workers: int = 1) -> HeuristicResult:
    start = time.monotonic()
    deadline = start + time_limit_s
    stats: dict = {"relaxation_rounds": 0, "feasible_decodes": 0, "relinks": 0, "relinks_improving": 0,
                   "descents": 0, "descents_improving": 0, "binding_rows": "not run", "tree_moves": 0, "lns": 0,
                   "lns_improving": 0}
    x0 = smallest_usage(fp)
    if hint is not None and fp.fits(hint) and fp.objective(hint) < fp.objective(x0):
        x0 = np.asarray(hint, dtype=np.int64)
    search = Search(fp, x0, seed)
    relaxation = Relaxation(fp)
    spans = (fp.r1 - fp.r0)[fp.r1 > fp.r0]
    unit = search.pen_unit / max(float(spans.mean()) if len(spans) else 1.0, 1.0) * 0.01
    bound = -math.inf
    rounds = 12 if deterministic else None
    moves = max(2000, 2 * fp.n)

    def report(phase: str) -> None:
        if progress is not None:
            progress(phase, search.best_obj, bound, time.monotonic() - start)

    def time_left() -> float:
        return deadline - time.monotonic()

    def proved_optimal() -> bool:
        return within_gap(search.best_obj, bound, gap_limit) and fp.fits(search.best_x)

    def slack_of(x: np.ndarray) -> np.ndarray:
        return kernels.row_slack(fp.arrays, x)

    relinked: set[bytes] = set()
    waiting: list[tuple[float, np.ndarray]] = []  # cheap decodes not relinked yet, cheapest first

    descent_s = 0.0

    def descend_from_best() -> None:
        """The descent within the best solution's usages, when there is time for it."""
        nonlocal descent_s
        if fp.num_rows == 0 or (rounds is None and time_left() < 2 * descent_s):
            return
        descent_start = time.monotonic()
        y = descend(fp, search.best_x, seed)
        descent_s = time.monotonic() - descent_start
        stats["descents"] += 1
        if fp.objective(y) < search.best_obj:
            stats["descents_improving"] += 1
            search.reset(y)

    def relink(x: np.ndarray, share: float = 0.3) -> None:
        relinked.add(x.tobytes())
        change = search.relink(x, max(1.0, share * time_left()), workers,
                               deterministic_time=5.0 if deterministic else None)
        stats["relinks"] += int(change is not None)
        stats["relinks_improving"] += int(bool(change))
        if change:
            descend_from_best()

    def solve_on_binding_rows() -> float:
        """CP-SAT over the whole instance with only the rows of the largest multipliers (the ones
        the relaxation found binding), when that model is small enough (the full model, when it
        is, is solved by `solve` after the heuristic); an answer that breaks another row is
        relinked with the best. Returns the model's lower bound. Where memory decides, the
        cheapest plan can differ from what the decodes find in tens of thousands of nodes at
        once: on IOPDDL P one row suffices to reach the optimum from 1.6% above it."""
        top = np.argsort(-relaxation.lam, kind="stable")[:BINDING_ROWS]
        keep = np.zeros(fp.num_rows, dtype=bool)
        keep[top[relaxation.lam[top] > 0]] = True
        if not keep.any():
            return -math.inf
        result = search.on_rows(keep, 0.75 * time_left(), workers,
                                deterministic_time=10.0 if deterministic else None)
        if result is None:
            return -math.inf
        stats["binding_rows"] = f"{int(keep.sum())} rows: {result.status} in {result.wall_s:.1f} s"
        if result.x is None:  # nothing in time (infeasible it cannot be: the best fits every row)
            return -math.inf
        y = result.x
        if fp.objective(y) < search.best_obj:
            if fp.fits(y):
                search.reset(y)
                descend_from_best()
            else:
                relink(y, share=0.6)
        return result.bound

    # Relax-and-decode rounds, about half of the time once memory binds (some multiplier has
    # risen), four fifths until then: while no row binds, every round just carries TRW-S on from
    # warm messages, and its decodes and the tree moves that clean them up are the search (on a
    # 3-D training step of 500k strategies a CP-SAT neighbourhood or a sweep of tree moves takes
    # seconds and rarely finds anything).
    # Doubling the multipliers of overloaded rows finds fitting decodes fast; once it stops finding
    # better ones, Polyak steps take over for good (stepping towards a cost far above the optimum
    # makes them oscillate).
    step = StepLength(relaxation)
    stepping = False
    rounds_without_better = 0
    relink_free_from = start  # relinking takes at most about half of the rounds' time
    round_no = 0
    memory_binds = False
    while ((rounds is None and time_left() > (0.5 if memory_binds else 0.2) * time_limit_s)
           or (rounds is not None and round_no < rounds)) and not proved_optimal():
        round_no += 1
        best_before = search.best_obj
        x = relaxation.run(5 if stepping else 10)
        round_bound = relaxation.bound()
        bound = max(bound, round_bound)
        subgradient = slack_of(x)
        _penalised_cleanup(fp, x, relaxation.penalties(), moves, seed + round_no)
        slack = slack_of(x)
        stats["relaxation_rounds"] += 1
        objective = fp.objective(x)
        if np.all(slack <= 0):
            stats["feasible_decodes"] += 1
            if objective < search.best_obj:
                search.reset(x)
                if memory_binds:  # else the clean-up's moves were these, on the same costs
                    search.tree_moves(moves, 16)
                    stats["tree_moves"] += moves
        elif objective < search.best_obj < FORBIDDEN and x.tobytes() not in relinked:
            if rounds is not None or time.monotonic() >= relink_free_from:
                relink_start = time.monotonic()
                relink(x)
                relink_free_from = 2 * time.monotonic() - relink_start
            elif all(x.tobytes() != y.tobytes() for _, y in waiting):
                waiting = sorted(waiting + [(objective, x)], key=lambda item: item[0])[:4]
        if search.best_obj < best_before:
            rounds_without_better = 0
        stepping = stepping or (search.best_obj < FORBIDDEN and rounds_without_better >= 20)
        if stepping:
            relaxation.step_towards(subgradient, round_bound, search.best_obj, step.after(round_bound, search.best_obj))
        elif np.all(slack <= 0):
            relaxation.relax_loose(slack)
        else:
            relaxation.raise_on(slack, unit)
        rounds_without_better += 1
        memory_binds = memory_binds or bool(relaxation.lam.any())
        report("relax")
    # Improve the best solution: CP-SAT under the binding rows, the cheapest decodes that had to
    # wait, a descent within its usages, then CP-SAT neighbourhoods around the hubs, then tree
    # moves and neighbourhoods around expensive edges and random nodes.
    if fp.fits(search.best_x) and not within_gap(search.best_obj, bound, BINDING_ROWS_GAP) and not model_fits(fp):
        bound = max(bound, solve_on_binding_rows())
    for objective, x in waiting:
        if rounds is None and time_left() < 0.25 * time_limit_s:
            break
        if objective < search.best_obj and x.tobytes() not in relinked:
            relink(x)
    descend_from_best()
    search.reset(search.best_x)
    ball_size = 120

    def neighbourhood(nodes: np.ndarray) -> float:
        """One CP-SAT neighbourhood of the best solution, a descent after an improvement; returns
        the seconds it took."""
        lns_start = time.monotonic()
        budget = min(2.0, max(0.05, time_left() - 0.1)) if rounds is None else 10.0
        change = search.lns(nodes, budget, deterministic_time=1.0 if deterministic else None)
        stats["lns"] += 1
        stats["lns_improving"] += int(change < 0)
        if change < 0:
            descend_from_best()  # leaves the search at the best solution, as the improving LNS did
        report("improve")
        return time.monotonic() - lns_start

    def around_hubs():
        """Tree moves never move a hub: all hubs at once, then a ball around each, those whose
        neighbours all fit in one first (turning a hub with all of them is a move nothing else makes)."""
        hubs = _hubs(fp)
        if len(hubs) > 1:
            yield hubs[np.cumsum(fp.sizes()[hubs]) <= BALL_STRATEGIES]
        degree = np.diff(fp.aoff)
        for hub in sorted(hubs.tolist(), key=lambda hub: bool(degree[hub] >= ball_size)):
            yield search.ball(hub, ball_size)

    lns_s = 0.0
    for nodes in around_hubs():
        if (rounds is None and time_left() < 0.2 + 1.5 * lns_s) or proved_optimal():
            break
        lns_s = neighbourhood(nodes)
    # Then tree moves and balls around the most expensive edges and random nodes, in turns.
    lns_rounds = 0
    round_s = 0.0
    while ((rounds is None and time_left() > 0.2 + 1.5 * round_s) or (rounds is not None and lns_rounds < rounds)) \
            and not proved_optimal():
        lns_rounds += 1
        round_start = time.monotonic()
        search.tree_moves(moves, 16)
        stats["tree_moves"] += moves
        neighbourhood(search.ball(_expensive_node(fp, search.x, search.rng), ball_size))
        round_s = time.monotonic() - round_start
    return HeuristicResult(search.best_x.copy(), search.best_obj, bound, stats)


def _hubs(fp: FlatProblem) -> np.ndarray:
    """The movable nodes with more than `kernels.HUB_DEGREE` neighbours (tree moves never move
    them), most connected first."""
    degree = np.diff(fp.aoff)
    hubs = np.flatnonzero((degree > kernels.HUB_DEGREE) & (fp.sizes() > 1))
    return hubs[np.argsort(-degree[hubs], kind="stable")]


def _expensive_node(fp: FlatProblem, x: np.ndarray, rng: np.random.Generator) -> int:
    """An endpoint of an edge drawn with probability proportional to its current cost (random if none)."""
    movable = np.flatnonzero(fp.sizes() > 1)
    if fp.m == 0 or rng.random() < 0.3:
        return int(rng.choice(movable)) if len(movable) else 0
    sizes = fp.sizes()
    current = fp.mat[fp.moff[:-1] + x[fp.eu] * sizes[fp.ev] + x[fp.ev]]
    weights = np.minimum(current, 1e15)
    total = weights.sum()
    if total <= 0:
        return int(rng.choice(movable))
    e = int(rng.choice(fp.m, p=weights / total))
    u, v = int(fp.eu[e]), int(fp.ev[e])
    return u if sizes[u] > 1 else v

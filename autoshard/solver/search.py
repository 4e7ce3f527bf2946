"""Local search on a FlatProblem that keeps memory feasible: tree-block moves and CP-SAT neighbourhoods.

`Search` holds the current solution, the best one seen and the memory rows' segment tree. Tree
moves (see `kernels.block_moves`) are cheap and exact on induced trees; a CP-SAT neighbourhood
(`lns`) frees a connected set of a few hundred nodes, cycles included, and solves it exactly
under the memory left by the fixed nodes, warm-started from the current choices. `relink` frees
every node where another assignment (a decode of the memory relaxation, typically cheaper but
over the limit somewhere) chooses differently: the best mix of the two that fits.
"""

from __future__ import annotations

import numpy as np

from autoshard.solver import kernels
from autoshard.solver.exact import (EXACT_TERM_LIMIT, HINTED_TERM_LIMIT, ExactResult, model_fits, pair_count, row_terms,
                                    solve_exact)
from autoshard.solver.flat import FORBIDDEN, FlatProblem, only_rows
from autoshard.solver.subproblem import restrict

BALL_STRATEGIES = 1500  # a CP-SAT neighbourhood of this many strategies solves in about a second
# A model of the whole instance with this many edge variables builds and presolves lightly in
# seconds; larger ones would take most of a solve's time (benchmarks/RESULTS.md).
WHOLE_PAIR_LIMIT = 1_000_000


def exchange_rate(fp: FlatProblem) -> float:
    """A rough cost per unit of usage: summed cost spreads over summed usage spreads of the nodes."""
    sizes = fp.sizes()
    starts = fp.soff[:-1][sizes > 0]
    capped = np.minimum(fp.cost, 1e15)
    spread_cost = np.maximum.reduceat(capped, starts) - np.minimum.reduceat(capped, starts)
    spread_use = np.maximum.reduceat(fp.use, starts) - np.minimum.reduceat(fp.use, starts)
    return float(spread_cost.sum()) / max(float(spread_use.sum()), 1.0)


def forbidden_nodes(fp: FlatProblem, x: np.ndarray) -> np.ndarray:
    """The nodes of x with a forbidden cost or on a forbidden pair, sorted."""
    bad = fp.cost[fp.soff[:-1] + x] >= FORBIDDEN
    if fp.m:
        pairs = fp.mat[fp.moff[:-1] + x[fp.eu] * fp.sizes()[fp.ev] + x[fp.ev]] >= FORBIDDEN
        bad[fp.eu[pairs]] = True
        bad[fp.ev[pairs]] = True
    return np.flatnonzero(bad)


class Search:
    def __init__(self, fp: FlatProblem, x: np.ndarray, seed: int):
        self.fp = fp
        self.rng = np.random.default_rng(seed)
        self.movable = fp.sizes() > 1
        self.pen = np.zeros(fp.n, dtype=np.float64)
        self.pen_unit = exchange_rate(fp)
        self.x = np.asarray(x, dtype=np.int64).copy()
        self.best_x = self.x.copy()
        self.best_obj = fp.objective(self.x)
        self.reset(self.x)

    def reset(self, x: np.ndarray) -> None:
        """Continue from x (which must fit in memory)."""
        fp = self.fp
        self.x = np.asarray(x, dtype=np.int64).copy()
        slack = kernels.row_slack(fp.arrays, self.x)
        self.mx, self.lz = kernels.seg_tree(slack)
        obj = fp.objective(self.x)
        if obj < self.best_obj:
            self.best_obj, self.best_x = obj, self.x.copy()

    def tree_moves(self, num_moves: int, kmax: int, temperature: float = 0.0,
                   centres: np.ndarray | None = None) -> tuple[int, int]:
        """Tree-block moves (blocks grown from `centres`, by default from any movable node);
        returns (accepted, improving)."""
        memory = kernels.MemoryState(self.mx, self.lz, self.pen, self.pen_unit, checked=self.fp.num_rows > 0)
        _, best, accepted, improved, _ = kernels.block_moves(
            self.fp.arrays, memory, self.x, self.best_x, self.best_obj, num_moves=num_moves, kmax=kmax,
            temperature=temperature, movable=self.movable, seed=int(self.rng.integers(1 << 31)), centres=centres)
        self.best_obj = best
        self.pen *= 0.5
        return accepted, improved

    def ball(self, seed_node: int, size: int, max_strategies: int = BALL_STRATEGIES) -> np.ndarray:
        """Up to `size` movable nodes around seed_node, breadth first, neighbours in random order,
        with at most `max_strategies` strategies in all (keeps the CP-SAT model small)."""
        fp = self.fp
        sizes = fp.sizes()
        seen = {seed_node}
        frontier = [seed_node]
        budget = max_strategies - int(sizes[seed_node])
        head = 0
        while head < len(frontier) and len(frontier) < size:
            v = frontier[head]
            head += 1
            nbrs = fp.anbr[fp.aoff[v]:fp.aoff[v + 1]]
            for w in self.rng.permutation(nbrs).tolist():
                if w not in seen and self.movable[w] and sizes[w] <= budget:
                    seen.add(w)
                    budget -= int(sizes[w])
                    frontier.append(w)
                    if len(frontier) >= size:
                        break
        return np.array(sorted(frontier), dtype=np.int64)

    def repair(self, x: np.ndarray, ball_size: int, time_limit_s: float, deterministic_time: float | None = None,
               memory: bool = True) -> np.ndarray:
        """x with the nodes around its forbidden choices re-solved by CP-SAT, where forbidden pairs
        are hard constraints, every other node fixed (and memory ignored unless `memory`); x itself
        when that finds nothing. A relaxation's decode often breaks a few forbidden pairs in chains
        of nodes that must agree, which tree moves cannot turn as one."""
        bad = forbidden_nodes(self.fp, x)
        if len(bad) == 0:
            return x
        budget = BALL_STRATEGIES // len(bad)
        nodes = np.unique(np.concatenate([self.ball(int(v), ball_size, max(budget, 1)) for v in bad] + [bad]))
        whole = self.fp if memory else only_rows(self.fp, np.zeros(self.fp.num_rows, dtype=bool))
        result = solve_exact(restrict(whole, nodes, x), time_limit_s=time_limit_s, workers=1,
                             seed=int(self.rng.integers(1 << 31)), hint=x[nodes], deterministic_time=deterministic_time,
                             light_presolve=True)
        if result.x is None:
            return x
        repaired = x.copy()
        repaired[nodes] = result.x
        return repaired

    def relink(self, other: np.ndarray, time_limit_s: float, workers: int,
               deterministic_time: float | None = None, patience_s: float | None = None) -> float | None:
        """Re-solve, from the best solution, the nodes where `other` differs from it; returns the
        cost change (<= 0), or None when that subproblem is too large for CP-SAT. CP-SAT stops
        after `patience_s` without a better mix."""
        nodes = np.flatnonzero((self.best_x != other) & self.movable)
        if len(nodes) == 0:
            return 0.0
        self.reset(self.best_x)
        sub = restrict(self.fp, nodes, self.x)
        if not model_fits(sub, HINTED_TERM_LIMIT):
            return None
        return self._solve_part(nodes, sub, time_limit_s, workers, deterministic_time, patience_s)

    def on_rows(self, keep: np.ndarray, time_limit_s: float, workers: int,
                deterministic_time: float | None = None, patience_s: float | None = None) -> ExactResult | None:
        """CP-SAT over every node under the memory rows `keep` only, from the best solution (None
        when that model is too large). Its answer fits those rows but perhaps not the others; its
        bound holds for the whole problem (fewer rows only allow more), so both count against
        `patience_s`."""
        part = only_rows(self.fp, keep)
        if pair_count(part) > WHOLE_PAIR_LIMIT or row_terms(part) > EXACT_TERM_LIMIT:
            return None
        return solve_exact(part, time_limit_s=time_limit_s, workers=workers, seed=int(self.rng.integers(1 << 31)),
                           hint=self.best_x, deterministic_time=deterministic_time, light_presolve=True,
                           patience_s=patience_s)

    def lns(self, nodes: np.ndarray, time_limit_s: float, deterministic_time: float | None = None,
            patience_s: float | None = None) -> float:
        """Re-solve `nodes` exactly with CP-SAT, others fixed; returns the cost change (<= 0)."""
        return self._solve_part(nodes, restrict(self.fp, nodes, self.x), time_limit_s, 1, deterministic_time,
                                patience_s)

    def _solve_part(self, nodes: np.ndarray, sub: FlatProblem, time_limit_s: float, workers: int,
                    deterministic_time: float | None, patience_s: float | None = None) -> float:
        """Solve the subproblem of `nodes` from the current choices; keep its answer if cheaper."""
        before = sub.objective(self.x[nodes])
        result = solve_exact(sub, time_limit_s=time_limit_s, workers=workers, seed=int(self.rng.integers(1 << 31)),
                             hint=self.x[nodes], deterministic_time=deterministic_time,
                             light_presolve=True, patience_s=patience_s, bounds_count=False)
        if result.x is None:
            return 0.0
        change = sub.objective(result.x) - before
        if change < 0 and sub.fits(result.x):
            x = self.x.copy()
            x[nodes] = result.x
            self.reset(x)
            return change
        return 0.0

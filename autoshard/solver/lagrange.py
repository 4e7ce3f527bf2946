"""Memory relaxation: multipliers on memory rows, TRW-S on what is left, a certified bound.

For multipliers `lam[r] >= 0` the memory rows move into the objective:

    min cost(x) + sum_r lam[r] * (load_r(x) - cap[r])

whose node costs become `cost(v, s) + pen[v] * use(v, s)` with `pen[v]` the sum of `lam` over
v's rows. Any lower bound of that unconstrained problem minus `sum_r lam[r] * cap[r]` bounds
the constrained optimum from below. TRW-S gives both the bound and a decoded assignment.

Until a solution of real cost is known the multipliers of overloaded rows are doubled until the
decoded assignments fit. From then on they take subgradient steps of Polyak's length towards
that cost (`step_towards`): the load minus the capacity of each row is the bound's subgradient,
and the step is sized so a linear bound would reach the known cost. This lifts the bound much
further than doubling, and its decodes come close to fitting at costs well under the known one.
"""

from __future__ import annotations

import numpy as np

from autoshard.solver import messages
from autoshard.solver.contraction import Contraction, contract
from autoshard.solver.flat import FlatProblem


class Relaxation:
    """TRW-S messages and row multipliers of one FlatProblem, warm across updates. With `merge`,
    the messages run on the problem with its one-to-one groups merged (`contraction.py`), when
    it has any: answers and bounds are the original problem's all the same."""

    def __init__(self, fp: FlatProblem, merge: bool = False):
        self.fp = fp
        self.contraction: Contraction | None = contract(fp) if merge else None
        work = self.work = fp if self.contraction is None else self.contraction.fp  # what the messages run on
        self.part = messages.partners(work.aoff, work.anbr, work.aedge)
        self.msg_off = messages.message_offsets(work.soff, work.aoff, work.anbr)
        self.msg = np.zeros(self.msg_off[-1], dtype=np.float64)
        self.lam = np.zeros(fp.num_rows, dtype=np.float64)
        self.order = np.arange(work.n, dtype=np.int64)
        self.x = np.zeros(work.n, dtype=np.int64)

    def penalties(self) -> np.ndarray:
        fp = self.fp
        prefix = np.concatenate([[0.0], np.cumsum(self.lam)])
        return prefix[fp.r1] - prefix[fp.r0]

    def _unary(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cost, use, pen) of the problem the messages run on: a node's strategy costs
        cost + pen[node] * use."""
        if self.contraction is None:
            return self.fp.cost, self.fp.use, self.penalties()
        work = self.work
        return self.contraction.penalised_costs(self.penalties()), work.use, np.zeros(work.n)

    def run(self, passes: int) -> np.ndarray:
        """TRW-S passes under the current multipliers; returns the cheapest of their decodes under
        the penalised costs. In degenerate problems (an optimizer's states have many equal
        shardings) decodes swing between near-optimal and far off from pass to pass."""
        work = self.work
        cost, use, pen = self._unary()
        best, best_cost = self.x.copy(), np.inf
        start, entries = work.shared_matrices
        for _ in range(passes):
            messages.trws_passes(1, self.order, work.soff, cost, use, pen, work.eu, work.ev, start, entries,
                                 work.aoff, work.anbr, work.aedge, work.arow, self.part, self.msg_off, self.msg, self.x)
            penalised = work.objective(self.x, cost) + float(pen @ use[work.soff[:-1] + self.x])
            if penalised < best_cost:
                best, best_cost = self.x.copy(), penalised
        return best if self.contraction is None else self.contraction.expand(best)

    def bound(self) -> float:
        """Certified lower bound on the constrained optimum (flat costs)."""
        work = self.work
        cost, use, pen = self._unary()
        start, entries = work.shared_matrices
        relaxed = messages.bound(work.soff, cost, use, pen, work.eu, work.ev, start, entries,
                                 work.aoff, work.anbr, work.aedge, work.arow, self.part, self.msg_off, self.msg)
        return relaxed - float(self.lam @ self.fp.cap.astype(np.float64))

    def step_towards(self, slack: np.ndarray, bound: float, target: float, theta: float) -> None:
        """A subgradient step from the bound of the current multipliers towards `target`; `slack`
        is load minus capacity of the assignment `run` decoded. Rows with no multiplier and room
        to spare take no part (their multiplier would stay at 0 anyway)."""
        grad = np.where((self.lam > 0) | (slack > 0), slack, 0).astype(np.float64)
        norm = float(grad @ grad)
        if norm > 0 and target > bound:
            self.lam = np.maximum(0.0, self.lam + theta * (target - bound) / norm * grad)

    def raise_on(self, slack: np.ndarray, unit: float, factor: float = 2.0) -> None:
        """Raise the multipliers of overloaded rows (slack > 0)."""
        over = slack > 0
        self.lam[over] = np.maximum(self.lam[over] * factor, unit)

    def relax_loose(self, slack: np.ndarray, factor: float = 0.9) -> None:
        """Lower the multipliers of rows with room to spare."""
        loose = slack < 0
        self.lam[loose] *= factor


class StepLength:
    """The factor of Polyak's steps: halved after `patience` rounds without a better bound. A
    round whose bound falls far below the best (warm messages mislead a step) takes the best
    multipliers back."""

    def __init__(self, relaxation: Relaxation, patience: int = 8):
        self.relaxation = relaxation
        self.patience = patience
        self.theta = 1.0
        self.best = -np.inf
        self.best_lam = relaxation.lam.copy()
        self.stalled = 0

    def after(self, bound: float, target: float) -> float:
        """Record the bound of the current multipliers; returns the factor for the next step (0
        when the best multipliers were just taken back: the round's subgradient is not theirs)."""
        if bound > self.best:
            self.best, self.best_lam, self.stalled = bound, self.relaxation.lam.copy(), 0
            return self.theta
        self.stalled += 1
        if bound < self.best - (target - self.best):
            self.relaxation.lam = self.best_lam.copy()
            self.theta *= 0.5
            self.stalled = 0
            return 0.0
        if self.stalled >= self.patience:
            self.theta *= 0.5
            self.stalled = 0
        return self.theta

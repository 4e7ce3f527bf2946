"""The anytime heuristic for large instances: relax memory, decode, repair, improve.

1. Start from the smallest-usage choice of every node: it fits whenever anything fits. Where it
   chooses forbidden pairs, a first plan clears them before anything else (`first_plan`).
2. Repeat: TRW-S under the current memory multipliers decodes an assignment; tree moves on
   the penalised costs clean it up; if it fits in memory it seeds the feasible search; if it
   is cheaper than the best solution but does not fit, CP-SAT looks for the best mix of the
   two (`Search.relink`). The multipliers then move (see `lagrange.py`). Every round also
   tightens the certified lower bound. Where one-to-one edges tie many nodes into groups
   (`contraction.py`), the messages run on the merged groups, a round raises the multipliers
   until a decode fits, and the mix is chosen group by group (`group_relink.py`).
3. Every improving relink is followed by a descent within the best solution's usages
   (`descent.py`: the memory-free problem over the strategies that use no more memory).
4. If the best solution is still far above the bound (`Schedule.binding_rows_gap`) and the
   whole instance is too large for CP-SAT with all its rows, CP-SAT solves it under the few rows
   the multipliers mark as binding (`Search.on_rows`); its answer is kept, or relinked when it
   breaks another row (where memory decides, the cheapest plan can differ from what the decodes
   find in tens of thousands of nodes at once).
5. The feasible search alternates tree moves with CP-SAT neighbourhoods: the hubs together,
   a ball around each hub, then around the most expensive edges and random seeds, always from
   the best solution, with a descent after each improvement.

`HeuristicRun` has one method per phase; `schedule.py` says how the time is shared among them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from autoshard.solver import kernels
from autoshard.solver.crossover import cross
from autoshard.solver.descent import descend
from autoshard.solver.exact import model_fits
from autoshard.solver.first_plan import low_memory_labelling
from autoshard.solver.flat import FORBIDDEN, FlatProblem, flatten
from autoshard.solver.group_relink import groups_fit, relink_groups
from autoshard.solver.lagrange import Relaxation, StepLength
from autoshard.solver.problem import Problem, within_gap
from autoshard.solver.schedule import SCHEDULE, Patience, Schedule, gained
from autoshard.solver.search import BALL_STRATEGIES, Search, forbidden_nodes

Progress = Callable[[str, float, float, float], None]  # (phase, cost, bound, elapsed_s)
Incumbent = Callable[[np.ndarray], None]  # a better solution that fits, in the caller's strategy indices
# Edge costs above this count as this much when drawing an expensive edge (forbidden pairs would
# take every draw).
EXPENSIVE_EDGE_CAP = 1e15


@dataclass(frozen=True)
class HeuristicResult:
    x: np.ndarray
    objective: float
    bound: float
    stats: dict


def smallest_usage(fp: FlatProblem) -> np.ndarray:
    """Each node's smallest-usage strategy, the cheapest among ties."""
    node_of = np.repeat(np.arange(fp.n), fp.sizes())
    order = np.lexsort((fp.cost, fp.use, node_of))  # by node, then usage, then cost
    return (order[fp.soff[:-1]] - fp.soff[:-1]).astype(np.int64)


def _penalised_cleanup(fp: FlatProblem, x: np.ndarray, pen: np.ndarray, moves: int, seed: int, kmax: int) -> None:
    """Tree moves on cost + pen * use, memory ignored (x updated in place)."""
    node_of = np.repeat(np.arange(fp.n), fp.sizes())
    cost = fp.cost + pen[node_of] * fp.use
    best = x.copy()
    kernels.block_moves(fp.arrays._replace(cost=cost), kernels.ignore_memory(fp.n), x, best, math.inf,
                        num_moves=moves, kmax=kmax, temperature=0.0, movable=fp.sizes() > 1, seed=seed)
    x[:] = best


_compiled = False


def compile_kernels() -> None:
    """Compile every kernel the heuristic calls (or load it from numba's cache on disk) by solving
    a tiny instance once per process, so that no time limit pays for compilation: that takes
    seconds the first time after an install or an upgrade, enough to leave a short solve no time."""
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
                  gap_limit: float = 0.0, workers: int = 1, schedule: Schedule = SCHEDULE,
                  incumbent: Incumbent | None = None) -> HeuristicResult:
    """The best solution the phases find in `time_limit_s` (in the schedule's fixed work when
    `deterministic`), with the certified bound of the relaxation and CP-SAT. `incumbent(x)` gets
    the best fitting solution (kept-strategy indices) whenever a progress report finds a better one."""
    return start_heuristic(fp, time_limit_s=time_limit_s, seed=seed, hint=hint, progress=progress,
                           deterministic=deterministic, gap_limit=gap_limit, workers=workers, schedule=schedule,
                           incumbent=incumbent).result()


def start_heuristic(fp: FlatProblem, *, time_limit_s: float, seed: int = 0, hint: np.ndarray | None = None,
                    progress: Progress | None = None, deterministic: bool = False,
                    gap_limit: float = 0.0, workers: int = 1, schedule: Schedule = SCHEDULE,
                    incumbent: Incumbent | None = None) -> HeuristicRun:
    """`run_heuristic`, with the run kept: `HeuristicRun.resume` gives it more time later (the
    relaxation's multipliers and the search's state carry on)."""
    run = HeuristicRun(fp, time_limit_s=time_limit_s, seed=seed, hint=hint, progress=progress,
                       deterministic=deterministic, gap_limit=gap_limit, workers=workers, schedule=schedule,
                       incumbent=incumbent)
    run.first_plan()
    run.relax()
    run.solve_on_binding_rows()
    run.relink_waiting()
    run.descend_from_best()
    run.search.reset(run.search.best_x)  # the neighbourhoods start from the best solution
    run.hub_neighbourhoods()
    run.take_turns()
    run.finish()
    return run


class HeuristicRun:
    """One run of the heuristic: the feasible search, the relaxation, the certified bound and
    the clock they share, with one method per phase."""

    def __init__(self, fp: FlatProblem, *, time_limit_s: float, seed: int, hint: np.ndarray | None,
                 progress: Progress | None, deterministic: bool, gap_limit: float, workers: int,
                 schedule: Schedule, incumbent: Incumbent | None = None):
        self.fp = fp
        self.schedule = schedule
        self.start = time.monotonic()
        self.time_limit_s = time_limit_s
        self.deadline = self.start + time_limit_s
        self.seed = seed
        self.progress = progress
        self.incumbent = incumbent
        self.offered = math.inf  # objective of the last solution handed to `incumbent`
        self.deterministic = deterministic
        self.gap_limit = gap_limit
        self.workers = workers
        self.stats: dict = {"relaxation_rounds": 0, "feasible_decodes": 0, "relinks": 0, "relinks_improving": 0,
                            "descents": 0, "descents_improving": 0, "binding_rows": "not run", "tree_moves": 0,
                            "lns": 0, "lns_improving": 0, "crossovers_improving": 0}
        x0 = smallest_usage(fp)
        if hint is not None and fp.fits(hint) and fp.objective(hint) < fp.objective(x0):
            x0 = np.asarray(hint, dtype=np.int64)
        self.search = Search(fp, x0, seed)
        self.note_feasible()
        self.relaxation = Relaxation(fp, merge=True)
        # The one-to-one groups, for the labelling and the relinks, even once the relaxation no
        # longer runs on them (`_unmerge`).
        self.contraction = self.relaxation.contraction
        self.bound = -math.inf
        self.moves = max(schedule.tree_moves, schedule.tree_moves_per_node * fp.n)  # per sweep of tree moves
        self.relinked: set[bytes] = set()
        self.rows_tried: set[bytes] = set()  # the sets of rows CP-SAT has solved under
        self.waiting: list[tuple[float, np.ndarray]] = []  # cheap decodes not relinked yet, cheapest first
        self.relink_free_from = self.start  # no relink in the rounds before (see `Schedule.relink_share`)
        self.fruitless_relinks = 0  # relinks in a row that ran and found nothing
        self.descent_s = 0.0  # the last descent's time
        # The last relaxation round's time and its clean-up sweep's: what the first descent (the
        # same passes and a sweep) and the first round of random neighbourhoods (a sweep and a
        # ball) may take; on a 96-layer 3-D training step a round takes 9 s, a sweep 2-4 s.
        self.round_s = 0.0
        self.sweep_s = 0.0
        self.label = "first plan"  # the phase that reports progress, and why the one before it stopped
        self.phases: list[dict] = []  # each phase of the turns: its name, when it ran, why it stopped
        self.stats["phases"] = self.phases
        self.rounds_in_turns = 0  # rounds of the turns (the deterministic budget counts them)
        self.widened = 1  # how many times larger than the improve phase's the `wider` balls are
        self.budget_factor = 1  # the phases' budgets grow after a cycle without a gain
        self.phase_s: float | None = None  # the running phase's seconds without gain (CP-SAT steps stay within)
        self.restarts = 0
        # The longest stretch without a gain (`schedule.gained`), from the start of the run.
        self.gain_best, self.gain_bound, self.gain_at = math.inf, -math.inf, 0.0
        self.longest_idle_s = 0.0

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def report(self, phase: str) -> None:
        """Progress with the best plan that fits in memory and chooses nothing forbidden (inf while
        none does: the search starts from the smallest-memory choices, which may not be one), and
        the time the first such plan was found (`first_feasible_s` in the stats); a better such
        plan goes to `incumbent`."""
        feasible = self.note_feasible()
        self._note_gain(self.search.best_obj if feasible else math.inf)
        if self.incumbent is not None and feasible and self.search.best_obj < self.offered:
            self.offered = self.search.best_obj  # handed over before it is reported: a caller seeing the report has it
            self.incumbent(self.search.best_x.copy())
        if self.progress is not None:
            self.progress(phase, self.search.best_obj if feasible else math.inf, self.bound,
                          time.monotonic() - self.start)

    def _note_gain(self, best: float) -> None:
        """Ends the current stretch without a gain when `best` or the bound gained."""
        elapsed_s = time.monotonic() - self.start
        if gained(best, self.bound, self.gain_best, self.gain_bound, self.schedule.bound_gain):
            self.longest_idle_s = max(self.longest_idle_s, elapsed_s - self.gain_at)
            self.gain_at = elapsed_s
            # Only from a gain on: a bound creeping up by crumbs counts once they add up.
            self.gain_best, self.gain_bound = min(best, self.gain_best), max(self.bound, self.gain_bound)

    def finish(self) -> None:
        """The stats of the whole run: the first plan's time, the longest stretch without a gain."""
        self._note_gain(self.search.best_obj if self.note_feasible() else math.inf)
        elapsed_s = time.monotonic() - self.start
        self.stats["longest_idle_s"] = round(max(self.longest_idle_s, elapsed_s - self.gain_at), 3)

    def result(self) -> HeuristicResult:
        return HeuristicResult(self.search.best_x.copy(), self.search.best_obj, self.bound, self.stats)

    def resume(self, time_limit_s: float, x: np.ndarray | None = None, bound: float = -math.inf,
               idle_s: float = 0.0) -> HeuristicResult:
        """More turns for `time_limit_s` from now, from `x` when it fits and is cheaper than the
        best, with a `bound` found meanwhile (CP-SAT's, whose last `idle_s` gained nothing); shares
        of the time are then of the whole span since the run started."""
        now = time.monotonic()
        self.gain_at = max(self.gain_at, now - self.start - idle_s)
        self.deadline = now + time_limit_s
        self.time_limit_s = self.deadline - self.start
        self.bound = max(self.bound, bound)
        if x is not None and self.fp.fits(x) and self.fp.objective(x) < self.search.best_obj:
            self.search.reset(x)
        self.search.reset(self.search.best_x)
        self.gain_best, self.gain_bound = min(self.gain_best, self._best_fitting()), max(self.gain_bound, self.bound)
        self.budget_factor = 1
        self.take_turns()
        self.finish()
        return self.result()

    def note_feasible(self) -> bool:
        """Whether the best plan fits and chooses nothing forbidden; the first time it does, when."""
        feasible = self.search.best_obj < FORBIDDEN and self.fp.fits(self.search.best_x)
        if feasible and "first_feasible_s" not in self.stats:
            self.stats["first_feasible_s"] = round(time.monotonic() - self.start, 3)
        return feasible

    def proved_optimal(self) -> bool:
        return within_gap(self.search.best_obj, self.bound, self.gap_limit) and self.fp.fits(self.search.best_x)

    def slack_of(self, x: np.ndarray) -> np.ndarray:
        return kernels.row_slack(self.fp.arrays, x)

    def first_plan(self) -> None:
        """A plan that chooses nothing forbidden before anything else, when the start (the
        smallest-usage choices, or the hint) does not. Cheapest first, each step only while
        forbidden choices are left: where the relaxation merges one-to-one groups, the low-memory
        labelling on them (`first_plan.py`: tens of milliseconds, and it breaks none of their
        edges); sweeps of tree moves from the start, and CP-SAT around what they leave
        (`Search.repair`: fast for a few, fails fast where a hub's whole star must turn); the
        labelling on the original nodes and CP-SAT around what it still breaks; CP-SAT around the
        start's forbidden choices. Each keeps the fit in memory. Without it, where forbidden
        pairs are dense, the first plan came from the relaxation's first decode that fits, after
        rounds of rising multipliers (benchmarks/RESULTS.md)."""
        fp = self.fp
        start_x = self.search.best_x.copy()
        if len(forbidden_nodes(fp, start_x)) == 0:
            return
        merged = self.contraction is not None
        if merged:
            self._take_labelling()
        self._sweep_out_forbidden()
        if len(forbidden_nodes(fp, self.search.best_x)):
            self._repair_into_best(self.search.best_x)
        if len(forbidden_nodes(fp, self.search.best_x)) and not merged:
            self._take_labelling()
        if len(forbidden_nodes(fp, self.search.best_x)):
            self._repair_into_best(start_x)
        self.stats["first_plan_forbidden"] = int(len(forbidden_nodes(fp, self.search.best_x)))
        self.report("first plan")
        self._sweep_first_plan()

    def _take_labelling(self) -> None:
        """The low-memory labelling (`first_plan.py`, on the merged groups where the relaxation
        has them), if it fits: the best when it chooses nothing forbidden, else repaired into it."""
        schedule = self.schedule
        labelled = low_memory_labelling(self.fp, self.seed, schedule.passes_stepping, schedule.first_plan_moves_per_centre,
                                        schedule.tree_block, self.contraction)
        if not self.fp.fits(labelled):
            return
        if len(forbidden_nodes(self.fp, labelled)):
            self._repair_into_best(labelled)
        else:
            self.search.reset(labelled)

    def _sweep_first_plan(self) -> None:
        """Sweeps of tree moves over the whole graph from the first plan, while each lowers its
        cost by `Schedule.first_plan_gain`: the moves that built it touched only the nodes
        around the forbidden choices, the rest is still at its smallest usage, and the relaxation's
        rounds that follow mix their decodes with it."""
        search, schedule = self.search, self.schedule
        if self.stats["first_plan_forbidden"]:
            return
        search.reset(search.best_x)
        for _ in range(schedule.first_plan_sweeps):
            if not self.deterministic and self.time_left() < schedule.first_plan_until_left * self.time_limit_s:
                break
            before = search.best_obj
            search.tree_moves(self.moves, schedule.tree_block)
            self.stats["tree_moves"] += self.moves
            if search.best_obj > (1.0 - schedule.first_plan_gain) * before:
                break
        self.report("first plan")

    def _repair_into_best(self, x: np.ndarray) -> None:
        """CP-SAT around x's forbidden choices (memory kept: x fits), then, if that changed x,
        sweeps from the best."""
        schedule = self.schedule
        budget = max(schedule.lns_min_s, schedule.first_plan_share * self.time_left())
        repaired = self.search.repair(x, schedule.repair_ball, budget,
                                      deterministic_time=schedule.lns_work if self.deterministic else None)
        if repaired is not x:
            self.search.reset(repaired)
            self._sweep_out_forbidden()

    def _sweep_out_forbidden(self) -> None:
        """Sweeps of tree moves around the forbidden choices of the best solution (blocks grown
        from them and their neighbours) while each removes enough of them
        (`Schedule.first_plan_progress`)."""
        fp, search, schedule = self.fp, self.search, self.schedule
        search.reset(search.best_x)
        bad = forbidden_nodes(fp, search.best_x)
        for _ in range(schedule.first_plan_sweeps):
            if len(bad) == 0 or (not self.deterministic and self.time_left() <= 0):
                return
            centres = fp.around(bad)
            moves = min(self.moves, schedule.first_plan_moves_per_centre * len(centres))
            search.tree_moves(moves, schedule.tree_block, centres=centres)
            self.stats["tree_moves"] += moves
            left = forbidden_nodes(fp, search.best_x)
            if len(left) > (1.0 - schedule.first_plan_progress) * len(bad):
                return
            bad = left

    def relax(self) -> None:
        """Relax-and-decode rounds: TRW-S under the multipliers decodes, tree moves clean up, the
        decode seeds the search or is relinked with the best, then the multipliers move."""
        fp, schedule, search = self.fp, self.schedule, self.search
        spans = (fp.r1 - fp.r0)[fp.r1 > fp.r0]
        self.unit = search.pen_unit / max(float(spans.mean()) if len(spans) else 1.0, 1.0) * schedule.first_multiplier
        self.step = StepLength(self.relaxation)
        self.stepping = False
        self.rounds_without_better = 0
        self.round_no = 0
        self.memory_binds = False
        self.rounds_without_gain = 0  # neither a better plan nor a bound closing the gap noticeably
        self.relax_peak = -math.inf  # the relaxation's best round bound at its last headway
        self.headway = False
        self.label = "relax"
        while (self._relaxing(self.round_no, self.memory_binds) and not self.proved_optimal()
               and (self.deterministic or self.rounds_without_gain < schedule.relax_patience)):
            self._relax_round()

    def _relax_round(self) -> None:
        """One round of `relax`, from the multipliers and step lengths the rounds before left."""
        fp, schedule, relaxation, search = self.fp, self.schedule, self.relaxation, self.search
        self.round_no += 1
        round_start = time.monotonic()
        best_before, bound_before = search.best_obj, self.bound
        x = relaxation.run(schedule.passes_stepping if self.stepping else schedule.passes)
        round_bound = relaxation.bound()
        self.bound = max(self.bound, round_bound)
        # Headway: this relaxation's own bound closing `bound_gain` of its gap since it last did,
        # even while under the best bound (a relaxation started again climbs for tens of rounds).
        self.headway = gained(search.best_obj, round_bound, search.best_obj, self.relax_peak, schedule.bound_gain)
        if self.headway:
            self.relax_peak = round_bound
        subgradient = self.slack_of(x)
        sweep_start = time.monotonic()
        _penalised_cleanup(fp, x, relaxation.penalties(), self.moves, self.seed + self.round_no, schedule.cleanup_block)
        self.sweep_s = time.monotonic() - sweep_start
        slack = self.slack_of(x)
        self.stats["relaxation_rounds"] += 1
        self._take_decode(x, slack, self.memory_binds)
        if search.best_obj < best_before:
            self.rounds_without_better = 0
        self.stepping = self.stepping or (search.best_obj < FORBIDDEN
                                          and self.rounds_without_better >= schedule.stepping_after)
        if self.stepping:
            relaxation.step_towards(subgradient, round_bound, search.best_obj,
                                    self.step.after(round_bound, search.best_obj))
        elif np.all(slack <= 0):
            relaxation.relax_loose(slack)
        else:
            relaxation.raise_on(slack, self.unit)
            self._raise_until_fit(self.unit)
        self.rounds_without_better += 1
        gap_closed = (self.bound - bound_before) / max(search.best_obj - self.bound, 1.0)
        paid = search.best_obj < best_before or gap_closed > schedule.relax_gain
        self.rounds_without_gain = 0 if paid or not self.stepping else self.rounds_without_gain + 1
        self.memory_binds = self.memory_binds or bool(relaxation.lam.any())
        self.round_s = time.monotonic() - round_start
        self.report(self.label)

    def _raise_until_fit(self, unit: float) -> None:
        """Where the messages run on merged one-to-one groups (`contraction.py`: milliseconds a
        pass), keep doubling the multipliers of the rows the decode overloads until one fits, at
        most `Schedule.merged_raises` times, instead of one doubling a round: a round's clean-up
        on the original nodes takes most of a second."""
        relaxation = self.relaxation
        if relaxation.contraction is None:
            return
        for _ in range(self.schedule.merged_raises):
            slack = self.slack_of(relaxation.run(self.schedule.passes_stepping))
            if np.all(slack <= 0):
                return
            relaxation.raise_on(slack, unit)

    def _relaxing(self, round_no: int, memory_binds: bool) -> bool:
        if self.deterministic:
            return round_no < self.schedule.deterministic_rounds
        left = self.schedule.relax_until_left_binding if memory_binds else self.schedule.relax_until_left
        return self.time_left() > max(left * self.time_limit_s, self.round_s)

    def _take_decode(self, x: np.ndarray, slack: np.ndarray, memory_binds: bool) -> None:
        """A decode first has its forbidden choices repaired (`Search.repair`; memory ignored when
        the decode overloads it anyway); then its regions that lower the best solution's cost move
        into it (`crossover.py`). A
        decode that fits and is cheaper becomes the search's (with tree moves on the true costs
        once memory binds: before, the clean-up's moves were these, on the same costs); one that is
        cheaper but does not fit is relinked with the best, or waits while relinking has had its
        share. Where `first_plan` built the start, relinks wait for a decode that fits: until then
        the best is that plan, far from the decodes (S-tight-crosscut: 1,300-1,600 nodes apart,
        relinks of 3 s that found nothing). A smallest-usage start that chose nothing forbidden is
        relinked with from the first round, as it pays there (gpt-96l-dp4tp8-m105, where no decode
        fits in 20 s: 1.018 of the best known with those relinks, 1.023-1.026 without)."""
        search, schedule = self.search, self.schedule
        x = search.repair(x, schedule.repair_ball, max(schedule.lns_min_s, schedule.repair_share * self.time_left()),
                          deterministic_time=schedule.lns_work if self.deterministic else None,
                          memory=bool(np.all(slack <= 0)))
        objective = self.fp.objective(x)
        self._cross_into_best(x)
        if np.all(slack <= 0):
            self.stats["feasible_decodes"] += 1
            if objective < search.best_obj:
                search.reset(x)
                if memory_binds:
                    search.tree_moves(self.moves, self.schedule.tree_block)
                    self.stats["tree_moves"] += self.moves
        elif (objective < search.best_obj < FORBIDDEN and x.tobytes() not in self.relinked
              and (self.stats["feasible_decodes"] or "first_plan_forbidden" not in self.stats)):
            if self.deterministic or time.monotonic() >= self.relink_free_from:
                relink_start = time.monotonic()
                self.relink(x)
                # As long again without one, doubled after each relink in a row that found nothing.
                self.relink_free_from = time.monotonic() + (time.monotonic() - relink_start) * 2 ** self.fruitless_relinks
            elif all(x.tobytes() != y.tobytes() for _, y in self.waiting):
                self.waiting = sorted(self.waiting + [(objective, x)],
                                      key=lambda item: item[0])[:self.schedule.waiting_decodes]

    def _cross_into_best(self, x: np.ndarray) -> None:
        """The regions of x that lower the best solution's cost move into it (`crossover.py`)."""
        if not self.fp.fits(self.search.best_x):
            return
        mixed = cross(self.fp, self.search.best_x, x)
        if self.fp.objective(mixed) < self.search.best_obj:
            self.stats["crossovers_improving"] += 1
            self.search.reset(mixed)

    def relink(self, x: np.ndarray, share: float | None = None) -> None:
        """CP-SAT over the nodes where x and the best solution differ (`Search.relink`), or over
        the groups where they differ when one-to-one edges tie nodes into groups
        (`group_relink.py`), then a descent if that improved the best."""
        schedule = self.schedule
        self.relinked.add(x.tobytes())
        share = schedule.relink_share if share is None else share
        budget_s = max(schedule.relink_min_s, share * self.time_left())
        patience_s = None
        if self.phase_s is not None:
            # In the turns a relink is one of the phase's steps: within its budget, and stopped
            # once half of it passes without a better mix (on B-p1001 a relink over merged groups
            # took 2.7 s, the relax phase's whole budget, and left its rounds no time).
            budget_s, patience_s = min(budget_s, self.phase_s), self.phase_s / 2
        deterministic_time = schedule.relink_work if self.deterministic else None
        contraction = self.contraction
        if contraction is None:
            change = self.search.relink(x, budget_s, self.workers, deterministic_time=deterministic_time,
                                        patience_s=patience_s)
        elif not groups_fit(self.fp, contraction.group, self.search.best_x, x):
            change = None  # too far apart, as `Search.relink` says of a model too large
        else:
            before = self.search.best_obj
            mixed = relink_groups(self.fp, contraction.group, self.search.best_x, x,
                                  min(budget_s, schedule.group_relink_max_s),
                                  int(self.search.rng.integers(1 << 31)), deterministic_time=deterministic_time,
                                  patience_s=patience_s)
            if mixed is not None:
                self.search.reset(mixed)
            change = self.search.best_obj - before
        self.stats["relinks"] += int(change is not None)
        self.stats["relinks_improving"] += int(bool(change))
        if change is not None:
            self.fruitless_relinks = 0 if change else self.fruitless_relinks + 1
        if change:
            self.descend_from_best()

    def relink_waiting(self) -> None:
        """The decodes that waited during the rounds, cheapest first, while time is left and the
        last relink found something (where the cheapest decodes cannot be mixed with the best, the
        dearer ones rarely can)."""
        for objective, x in self.waiting:
            if not self.deterministic and self.time_left() < self.schedule.waiting_until_left * self.time_limit_s:
                break
            if self.fruitless_relinks:
                break
            if objective < self.search.best_obj and x.tobytes() not in self.relinked:
                self.relink(x)

    def descend_from_best(self) -> None:
        """The descent within the best solution's usages (`descent.py`), when there is time for it."""
        expected_s = self.descent_s if self.stats["descents"] else self.round_s
        if self.fp.num_rows == 0 or (not self.deterministic
                                     and self.time_left() < self.schedule.descent_margin * expected_s):
            return
        descent_start = time.monotonic()
        y = descend(self.fp, self.search.best_x, self.seed)
        self.descent_s = time.monotonic() - descent_start
        self.stats["descents"] += 1
        if self.fp.objective(y) < self.search.best_obj:
            self.stats["descents_improving"] += 1
            self.search.reset(y)

    def solve_on_binding_rows(self, max_s: float | None = None) -> bool:
        """CP-SAT over the whole instance with only the rows of the largest multipliers (the ones
        the relaxation found binding), when the best fits but is not within `binding_rows_gap` of
        the bound, and the full model (solved by `solve` after the heuristic when it is small
        enough) is too large; an answer that breaks another row is relinked with the best. Where
        memory decides, the cheapest plan can differ from what the decodes find in tens of
        thousands of nodes at once. Each set of rows once, in at most `max_s`; returns whether it ran."""
        fp, schedule, search = self.fp, self.schedule, self.search
        if not fp.fits(search.best_x) or within_gap(search.best_obj, self.bound, schedule.binding_rows_gap) \
                or model_fits(fp):
            return False
        lam = self.relaxation.lam
        top = np.argsort(-lam, kind="stable")[:schedule.binding_rows]
        keep = np.zeros(fp.num_rows, dtype=bool)
        keep[top[lam[top] > 0]] = True
        if not keep.any() or keep.tobytes() in self.rows_tried:
            return False
        self.rows_tried.add(keep.tobytes())
        budget_s = schedule.binding_rows_share * self.time_left()
        result = search.on_rows(keep, budget_s if max_s is None else min(budget_s, max_s), self.workers,
                                deterministic_time=schedule.binding_rows_work if self.deterministic else None,
                                patience_s=None if max_s is None else max_s / 2)
        if result is None:
            return False
        self.stats["binding_rows"] = f"{int(keep.sum())} rows: {result.status} in {result.wall_s:.1f} s"
        if result.x is None:  # nothing in time (infeasible it cannot be: the best fits every row)
            return True
        if fp.objective(result.x) < search.best_obj:
            if fp.fits(result.x):
                search.reset(result.x)
                self.descend_from_best()
            else:
                self.relink(result.x, share=schedule.binding_relink_share)
        self.bound = max(self.bound, result.bound)
        return True

    def neighbourhood(self, nodes: np.ndarray, scale: int = 1) -> float:
        """One CP-SAT neighbourhood of the current solution (`scale` times the usual time), a
        descent after an improvement; returns the seconds it took."""
        schedule = self.schedule
        lns_start = time.monotonic()
        if self.deterministic:
            budget = schedule.lns_deterministic_limit_s * scale
        else:
            budget = min(schedule.lns_max_s * scale, max(schedule.lns_min_s, self.time_left() - schedule.lns_reserve_s))
            if self.phase_s is not None:
                budget = min(budget, max(schedule.lns_min_s, self.phase_s))  # one step within the phase's budget
        change = self.search.lns(nodes, budget,
                                 deterministic_time=schedule.lns_work * scale if self.deterministic else None)
        self.stats["lns"] += 1
        self.stats["lns_improving"] += int(change < 0)
        if change < 0:
            self.descend_from_best()  # leaves the search at the best solution, as the improving LNS did
        return time.monotonic() - lns_start

    def _time_for(self, last_s: float) -> bool:
        """Whether another step that may take as long as the last (`last_s`) fits in the time left."""
        return self.time_left() >= self.schedule.stop_margin_s + self.schedule.stop_factor * last_s

    def hub_neighbourhoods(self) -> None:
        """Tree moves never move a hub: all hubs at once, then a ball around each, those whose
        neighbours all fit in one first (turning a hub with all of them is a move nothing else
        makes); under the phases' budget, as the turns after it."""
        self.run_phase("hubs", self._hubs_phase(), "after the relaxation")

    def _hubs_phase(self) -> Iterator[None]:
        for nodes in self._around_hubs():
            self.neighbourhood(nodes)
            yield

    def _around_hubs(self) -> Iterator[np.ndarray]:
        hubs = _hubs(self.fp)
        if len(hubs) > 1:
            yield hubs[np.cumsum(self.fp.sizes()[hubs]) <= BALL_STRATEGIES]
        degree = np.diff(self.fp.aoff)
        ball_size = self.schedule.ball_size
        for hub in sorted(hubs.tolist(), key=lambda hub: bool(degree[hub] >= ball_size)):
            yield self.search.ball(hub, ball_size)

    def take_turns(self) -> None:
        """The phases of `Schedule.cycle` in turns, each until its budget is spent (`Patience`:
        rounds or seconds without a better plan or bound), it has nothing left to do, or the time
        is up or the gap limit met: nothing else ends the run. After a whole cycle without a
        gain the budgets grow (`Schedule.budget_growth`, up to `budget_max`; back to 1 after a
        gain): a slow phase may need longer than one budget to pay (a late improvement on a large
        instance), and the turns go on. The progress line names the phase and why the one before
        it stopped; `stats["phases"]` keeps the sequence."""
        schedule = self.schedule
        cycle = schedule.cycle
        phases = {"improve": self._improve_phase, "relax": self._relax_phase, "wider": self._wider_phase,
                  "restart": self._restart_phase, "rows": self._rows_phase}
        idle = 0  # phases in a row that gained nothing
        turn = 0
        self.rounds_in_turns = 0  # the hubs' balls do not count against the deterministic rounds
        while True:
            name = cycle[turn % len(cycle)]
            turn += 1
            previous = self.phases[-1] if self.phases else None
            after = f"after {previous['phase']}: {previous['stopped']}" if previous else "after the relaxation"
            stopped, gains = self.run_phase(name, phases[name](), after)
            if stopped in ("time up", "within the gap limit"):
                return
            if gains:
                idle, self.budget_factor = 0, 1
                continue
            idle += 1
            if idle == len(cycle):
                idle = 0
                self.budget_factor = min(self.budget_factor * schedule.budget_growth, schedule.budget_max)
                self.phases[-1]["stopped"] += f"; a cycle without gain, budgets x{self.budget_factor}"

    def run_phase(self, name: str, rounds: Iterator[bool | None], after: str) -> tuple[str, int]:
        """Runs `rounds` (a phase: one step per item, True when the step made headway of its own
        that the best plan and bound do not show yet) while its budget lasts; returns why it
        stopped and how many of its rounds gained. Each round reports progress as "<name> (<after>)"."""
        schedule = self.schedule
        self.label = f"{name} ({after})"
        started = time.monotonic()
        self.phase_s = None if self.deterministic else \
            schedule.patience_share * self.time_limit_s * self.budget_factor
        patience = Patience(schedule.patience_rounds * self.budget_factor, self.phase_s,
                            self._best_fitting(), self.bound, started, schedule.bound_gain)
        last_s = self.sweep_s
        stopped = "nothing to do"
        while True:
            if self.proved_optimal():
                stopped = "within the gap limit"
                break
            if not self._another_round(self.rounds_in_turns, last_s):
                stopped = "time up"
                break
            round_start = time.monotonic()
            headway = next(rounds, StopIteration)
            if headway is StopIteration:
                break
            self.rounds_in_turns += 1
            last_s = time.monotonic() - round_start
            self.report(self.label)
            spent = patience.spent(self._best_fitting(), self.bound, time.monotonic(), headway=bool(headway))
            if spent is not None:
                stopped = spent
                break
            stopped = "done"
        if hasattr(rounds, "close"):
            rounds.close()  # the phase's own ending (a relaxation's waiting relinks) runs now
        self.phase_s = None
        self.phases.append({"phase": name, "from_s": round(started - self.start, 3),
                            "to_s": round(time.monotonic() - self.start, 3), "stopped": stopped,
                            "gains": patience.gains})
        return stopped, patience.gains

    def _best_fitting(self) -> float:
        return self.search.best_obj if self.note_feasible() else math.inf

    def _improve_phase(self) -> Iterator[None]:
        """Rounds of tree moves and a ball around an expensive edge or a random node, in turns."""
        while True:
            self._ball_round(1)
            yield

    def _wider_phase(self) -> Iterator[None]:
        """The improve phase's rounds with balls `Schedule.wider_growth` times larger each time
        it runs (up to `wider_max`): where memory binds, a ball of 120 nodes has no room to turn."""
        self.widened = min(self.widened * self.schedule.wider_growth, self.schedule.wider_max)
        while True:
            self._ball_round(self.widened)
            yield

    def _ball_round(self, scale: int) -> None:
        schedule, search = self.schedule, self.search
        search.tree_moves(self.moves, schedule.tree_block)
        self.stats["tree_moves"] += self.moves
        centre = _expensive_node(self.fp, search.x, search.rng, schedule.random_centre)
        self.neighbourhood(search.ball(centre, schedule.ball_size * scale, BALL_STRATEGIES * scale), scale)

    def _relax_phase(self) -> Iterator[bool]:
        """More relaxation rounds from where the last left the multipliers: they lift the bound,
        and their decodes are crossed into the best or relinked with it (another region of the
        plans than the neighbourhoods reach); then the waiting relinks and a descent. After a
        phase on merged groups that did not lift the bound, the next ones run on the original
        nodes (`_unmerge`)."""
        bound_before = self.bound
        try:
            while True:
                self._relax_round()
                yield self.headway
        finally:
            lifted = self.bound - bound_before >= self.schedule.bound_gain * (self.search.best_obj - bound_before)
            if self.relaxation.contraction is not None and not lifted:
                self._unmerge()
            self.relink_waiting()
            self.descend_from_best()
            self.search.reset(self.search.best_x)

    def _unmerge(self) -> None:
        """The relaxation again from the start on the original nodes: no multipliers, doubling
        before Polyak steps, fresh step lengths. On B-p1001 the bound on merged groups stays at
        493,377 for hundreds of Polyak steps while on the original nodes the same rounds lift it
        to 510,000 in 400 (benchmarks/RESULTS.md, issue 37); the merged multipliers with cold
        messages are no start (their first bound is far below, and the steps it sizes wreck them).
        The merged rounds' speed matters for the first plans, not here; the relinks and the
        labelling keep the groups."""
        self.relaxation = Relaxation(self.fp)
        self.step = StepLength(self.relaxation)
        self.stepping = False
        self.rounds_without_better = 0
        self.relax_peak = -math.inf
        self.stats["unmerged_at_s"] = round(time.monotonic() - self.start, 3)

    def _restart_phase(self) -> Iterator[None]:
        """Another start: the low-memory labelling (with another seed for its moves), then sweeps of
        tree moves on the true costs from it, each a round; what they reach is crossed into the
        best (`crossover.py`) and relinked with it when cheaper. The best stays the neighbourhoods'
        start afterwards."""
        fp, search, schedule = self.fp, self.search, self.schedule
        self.restarts += 1
        labelled = low_memory_labelling(fp, self.seed + self.restarts, schedule.passes_stepping,
                                        schedule.first_plan_moves_per_centre, schedule.tree_block,
                                        self.contraction)
        if not fp.fits(labelled) or len(forbidden_nodes(fp, labelled)):
            return
        search.reset(labelled)
        try:
            for _ in range(schedule.first_plan_sweeps):
                before = fp.objective(search.x)
                search.tree_moves(self.moves, schedule.tree_block)
                self.stats["tree_moves"] += self.moves
                yield
                if fp.objective(search.x) > (1.0 - schedule.first_plan_gain) * before:
                    break
        finally:
            reached = search.x.copy()
            self._cross_into_best(reached)
            if fp.objective(reached) < search.best_obj and reached.tobytes() not in self.relinked:
                self.relink(reached)
            search.reset(search.best_x)

    def _rows_phase(self) -> Iterator[None]:
        """CP-SAT over the whole instance under the rows the multipliers now mark as binding
        (`solve_on_binding_rows`), once per set of rows, in the phase's time."""
        if self.solve_on_binding_rows(max_s=self.phase_s):
            yield

    def _another_round(self, rounds: int, last_s: float) -> bool:
        return rounds < self.schedule.deterministic_rounds if self.deterministic else self._time_for(last_s)


def _hubs(fp: FlatProblem) -> np.ndarray:
    """The movable nodes with more than `kernels.HUB_DEGREE` neighbours (tree moves never move
    them), most connected first."""
    degree = np.diff(fp.aoff)
    hubs = np.flatnonzero((degree > kernels.HUB_DEGREE) & (fp.sizes() > 1))
    return hubs[np.argsort(-degree[hubs], kind="stable")]


def _expensive_node(fp: FlatProblem, x: np.ndarray, rng: np.random.Generator, random_share: float) -> int:
    """An endpoint of an edge drawn with probability proportional to its current cost; a random
    movable node with probability `random_share` or when no edge costs anything."""
    movable = np.flatnonzero(fp.sizes() > 1)
    if fp.m == 0 or rng.random() < random_share:
        return int(rng.choice(movable)) if len(movable) else 0
    sizes = fp.sizes()
    current = fp.mat[fp.moff[:-1] + x[fp.eu] * sizes[fp.ev] + x[fp.ev]]
    weights = np.minimum(current, EXPENSIVE_EDGE_CAP)
    total = weights.sum()
    if total <= 0:
        return int(rng.choice(movable))
    e = int(rng.choice(fp.m, p=weights / total))
    u, v = int(fp.eu[e]), int(fp.ev[e])
    return u if sizes[u] > 1 else v

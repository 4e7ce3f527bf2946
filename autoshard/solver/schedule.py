"""How the heuristic (`heuristic.py`) spends its time: the share of each phase, the sizes of its
moves, and the fixed work that replaces the clock when a run must be reproducible.

Shares are of the whole time limit ("until ... of the time is left") or of the time left when a
step starts; a phase that can run long (a CP-SAT model of many nodes) gets a share of what is
left, so a slow one cannot starve the phases after it of all their time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """The heuristic's time shares, move sizes and round counts, and its deterministic budget."""

    # The first plan, when the start chooses something forbidden (`HeuristicRun.first_plan`):
    # sweeps of tree moves grown from the forbidden choices and their neighbours,
    # `first_plan_moves_per_centre` moves per such node (at most a whole sweep's), at most
    # `first_plan_sweeps`, each only while the one before removed at least `first_plan_progress`
    # of the forbidden choices; a CP-SAT repair gets `first_plan_share` of the time left. On the
    # test bed's dense-forbidden instances the sweeps clear all of them within five or stall
    # within four, and the labelling leaves a handful.
    first_plan_sweeps: int = 8
    first_plan_progress: float = 0.2
    first_plan_moves_per_centre: int = 2
    # Then sweeps of tree moves over the whole graph improve it, while each gains at least
    # `first_plan_gain` and more than `first_plan_until_left` of the time is left (without them
    # the rounds start from a plan that is still at its smallest usage almost everywhere:
    # N-crosscut ended at 1.47 of its best known instead of 1.12).
    first_plan_gain: float = 0.01
    first_plan_until_left: float = 0.7
    first_plan_share: float = 0.1
    # Relaxation rounds. While no row binds, every round just carries TRW-S on from warm messages,
    # and its decodes and the tree moves that clean them up are the search (on large training steps
    # a CP-SAT neighbourhood or a sweep of tree moves takes seconds and rarely finds anything;
    # benchmarks/RESULTS.md): the rounds go on until a fifth of the time is left. Once memory binds (some
    # multiplier has risen) the neighbourhoods of the feasible search matter more: until half.
    relax_until_left: float = 0.2
    relax_until_left_binding: float = 0.5
    # ... and only while they pay: once Polyak steps have taken over (`stepping_after`), after
    # `relax_patience` rounds in a row that found no better plan and closed less than `relax_gain`
    # of the gap from below, the neighbourhoods take over (on instances with dense forbidden pairs
    # the rounds stop paying long before half the time; on training steps the first rounds of
    # Polyak steps still find better decodes, so the count starts there).
    relax_patience: int = 6
    relax_gain: float = 0.01
    # TRW-S passes per round; once Polyak steps move the multipliers each round moves them less.
    passes: int = 10
    passes_stepping: int = 5
    # Doubling the multipliers of overloaded rows finds fitting decodes fast; after this many rounds
    # without a better solution, Polyak steps take over for good (stepping towards a cost far above
    # the optimum, before any solution is near it, makes them oscillate).
    stepping_after: int = 20
    # Where the messages run on merged groups, a round doubles the overloaded rows' multipliers up
    # to this many times, while its passes' decode still overloads one.
    merged_raises: int = 30
    # An overloaded row's first multiplier, as a share of the cost per unit of usage
    # (`search.exchange_rate`) spread over a node's mean number of rows: small enough not to
    # overshoot, the doubling does the rest.
    first_multiplier: float = 0.01
    # Tree moves: a sweep is this many moves or per_node per node, whichever is more; a decode's
    # clean-up moves smaller blocks (its penalised costs change every round, the sweep is a tidy-up).
    tree_moves: int = 2000
    tree_moves_per_node: int = 2
    tree_block: int = 16
    cleanup_block: int = 8
    # Relinks: a decode cheaper than the best that does not fit is relinked with it, in a share
    # of the time left (at least relink_min_s). Relinking takes at most about half of the rounds'
    # time: after a relink, as long again without one; decodes found meanwhile wait, the
    # `waiting_decodes` cheapest, and are relinked after the rounds while enough time is left.
    relink_share: float = 0.3
    relink_min_s: float = 1.0
    waiting_decodes: int = 4
    # A relink over merged groups (`group_relink.py`: a few hundred booleans) finds its answer in
    # about a second on C and would spend the rest of a larger share proving it.
    group_relink_max_s: float = 3.0
    waiting_until_left: float = 0.25
    # CP-SAT over the whole instance under the rows of the largest multipliers (`binding_rows`
    # of them, the ones the relaxation found binding), when the certified gap is above
    # `binding_rows_gap`: it may take most of the time left, being the one step that changes
    # tens of thousands of nodes at once where memory decides. Its answer, when it breaks another
    # row, is relinked with a larger share than a decode's (it is usually far better).
    binding_rows: int = 16
    binding_rows_gap: float = 0.01
    binding_rows_share: float = 0.75
    binding_relink_share: float = 0.6
    # A decode that fits in memory has the balls of `repair_ball` nodes around its forbidden
    # choices re-solved by CP-SAT, in up to `repair_share` of the time left (where most edge
    # entries are forbidden, almost every decode breaks a few pairs; repaired, the first plan comes
    # from the first decodes and the later ones still improve the best: benchmarks/RESULTS.md).
    repair_ball: int = 40
    repair_share: float = 0.05
    # A descent runs only while twice the last one's time is left (its time is about constant).
    descent_margin: float = 2.0
    # CP-SAT neighbourhoods: balls of this many nodes (and at most `search.BALL_STRATEGIES`
    # strategies), each given up to lns_max_s, at least lns_min_s, keeping lns_reserve_s for
    # the answer. The next neighbourhood (or round of tree moves and one neighbourhood) starts only
    # while `stop_margin_s` + `stop_factor` times the last one's time is left.
    ball_size: int = 120
    lns_max_s: float = 2.0
    lns_min_s: float = 0.05
    lns_reserve_s: float = 0.1
    stop_margin_s: float = 0.2
    stop_factor: float = 1.5
    # A random neighbourhood is centred on an endpoint of an expensive edge, or on a random node with
    # this probability (expensive edges alone revisit the same few places).
    random_centre: float = 0.3
    # After the hubs, the phases of `cycle` take turns, each under a budget: it stops after
    # `patience_rounds` rounds in a row, or `patience_share` of the time limit, without a better
    # plan or a bound that closes `bound_gain` of the gap since the last gain (Polyak steps creep
    # the bound up by crumbs: they count once they add up). Its CP-SAT steps (neighbourhoods,
    # relinks, the rows) take at most the phase's seconds, and stop after half of them without a
    # better answer. (Issue 37: on a memory-tight instance the random neighbourhoods ran 298 s of
    # 300 without changing the plan or the bound.) After a cycle in which no phase gained, the
    # budgets grow `budget_growth` times, up to `budget_max` times: only the time limit or the gap
    # limit ends the turns (a late gain on a large instance is worth the wait).
    cycle: tuple[str, ...] = ("improve", "relax", "wider", "restart", "rows")
    patience_rounds: int = 12
    patience_share: float = 0.04
    bound_gain: float = 1e-3
    budget_growth: int = 2
    budget_max: int = 4
    # `wider` frees balls `wider_growth` times larger (nodes, strategies and CP-SAT's time) each
    # time it runs, up to `wider_max` times the improve phase's.
    wider_growth: int = 2
    wider_max: int = 8
    # The deterministic budget (`deterministic=True`): a fixed number of relaxation rounds and of
    # rounds of tree moves and random neighbourhoods, and CP-SAT's deterministic time (its own units)
    # instead of wall-clock limits; a neighbourhood keeps a wall limit far above its work.
    deterministic_rounds: int = 12
    relink_work: float = 5.0
    binding_rows_work: float = 10.0
    lns_work: float = 1.0
    lns_deterministic_limit_s: float = 10.0


SCHEDULE = Schedule()


def gained(best: float, bound: float, best_before: float, bound_before: float, bound_gain: float) -> bool:
    """Whether (best, bound) improves on (best_before, bound_before): a cheaper plan, or a bound
    that closes at least `bound_gain` of the gap left before (any rise while no plan is known)."""
    if best < best_before:
        return True
    if not math.isfinite(best_before) or not math.isfinite(bound_before):
        return bound > bound_before
    return bound - bound_before >= bound_gain * max(best_before - bound_before, 0.0)


class Patience:
    """How long a phase has gone without a gain (`gained`), in rounds and seconds; `spent` says
    why it should stop, or None. Seconds are not counted when `seconds` is None (the
    deterministic budget counts rounds only)."""

    def __init__(self, rounds: int, seconds: float | None, best: float, bound: float, now: float,
                 bound_gain: float):
        self.rounds, self.seconds, self.bound_gain = rounds, seconds, bound_gain
        self.best, self.bound = best, bound
        self.since = now
        self.idle_rounds = 0
        self.gains = 0

    def spent(self, best: float, bound: float, now: float, headway: bool = False) -> str | None:
        """After a round that left the best plan at `best` and the bound at `bound`, at `now`;
        `headway`: the round made progress of its own that neither shows yet (it starts the
        count again without being a gain)."""
        if gained(best, bound, self.best, self.bound, self.bound_gain):
            self.gains += 1
            self.idle_rounds, self.since = 0, now
            self.best, self.bound = min(best, self.best), max(bound, self.bound)
        elif headway:
            self.idle_rounds, self.since = 0, now
        else:
            self.idle_rounds += 1
        if self.idle_rounds >= self.rounds:
            return f"{self.idle_rounds} round{'s' if self.idle_rounds > 1 else ''} without gain"
        if self.seconds is not None and now - self.since >= self.seconds:
            return f"{now - self.since:.1f} s without gain"
        return None

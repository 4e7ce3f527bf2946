"""The best mix of two answers group by group, under the exact memory rows.

Where one-to-one edges tie nodes into groups (`contraction.py`), a cheap decode of the relaxation
that overloads memory and the best answer that fits differ in a few hundred groups but in
thousands of nodes: a CP-SAT model over the nodes (`Search.relink`) is too large, while one
boolean per differing group (take the decode's choices there, or keep the best's) is small.
Node costs and edges with one end fixed are linear in those booleans, edges between two differing
groups add a product, and each memory row is a linear constraint on the usages that change, kept
only where the changes could overload it. Its answer mixes two answers that choose nothing
forbidden without creating a forbidden pair (combinations that would are excluded) and fits.
"""

from __future__ import annotations

import numpy as np
from ortools.sat.python import cp_model

from autoshard.solver.exact import Stall
from autoshard.solver.flat import FORBIDDEN, FlatProblem
from autoshard.solver.stopping import cp_solver, stoppable

# Differing groups times rows: the dense table of usage changes per row stays under this.
TABLE_LIMIT = 50_000_000


def groups_fit(fp: FlatProblem, group: np.ndarray, best: np.ndarray, other: np.ndarray) -> bool:
    """Whether `relink_groups` takes these two answers: their differing groups times the rows stay
    within `TABLE_LIMIT`."""
    return len(np.unique(group[best != other])) * max(fp.num_rows, 1) <= TABLE_LIMIT


def relink_groups(fp: FlatProblem, group: np.ndarray, best: np.ndarray, other: np.ndarray, time_limit_s: float,
                  seed: int, deterministic_time: float | None = None,
                  patience_s: float | None = None) -> np.ndarray | None:
    """The cheapest answer found in `time_limit_s` (CP-SAT's `deterministic_time` instead, when
    given) that keeps `best`'s choices or takes `other`'s in each group where they differ
    (`group`: each node's group), fits in memory and chooses nothing forbidden, if cheaper than
    `best` (which must fit and choose nothing forbidden); else None, also when they are too far
    apart (`groups_fit`). With `patience_s` (wall-clock runs), CP-SAT stops after that many
    seconds without a better mix (its bound, of the mix only, does not count)."""
    differ = np.flatnonzero(best != other)
    if len(differ) == 0 or not groups_fit(fp, group, best, other):
        return None
    groups, var_of_differ = np.unique(group[differ], return_inverse=True)
    count = len(groups)
    var_of = np.full(fp.n, -1, dtype=np.int64)
    var_of[differ] = var_of_differ
    model = cp_model.CpModel()
    take = [model.new_bool_var(f"take{i}") for i in range(count)]
    linear = np.zeros(count, dtype=np.float64)
    banned = np.zeros(count, dtype=bool)

    node_change = fp.cost[fp.soff[differ] + other[differ]] - fp.cost[fp.soff[differ] + best[differ]]
    np.add.at(banned, var_of_differ, fp.cost[fp.soff[differ] + other[differ]] >= FORBIDDEN)
    np.add.at(linear, var_of_differ, np.where(node_change >= FORBIDDEN, 0.0, node_change))

    sizes = fp.sizes()
    eu, ev = fp.eu, fp.ev
    iu, iv = var_of[eu], var_of[ev]

    def entry(a: np.ndarray, b: np.ndarray, e: np.ndarray) -> np.ndarray:
        return fp.mat[fp.moff[e] + a * sizes[ev[e]] + b]

    # One end differs (or both, in one group): a linear term of that group.
    single = np.flatnonzero(((iu >= 0) != (iv >= 0)) | ((iu >= 0) & (iu == iv)))
    if len(single):
        var = np.where(iu[single] >= 0, iu[single], iv[single])
        after = entry(other[eu[single]], other[ev[single]], single)
        before = entry(best[eu[single]], best[ev[single]], single)
        np.add.at(banned, var, after >= FORBIDDEN)
        np.add.at(linear, var, np.where(after >= FORBIDDEN, 0.0, after - before))
    for i in np.flatnonzero(banned).tolist():
        model.add(take[i] == 0)

    # Both ends differ, in two groups: costs of the four combinations, a product for the rest.
    pairs = np.flatnonzero((iu >= 0) & (iv >= 0) & (iu != iv))
    products: dict[tuple[int, int], float] = {}
    implied: list[tuple[int, int]] = []  # (a, b): taking a takes b (a forbidden pair otherwise)
    exclusive: list[tuple[int, int]] = []  # not both
    if len(pairs):
        c00 = entry(best[eu[pairs]], best[ev[pairs]], pairs)
        c10 = entry(other[eu[pairs]], best[ev[pairs]], pairs)
        c01 = entry(best[eu[pairs]], other[ev[pairs]], pairs)
        c11 = entry(other[eu[pairs]], other[ev[pairs]], pairs)
        for k, (a, b) in enumerate(zip(iu[pairs].tolist(), iv[pairs].tolist())):
            if c10[k] >= FORBIDDEN:
                model.add_implication(take[a], take[b])
                implied.append((a, b))
            if c01[k] >= FORBIDDEN:
                model.add_implication(take[b], take[a])
                implied.append((b, a))
            if c11[k] >= FORBIDDEN:
                model.add_bool_or([take[a].Not(), take[b].Not()])
                exclusive.append((a, b))
            v10 = c10[k] - c00[k] if c10[k] < FORBIDDEN else 0.0
            v01 = c01[k] - c00[k] if c01[k] < FORBIDDEN else 0.0
            v11 = c11[k] - c00[k] if c11[k] < FORBIDDEN else v10 + v01
            linear[a] += v10
            linear[b] += v01
            key = (a, b) if a < b else (b, a)
            products[key] = products.get(key, 0.0) + v11 - v10 - v01

    objective = [int(round(c)) * take[i] for i, c in enumerate(linear.tolist()) if c != 0]
    for (a, b), c in products.items():
        if c == 0:
            continue
        both = model.new_bool_var(f"both{a}_{b}")
        model.add_bool_and([take[a], take[b]]).only_enforce_if(both)
        model.add_bool_or([take[a].Not(), take[b].Not()]).only_enforce_if(both.Not())
        objective.append(int(round(c)) * both)
    model.minimize(sum(objective))
    columns, limits = _add_rows(model, fp, take, differ, var_of_differ, best, other, count)

    # CP-SAT starts from the greedy mix when it is a cheaper one than keeping `best`: where most
    # groups switch together (C: 117 of 134, only 3 of them cheaper alone), its search from
    # "keep everything" took 1.5-3 s to find that mix, so a loaded machine left the relink
    # with a mix 14% dearer (benchmarks/RESULTS.md, issue 37).
    start = _greedy_mix(linear, products, banned, implied, exclusive, columns, limits)
    for t, value in zip(take, start.tolist() if start is not None else [False] * count):
        model.add_hint(t, int(value))
    solver = cp_solver()
    if deterministic_time is None:
        solver.parameters.max_time_in_seconds = max(time_limit_s, 0.01)
    else:
        solver.parameters.max_deterministic_time = deterministic_time
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    with stoppable(solver):
        if patience_s is None or deterministic_time is not None:
            status = solver.solve(model)
        else:
            with Stall(patience_s, solver.stop_search, bounds=False).watch() as stall:
                status = solver.solve(model, _Solutions(stall))
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    chosen = np.array([solver.boolean_value(t) for t in take], dtype=bool)
    mixed = best.copy()
    switch = differ[chosen[var_of_differ]]
    mixed[switch] = other[switch]
    if fp.objective(mixed) < fp.objective(best) and fp.fits(mixed):
        return mixed
    return None


class _Solutions(cp_model.CpSolverSolutionCallback):
    """Tells the stall watch of each better mix."""

    def __init__(self, stall: Stall):
        super().__init__()
        self._stall = stall

    def on_solution_callback(self) -> None:
        self._stall.note(self.objective_value, -np.inf)


def _greedy_mix(linear: np.ndarray, products: dict[tuple[int, int], float], banned: np.ndarray,
                implied: list[tuple[int, int]], exclusive: list[tuple[int, int]], columns: np.ndarray,
                limits: np.ndarray) -> np.ndarray | None:
    """A mix from the other side: take every group that may switch, drop the one that costs least
    per unit of overload it removes until the rows hold, then flip single groups while that
    lowers the cost and keeps the rows. Returns the choice if it breaks no pair constraint and
    costs less than keeping `best` (0), else None. `columns[k, i]`: group i's usage change in
    constraint k, at most `limits[k]` in all."""
    count = len(linear)
    if count == 0:
        return None
    first = np.array([a for a, _ in products], dtype=np.int64)
    second = np.array([b for _, b in products], dtype=np.int64)
    weight = np.array(list(products.values()), dtype=np.float64)

    def marginal(t: np.ndarray) -> np.ndarray:
        """Each group's cost of being taken, given the others in t."""
        gain = linear.copy()
        np.add.at(gain, first, weight * t[second])
        np.add.at(gain, second, weight * t[first])
        return gain

    t = ~banned
    usage = columns @ t.astype(np.int64)
    while True:
        over = usage - limits
        if not (over > 0).any():
            break
        hot = over > 0
        relief = np.minimum(np.maximum(columns[hot], 0), over[hot, None]).sum(axis=0)
        candidates = np.flatnonzero(t & (relief > 0))
        if len(candidates) == 0:
            return None
        # Dropping a group saves -marginal; the cheapest loss per unit of relief goes first.
        loss = -marginal(t)[candidates]
        i = int(candidates[np.argmin(loss / relief[candidates])])
        t[i] = False
        usage -= columns[:, i]
    for _ in range(count):  # single flips while one pays and keeps the rows
        gain = marginal(t)
        change = np.where(t, -gain, gain)
        delta = np.where(t[None, :], -columns, columns)
        allowed = ~banned & np.all(usage[:, None] + delta <= limits[:, None], axis=0)
        change[~allowed] = 0.0
        i = int(np.argmin(change))
        if change[i] >= 0:
            break
        t[i] = not t[i]
        usage += delta[:, i]
    if any(t[a] and not t[b] for a, b in implied) or any(t[a] and t[b] for a, b in exclusive):
        return None
    cost = float(linear @ t) + float(weight @ (t[first] & t[second]))
    return t if cost < 0 else None


def _add_rows(model: cp_model.CpModel, fp: FlatProblem, take: list, differ: np.ndarray, var_of_differ: np.ndarray,
              best: np.ndarray, other: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Each memory row the changes could overload: the usage each group's switch adds there
    within the room `best` leaves (rows with the same changes kept once, with the least room).
    Returns them as constraints (one row of group changes each) and their limits."""
    none = (np.zeros((0, count), dtype=np.int64), np.zeros(0, dtype=np.int64))
    if fp.num_rows == 0:
        return none
    change = fp.use[fp.soff[differ] + other[differ]] - fp.use[fp.soff[differ] + best[differ]]
    live = fp.r1[differ] > fp.r0[differ]
    table = np.zeros((count, fp.num_rows + 1), dtype=np.int64)
    np.add.at(table, (var_of_differ[live], fp.r0[differ][live]), change[live])
    np.add.at(table, (var_of_differ[live], fp.r1[differ][live]), -change[live])
    table = np.cumsum(table[:, :-1], axis=1)
    room = fp.cap - fp.row_load(best)
    at_risk = np.flatnonzero(np.maximum(table, 0).sum(axis=0) > room)
    if len(at_risk) == 0:
        return none
    columns, first = np.unique(table[:, at_risk].T, axis=0, return_inverse=True)
    least_room = np.full(len(columns), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(least_room, first.reshape(-1), room[at_risk])
    for column, limit in zip(columns, least_room.tolist()):
        terms = [int(c) * take[i] for i, c in enumerate(column.tolist()) if c != 0]
        model.add(sum(terms) <= limit)
    return columns, least_room

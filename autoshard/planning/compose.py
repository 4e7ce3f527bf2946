"""A layer solved once: plan a graph of repeated layers from one solve per layer kind.

The graph is formulated once, whole (its identical layers share their nodes' strategies, costs
and matrices). Layers whose nodes form one problem are a kind (`layer_nodes.problem_kinds`); a
layer of a kind of its own (a transformer's first and last, whose neighbours are not layers)
joins the nodes outside every layer, the rest; with no kind of two layers or more, the whole
graph is solved by `make_plan`. Each kind is solved once, on its representative's nodes, with the reshardings between two
consecutive layers of the kind added as edges from the representative to itself (the steady
state of a stack of identical layers). Its frontier holds the fastest plan and, when the fastest
plans of all layers do not fit the memory budget together, plans solved under tighter memory
limits. A knapsack over layers picks one frontier point per layer. Its memory model: each layer
keeps what its own nodes hold when its forward ends (its state and saved activations) until its
backward, and on top of all of them the largest transient of one layer; the nodes outside every
layer (embedding, head, loss and their backward and optimizer ops; the rest) are then solved
with the layers fixed, the edges to and from them costs on the rest's nodes. Each kind is then
solved once more with everything else fixed (its edges with other kinds and the rest shared out
per layer), and the rest after it. The plan is an ordinary `Plan`, its objective the whole
formulation's (each value delivered as `estimate` delivers it: the objective is the report's
price), checked against the budget by `estimate`. The time limit is shared out: half to the
bound problems below, each by its share of their nodes; a quarter to the kinds' two solves each,
by their nodes in all layers (tighter frontier points, when memory binds, take one more solve's
time per kind); a quarter to the rest's two solves.

The certified bound. Split the whole problem's nodes into parts: the rest joined with the layers
beside it, and the other layers of each kind in chains of consecutive ones. The whole objective
of any plan is the sum over parts of their own node and edge costs plus the costs of the edges
between parts. Charge each edge between parts to its reader's part, as an edge from a free copy
of the node it reads (`Parts.joined`): the part's joined problem has a solution costing at most
the part's share of the plan. Dropping the memory limit only lowers a problem's least cost. So
the sum over parts of a certified lower bound of each joined problem (the solver's bound; one
solve per distinct chain) is a certified lower bound of the whole formulation, the problem
`make_plan` solves: weaker than its bound by the reshardings between chains and by the memory
limit when that binds.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoshard.errors import InfeasibleError, InputError
from autoshard.graph.model import Graph
from autoshard.graph.summary import size
from autoshard.mesh import Mesh
from autoshard.phases import PhaseTimes
from autoshard.planning.costs import Hardware
from autoshard.planning.formulation import PICOSECONDS, Formulation, formulate
from autoshard.planning.layer_kinds import layer_kinds
from autoshard.planning.layer_nodes import Kind, problem_kinds
from autoshard.planning.make_plan import PlanResult, SolveSettings, make_plan
from autoshard.planning.parts import Parts, with_terms
from autoshard.planning.plan import validate_plan
from autoshard.planning.report import delivered_shardings, estimate
from autoshard.solver import Problem, score, solve
from autoshard.solver.problem import usage_profile

# Memory limits of a kind's further frontier points, as shares of its fastest plan's peak.
FRONTIER_SHARES = (0.7, 0.45)
BOUND_SHARE = 0.5  # of the time limit, for the bound problems
MEMORY_BUCKETS = 1024  # the knapsack's memory resolution: budget / buckets per step, rounded up
MEMORY_RETRIES = 3
# Consecutive layers of a kind bounded together: the bound misses the reshardings between chains
# only, and what the solver's bound misses in its time. On the 3-D 1.3B training step a chain of 16
# bounded in 6 s was 3.7% under its layers' cost, in 20 s 0.8%; at 22B width 8% in 8 s, as a chain
# of 4 in 4 s: the bound's time per layer counts, so chains are cut equal (one problem to bound).
CHAIN_LAYERS = 16
MIN_CHAIN_LAYERS = 4


@dataclass(frozen=True)
class FrontierPoint:
    solution: tuple[int, ...]  # per node of the kind's representative, canonical order
    cost_ps: int  # the layer's own nodes and edges
    boundary_ps: int  # reshardings from the layer before of the kind (steady state, estimated)
    memory_bytes: int  # what the layer's own nodes hold when its forward ends (state and saved activations)
    peak_bytes: int  # the most they hold at once


@dataclass
class KindPlan:
    kind: Kind
    part: Problem  # the representative's nodes and the edges among them
    wrap: tuple[dict[int, np.ndarray], list[tuple[int, int, np.ndarray]]]  # terms from the representative to itself
    lower_bound_ps: int  # its layers' share of the certified bound (those beside the rest are in the rest's)
    turn: int  # the step at which the representative's forward ends
    solve_s: float  # the time limit of each of its solves
    frontier: list[FrontierPoint]

    def transient_bytes(self) -> int:
        """The most a layer holds on top of what it keeps from its forward to its backward."""
        return max(point.peak_bytes - point.memory_bytes for point in self.frontier)


def plan_layer_once(graph: Graph, mesh: Mesh, hw: Hardware, settings: SolveSettings = SolveSettings(),
                    phases: PhaseTimes | None = None) -> PlanResult:
    """Plan `graph` by solving each layer kind once and composing (module docstring)."""
    phases = PhaseTimes() if phases is None else phases
    started = time.perf_counter()
    structural = layer_kinds(graph)
    if not structural:
        raise InputError("the graph declares no layers (no op has a `layer`); planning layer by layer needs them",
                         "/ops")
    budget = int(settings.memory_budget_bytes if settings.memory_budget_bytes is not None else hw.hbm_bytes)
    with phases.phase("formulate"):
        formulation = formulate(graph, mesh, hw, memory_budget_bytes=budget, weights=settings.weights,
                                mesh_order=settings.mesh_order_splits)
        parts = Parts(formulation.problem, [id(choices) for choices in formulation.choices])
        # a layer of a kind of its own is solved with the rest
        kinds = [kind for kind in problem_kinds(formulation, parts, structural) if len(kind.layers) > 1]
    if not kinds:
        result = make_plan(graph, mesh, hw, settings, phases=phases)
        result.solver["composition"] = {"method": "whole", "kinds": 0, "layers": 0}
        return result
    with phases.phase("formulate"):
        layer_of = np.full(formulation.problem.num_nodes, -1, dtype=np.int64)
        for kind in kinds:
            for layer in kind.layers:
                layer_of[layer.nodes] = layer.layer
        rest = np.flatnonzero(layer_of < 0)
        beside = _beside_rest(formulation, parts, layer_of)
        rest_joined, _ = parts.joined(np.concatenate(
            [rest] + [layer.nodes for kind in kinds for layer in kind.layers if layer.layer in beside]))
        rest_part = parts.part(rest)
        chains = [_chains(parts, kind, beside) for kind in kinds]
    formulated = time.perf_counter()
    # the bound problems' share of the time limit by their nodes; of the plan's share, half to the
    # kinds by their nodes in all layers (a kind's plan is paid once per layer), half to the rest
    distinct = {id(p): p.num_nodes for found in chains for p, _ in found}  # each solved once
    bound_nodes = max(rest_joined.num_nodes + sum(distinct.values()), 1)
    bound_s = settings.time_limit_s * BOUND_SHARE / bound_nodes
    plan_s = settings.time_limit_s * (1 - BOUND_SHARE) / 2
    kind_nodes = [len(k.layers[0].nodes) * len(k.layers) for k in kinds]
    with phases.phase("solve"):
        step_phases = graph.phases
        plans = [_solve_kind(parts, kind, found, step_phases, bound_s, plan_s * nodes / sum(kind_nodes), settings)
                 for kind, found, nodes in zip(kinds, chains, kind_nodes)]
        rest_bound = _solve(rest_joined, bound_s * rest_joined.num_nodes, settings)
        rest_hint = np.asarray(rest_bound.solution[:len(rest)], dtype=np.int64)
        rest_memory = score(rest_part, rest_hint).peak_usage if len(rest) else 0
        if _picked_memory(plans, [[0] * len(k.kind.layers) for k in plans]) + rest_memory > budget:
            for plan in plans:
                _extend_frontier(plan, settings)
    layer_budget = budget - rest_memory
    for attempt in range(MEMORY_RETRIES):
        with phases.phase("solve"):
            picks = _pick_points(plans, layer_budget)
            if picks is None:
                raise InfeasibleError(_too_big(plans, rest_memory, budget))
            solution = _layer_solution(plans, picks, formulation.problem.num_nodes)
            rest_limit = max(layer_budget + rest_memory - _picked_memory(plans, picks), 0)
            _solve_rest(parts, rest, rest_hint, solution, plan_s / 2, settings, rest_limit)
            if attempt == 0 and _refine_kinds(parts, plans, picks, solution, settings):
                solution = _layer_solution(plans, picks, formulation.problem.num_nodes, rest, solution[rest])
                _solve_rest(parts, rest, solution[rest], solution, plan_s / 2, settings,
                            max(budget - _picked_memory(plans, picks), 0))
        with phases.phase("pricing"):
            plan = formulation.plan(solution)
            validate_plan(plan)
            # each value delivered as `estimate` delivers it: the objective is the report's price
            final = formulation.solution(plan, delivered_shardings(plan, hw.collective_seconds))
            objective = score(formulation.problem, final).cost
            report = estimate(plan, hw)
        if report.peak_memory_bytes <= budget:
            break
        if attempt == 0 and len(plans[0].frontier) == 1:
            with phases.phase("solve"):
                for kind_plan in plans:
                    _extend_frontier(kind_plan, settings)
        layer_budget -= int(report.peak_memory_bytes - budget)
    else:
        raise InfeasibleError(f"the composed plan needs {size(report.peak_memory_bytes)} per device, over the budget "
                              f"{size(budget)}, after {MEMORY_RETRIES} tries with tighter layer plans; plan the whole "
                              f"graph instead (without --layer-once)")
    with phases.phase("pricing"):
        shares = _shares(formulation.problem, final, layer_of)
        lower = min(sum(p.lower_bound_ps for p in plans) + int(rest_bound.lower_bound), objective)
    gap = (objective - lower) / objective if objective > 0 else 0.0
    solver = _summary(plans, picks, formulation.problem, objective, lower, gap, shares,
                      formulated - started, time.perf_counter() - formulated, budget)
    return PlanResult(plan, report, solver, phases)


def _beside_rest(formulation: Formulation, parts: Parts, layer_of: np.ndarray) -> set[int]:
    """The layers next to the rest: joined by an edge to one of its ops or to the delivered node
    of a value one of them produces (the stored tensors every layer reads, such as the
    optimizer's scalars, and their delivered nodes do not count)."""
    producers = formulation.graph.producers
    produced = np.array([kind == "op" or (kind == "delivered" and name in producers)
                         for kind, name in formulation.nodes])
    u, v = parts.sources, parts.targets
    found = set()
    for a, b in ((u, v), (v, u)):
        crossing = (layer_of[a] < 0) & produced[a] & (layer_of[b] >= 0)
        found.update(int(layer) for layer in np.unique(layer_of[b][crossing]))
    return found


def _solve(problem: Problem, time_s: float, settings: SolveSettings, hint: Any = None) -> Any:
    return solve(problem, time_limit_s=max(time_s, 0.1), workers=settings.workers, seed=settings.seed, hint=hint,
                 deterministic=settings.deterministic, gap_limit=settings.gap_limit)


def _wrap_edges(parts: Parts, kind: Kind) -> tuple[dict[int, np.ndarray], list[tuple[int, int, np.ndarray]]]:
    """The edges between two layers of `kind`, each distinct one once, as terms on the
    representative's nodes (canonical positions): an edge, or a unary term when both ends are
    one position."""
    n = parts.whole.num_nodes
    member, position = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    for j, layer in enumerate(kind.layers):
        member[layer.nodes], position[layer.nodes] = j, np.arange(len(layer.nodes))
    u, v = parts.sources, parts.targets
    crossing = np.flatnonzero((member[u] >= 0) & (member[v] >= 0) & (member[u] != member[v]))
    found: dict[tuple[int, int, int], np.ndarray] = {}
    for e in crossing:
        matrix = parts.whole.edge_costs[e]
        found.setdefault((int(position[u[e]]), int(position[v[e]]), id(matrix)), matrix)
    unary: dict[int, np.ndarray] = {}
    edges = []
    for (a, b, _), matrix in sorted(found.items(), key=lambda item: item[0][:2]):
        if a == b:
            unary[a] = unary.get(a, 0) + np.diagonal(matrix)
        else:
            edges.append((a, b, matrix))
    return unary, edges


def _chains(parts: Parts, kind: Kind, beside: set[int]) -> list[tuple[Problem, int]]:
    """The bound problems of the kind's layers not beside the rest: chains of `_chain_length`
    consecutive ones, each with its readings from outside (`Parts.joined`), no memory limit;
    chains that are one problem appear once per chain, as the same object. Each with its number
    of layers (its first nodes, layer after layer)."""
    away = [layer for layer in kind.layers if layer.layer not in beside]
    distinct: dict[tuple, Problem] = {}
    found = []
    length = _chain_length(len(away))
    for start in range(0, len(away), length):
        chain = away[start:start + length]
        problem, key = parts.joined(np.concatenate([layer.nodes for layer in chain]))
        found.append((distinct.setdefault(key, problem), len(chain)))
    return found


def _chain_length(layers: int) -> int:
    """Layers per chain: the most, up to `CHAIN_LAYERS`, that cut `layers` into equal chains (one
    problem to bound, all the bound's time on it), if that is at least `MIN_CHAIN_LAYERS`."""
    fits = [n for n in range(MIN_CHAIN_LAYERS, CHAIN_LAYERS + 1) if layers % n == 0]
    return fits[-1] if fits else min(CHAIN_LAYERS, max(layers, 1))


def _solve_kind(parts: Parts, kind: Kind, chains: list[tuple[Problem, int]], step_phases: dict[str, str], bound_s_per_node: float,
                time_s: float, settings: SolveSettings) -> KindPlan:
    """The kind's fastest plan (with the reshardings between consecutive layers; half of
    `time_s`, the other half is its second solve's) and its share of the certified bound: one
    solve per distinct chain."""
    bounds: dict[int, int] = {}
    width = len(kind.layers[0].nodes)
    seen: list[np.ndarray] = []  # each layer's plan in the chains' solutions
    for problem, layers in chains:
        if id(problem) not in bounds:
            found = _solve(problem, bound_s_per_node * problem.num_nodes, settings)
            bounds[id(problem)] = int(found.lower_bound)
            seen += list(np.asarray(found.solution[:layers * width], dtype=np.int64).reshape(layers, width))
    representative = kind.layers[0]
    part = parts.part(representative.nodes)
    wrap = _wrap_edges(parts, kind)
    steady = with_terms(part, *wrap, None)
    # the chains' solvers plan whole stacks of the kind: their best layer starts the steady solve
    hint = min(seen, key=lambda x: score(steady, x).cost) if seen else None
    fastest = _solve(steady, time_s / 2, settings, hint=hint).solution
    if hint is not None and score(steady, hint).cost < score(steady, fastest).cost:
        fastest = hint
    forward = [q for q, name in enumerate(representative.part.ops) if step_phases[name] == "forward"]
    turn = int(part.intervals[forward[-1], 0]) if forward else -1
    return KindPlan(kind, part, wrap, sum(bounds[id(problem)] for problem, _ in chains), turn, time_s / 2,
                    [_point(part, steady, turn, fastest)])


def _point(part: Problem, steady: Problem, turn: int, solution: tuple[int, ...]) -> FrontierPoint:
    own = score(part, solution)
    held = usage_profile(part, np.asarray(solution, dtype=np.int64))
    return FrontierPoint(tuple(int(s) for s in solution), own.cost, score(steady, solution).cost - own.cost,
                         int(held[turn]) if turn >= 0 else own.peak_usage, own.peak_usage)


def _extend_frontier(kind_plan: KindPlan, settings: SolveSettings) -> None:
    """Add plans of the kind solved under tighter memory limits (each kept if it holds less)."""
    if len(kind_plan.frontier) > 1:
        return
    steady = with_terms(kind_plan.part, *kind_plan.wrap, None)
    for share in FRONTIER_SHARES:
        limited = with_terms(kind_plan.part, *kind_plan.wrap, int(share * kind_plan.frontier[0].memory_bytes))
        found = _solve(limited, kind_plan.solve_s / len(FRONTIER_SHARES), settings)
        if found.feasible:
            point = _point(kind_plan.part, steady, kind_plan.turn, found.solution)
            if point.memory_bytes < kind_plan.frontier[-1].memory_bytes:
                kind_plan.frontier.append(point)


def _pick_points(plans: list[KindPlan], budget: int) -> list[list[int]] | None:
    """Per kind, per layer, the frontier point to use: least summed cost (own and boundary) with
    the memory model (module docstring) within `budget`, by a knapsack over layers with memory rounded up to
    `MEMORY_BUCKETS` steps of the budget; None when nothing fits. Within a kind the faster points
    go to the first layers, so equal points sit next to each other."""
    budget -= max(kind_plan.transient_bytes() for kind_plan in plans)
    if budget <= 0:
        return None
    unit = budget / MEMORY_BUCKETS
    unreachable = np.iinfo(np.int64).max // 4
    best = np.full(MEMORY_BUCKETS + 1, unreachable, dtype=np.int64)
    best[0] = 0
    layers = [(i, kind_plan) for i, kind_plan in enumerate(plans) for _ in kind_plan.kind.layers]
    steps = [[math.ceil(p.memory_bytes / unit) for p in kind_plan.frontier] for kind_plan in plans]
    picked = []
    for i, kind_plan in layers:
        new = np.full_like(best, unreachable)
        pick = np.full(best.shape, -1)
        for c, point in enumerate(kind_plan.frontier):
            step = steps[i][c]
            if step > MEMORY_BUCKETS:
                continue
            shifted = np.full_like(best, unreachable)
            shifted[step:] = best[:len(best) - step] + (point.cost_ps + point.boundary_ps)
            better = shifted < new
            new[better], pick[better] = shifted[better], c
        picked.append(pick)
        best = new
    at = int(np.argmin(best))
    if best[at] >= unreachable:
        return None
    chosen: list[list[int]] = [[] for _ in plans]
    for (i, _), pick in zip(reversed(layers), reversed(picked)):
        c = int(pick[at])
        chosen[i].append(c)
        at -= steps[i][c]
    return [sorted(c) for c in chosen]


def _picked_memory(plans: list[KindPlan], picks: list[list[int]]) -> int:
    """The layers' memory in the knapsack's model: what each keeps from forward to backward, and
    the largest transient on top."""
    return (sum(kind_plan.frontier[c].memory_bytes for kind_plan, chosen in zip(plans, picks) for c in chosen)
            + max(kind_plan.transient_bytes() for kind_plan in plans))


def _layer_solution(plans: list[KindPlan], picks: list[list[int]], num_nodes: int,
                    rest: np.ndarray | None = None, rest_solution: np.ndarray | None = None) -> np.ndarray:
    """A whole solution with every layer at its chosen frontier point (and the rest's nodes at
    `rest_solution`, or -1)."""
    solution = np.full(num_nodes, -1, dtype=np.int64)
    for kind_plan, chosen in zip(plans, picks):
        for layer, c in zip(kind_plan.kind.layers, chosen):
            solution[layer.nodes] = kind_plan.frontier[c].solution
    if rest is not None:
        solution[rest] = rest_solution
    return solution


def _solve_rest(parts: Parts, rest: np.ndarray, hint: np.ndarray, solution: np.ndarray, time_s: float,
                settings: SolveSettings, limit_bytes: int) -> None:
    """The rest's plan with the layers fixed at `solution` (the edges to them costs on the rest's
    nodes), written into `solution`."""
    if len(rest) == 0:
        return
    problem = parts.part(rest)
    unary = parts.fixed_terms(rest, solution)
    found = _solve(with_terms(problem, unary, [], limit_bytes), time_s, settings, hint=hint)
    if not found.feasible:  # the composed plan's peak is checked against the budget after
        found = _solve(with_terms(problem, unary, [], None), time_s, settings, hint=hint)
    solution[rest] = found.solution


def _refine_kinds(parts: Parts, plans: list[KindPlan], picks: list[list[int]], solution: np.ndarray,
                  settings: SolveSettings) -> bool:
    """One round of `_refine_kind` over the kinds all of whose layers take the fastest plan,
    `solution` updated as each changes; whether any did."""
    changed = False
    for kind_plan, chosen in zip(plans, picks):
        if set(chosen) == {0} and _refine_kind(parts, kind_plan, solution, settings):
            changed = True
            for layer in kind_plan.kind.layers:
                solution[layer.nodes] = kind_plan.frontier[0].solution
    return changed


def _refine_kind(parts: Parts, kind_plan: KindPlan, solution: np.ndarray, settings: SolveSettings) -> bool:
    """Solve the kind's fastest plan again with every other layer and the rest fixed at
    `solution` (their edges with the kind's layers shared out per layer); keep it if it costs less
    on that problem. A kind solved alone does not know its neighbours: an MLP's first and last
    layers, kinds of their own, took tensor-parallel plans whose boundaries cost 30 times the step."""
    layers = kind_plan.kind.layers
    width = len(layers[0].nodes)
    unary = dict(kind_plan.wrap[0])
    summed: dict[int, np.ndarray] = {}
    for node, terms in parts.fixed_terms(np.concatenate([layer.nodes for layer in layers]), solution).items():
        summed[node % width] = summed[node % width] + terms if node % width in summed else terms
    for node, terms in summed.items():
        unary[node] = unary.get(node, 0) + np.round(terms / len(layers)).astype(np.int64)
    problem = with_terms(kind_plan.part, unary, kind_plan.wrap[1], None)
    current = kind_plan.frontier[0].solution
    found = _solve(problem, kind_plan.solve_s, settings, hint=current)
    if score(problem, found.solution).cost >= score(problem, current).cost:
        return False
    kind_plan.frontier[0] = _point(kind_plan.part, with_terms(kind_plan.part, *kind_plan.wrap, None), kind_plan.turn,
                                   found.solution)
    return True


def _shares(problem: Problem, x: list[int], layer_of: np.ndarray) -> dict[str, int]:
    """The objective of whole solution `x` split into the layers' own nodes and edges, the
    rest's, and the edges between parts."""
    node = np.array([int(c[s]) for c, s in zip(problem.node_costs, x)], dtype=np.int64)
    edge = np.array([int(m[x[u], x[v]]) for m, (u, v) in zip(problem.edge_costs, problem.edges.tolist())],
                    dtype=np.int64)
    home_u, home_v = layer_of[problem.edges[:, 0]], layer_of[problem.edges[:, 1]]
    inner = home_u == home_v
    return {"layer_ps": int(node[layer_of >= 0].sum() + edge[inner & (home_u >= 0)].sum()),
            "rest_ps": int(node[layer_of < 0].sum() + edge[inner & (home_u < 0)].sum()),
            "boundary_ps": int(edge[~inner].sum())}


def _too_big(plans: list[KindPlan], rest_bytes: int, budget: int) -> str:
    least = (sum(len(p.kind.layers) * min(point.memory_bytes for point in p.frontier) for p in plans)
             + max(p.transient_bytes() for p in plans))
    return (f"the layers' least-memory plans need {size(least)} per device together and the ops outside them "
            f"{size(rest_bytes)}, over the memory budget {size(budget)}; plan the whole graph instead "
            f"(without --layer-once), or raise the budget")


def _summary(plans: list[KindPlan], picks: list[list[int]], whole: Problem, objective: int, lower: int, gap: float,
             shares: dict[str, int], formulate_s: float, solve_s: float, budget: int) -> dict[str, Any]:
    """The plan document's `solver` section, with `composition`: how the plan was composed."""
    return {
        "status": "optimal" if lower >= objective else "feasible",
        "objective_ps": objective,
        "objective_s": objective / PICOSECONDS,
        "lower_bound_ps": lower,
        "gap": gap,
        "formulate_s": formulate_s,
        "solve_s": solve_s,
        "first_feasible_s": None,
        "problem": {"nodes": whole.num_nodes, "edges": whole.num_edges,
                    "strategies": int(np.sum(whole.num_strategies()))},
        "memory_budget_bytes": budget,
        "composition": {
            "method": "layer-once",
            "kinds": len(plans),
            "layers": sum(len(p.kind.layers) for p in plans),
            **shares,
            "per_kind": [{"signature": p.kind.signature, "layers": list(p.kind.numbers),
                          "lower_bound_ps": p.lower_bound_ps,
                          "frontier": [{"cost_ps": f.cost_ps, "boundary_ps": f.boundary_ps,
                                        "memory_bytes": f.memory_bytes, "peak_bytes": f.peak_bytes,
                                        "layers": chosen.count(c)}
                                       for c, f in enumerate(p.frontier)]}
                         for p, chosen in zip(plans, picks)],
        },
    }

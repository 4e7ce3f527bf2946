"""A layer solved once: plan a graph of repeated layers from one solve per layer kind.

Each kind (`layer_kinds`) is formulated and solved once, on its representative's part
(`parts.part_problem`), with the reshardings between two consecutive layers of the kind added as
edges from the representative to itself (the steady state of a stack of identical layers). Its
frontier holds the fastest plan and, when the fastest plans of all layers do not fit the memory
budget together, plans solved under tighter memory limits. A knapsack over layers picks one
frontier point per layer. Its memory model: each layer keeps what its own nodes hold when its
forward ends (its state and saved activations) until its backward, and on top of all of them the
largest transient of one layer; the ops outside every layer (embedding, head, loss and their
backward and optimizer ops) are then solved with the layers fixed, the reshardings to and from
them priced on their own nodes. Each kind is then solved once more with everything else fixed
(its reshardings with other kinds and the rest shared out per layer), and the rest after it. The
result is an ordinary `Plan`, priced and checked against the budget by `estimate`. The time limit
is shared out: four fifths to the kinds (per kind: half to its bound, a quarter to its fastest
plan, a quarter to the second solve, and a quarter more to tighter frontier points when memory
binds), the rest to the rest's bound and plan.

The certified bound. Split the whole formulation's nodes into parts: the rest joined with the
layers beside it, and the other layers of each kind in chains of consecutive ones (a layer's
nodes: its ops and the stored tensors only it reads). The whole objective of any plan is the sum
over parts of their own node and edge costs plus the costs of the edges between parts. Charge
each edge between parts to its reader's part, as an edge from a free copy of the node it reads
(that node's strategies at no cost; `joined_parts`): for any plan, the copy taking the node's
strategy in the plan gives the edge its cost in the plan, so the part's joined problem has a
solution costing at most the part's share of the plan. Each part's own costs are those of its
problem (same nodes, same strategies, same matrices), and dropping the memory limit only lowers
its least cost. So the sum over parts of a certified lower bound of each joined problem without
a memory limit (the solver's bound; one solve per distinct chain) is a certified lower bound of
the whole graph. It holds for every plan within memory, so it bounds the whole-graph optimum; it is weaker
than a whole-graph bound by the reshardings between layers and by the memory limit when that
binds.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from autoshard.errors import InfeasibleError, InputError
from autoshard.graph.model import Graph
from autoshard.graph.summary import size
from autoshard.mesh import Mesh
from autoshard.phases import PhaseTimes
from autoshard.planning.costs import Hardware
from autoshard.planning.formulation import PICOSECONDS, ReshardingPrices, Weights
from autoshard.planning.joined_parts import Piece, Use, joined_problem, layer_piece, uses_of
from autoshard.planning.layer_kinds import LayerKind, LayerPart, layer_kinds
from autoshard.planning.make_plan import PlanResult, SolveSettings
from autoshard.planning.parts import (PartProblem, part_problem, picoseconds, price_table, produced_by_choice,
                                      required_by_choice, with_terms)
from autoshard.planning.plan import Plan, validate_plan
from autoshard.planning.report import estimate
from autoshard.solver import Problem, score, solve
from autoshard.solver.problem import usage_profile

# Memory limits of a kind's further frontier points, as shares of its fastest plan's peak.
FRONTIER_SHARES = (0.7, 0.45)
KIND_SHARE = 0.8  # of the time limit, for the layer kinds (the rest: the ops outside the layers)
MEMORY_BUCKETS = 1024  # the knapsack's memory resolution: budget / buckets per step, rounded up
MEMORY_RETRIES = 3
# Consecutive layers of a kind bounded together: the bound misses the reshardings between chains
# only. On the 3-D 1.3B training step a layer's bound was 4.5% under its cost in pairs, 1.2% in
# chains of 8, 0.6% in chains of 16 (a chain of 16 is solved in seconds).
CHAIN_LAYERS = 16


@dataclass(frozen=True)
class FrontierPoint:
    solution: tuple[int, ...]  # per node of the kind's part problem
    cost_ps: int  # the layer's own nodes and edges
    boundary_ps: int  # reshardings from the layer before of the kind (steady state, estimated)
    memory_bytes: int  # what the layer's own nodes hold when its forward ends (state and saved activations)
    peak_bytes: int  # the most they hold at once


@dataclass
class KindPlan:
    kind: LayerKind
    part: PartProblem
    wrap: tuple[dict[int, np.ndarray], list[tuple[int, int, np.ndarray]]]  # terms from the representative to itself
    lower_bound_ps: int  # its layers' share of the certified bound (those beside the rest are in the rest's)
    turn: int  # the step of the part at which its forward ends
    frontier: list[FrontierPoint]

    def transient_bytes(self) -> int:
        """The most a layer holds on top of what it keeps from its forward to its backward."""
        return max(point.peak_bytes - point.memory_bytes for point in self.frontier)


def plan_layer_once(graph: Graph, mesh: Mesh, hw: Hardware, settings: SolveSettings = SolveSettings(),
                    phases: PhaseTimes | None = None) -> PlanResult:
    """Plan `graph` by solving each layer kind once and composing (module docstring)."""
    phases = PhaseTimes() if phases is None else phases
    started = time.perf_counter()
    kinds = layer_kinds(graph)
    if not kinds:
        raise InputError("the graph declares no layers (no op has a `layer`); planning layer by layer needs them",
                         "/ops")
    budget = int(settings.memory_budget_bytes if settings.memory_budget_bytes is not None else hw.hbm_bytes)
    weights, prices = settings.weights, ReshardingPrices(mesh, hw.collective_seconds)
    home = _homes(graph, kinds)
    rest_ops = [op.name for op in graph.order if home[("op", op.name)] == -1]
    rest_owned = frozenset(t for t, tensor in graph.tensors.items()
                           if tensor.role != "intermediate" and home[("storage", t)] == -1)
    rest_tensors = list(dict.fromkeys([t for n in rest_ops for t in graph.op_by_name[n].operands]
                                      + [graph.tensors[t].updates for n in rest_ops for t in graph.op_by_name[n].outputs
                                         if graph.tensors[t].updates] + sorted(rest_owned)))
    with phases.phase("formulate"):
        parts = [part_problem(graph, k.parts[0].ops, k.parts[0].tensors, k.parts[0].owned, mesh, hw, weights,
                              settings.mesh_order_splits) for k in kinds]
        rest = part_problem(graph, rest_ops, rest_tensors, rest_owned, mesh, hw, weights, settings.mesh_order_splits)
        wraps = [_wrap_edges(graph, k, p, prices, weights) for k, p in zip(kinds, parts)]
        uses = uses_of(graph)
        beside = _beside_rest(uses, home)
        outside = {key: (rest, node) for key, node in rest.node_of.items()}
        for k, p in zip(kinds, parts):
            for layer in k.parts:
                outside.update((key, (p, node)) for key, node in layer_piece(p, k.parts[0], layer).nodes.items())
        pieces = [Piece(rest, rest.node_of)] + [layer_piece(p, k.parts[0], layer) for k, p in zip(kinds, parts)
                                                for layer in k.parts if layer.layer in beside]
        rest_joined = joined_problem(graph, pieces, uses, prices, weights, outside)
    formulated = time.perf_counter()
    kind_s = settings.time_limit_s * KIND_SHARE / len(kinds)
    rest_s = settings.time_limit_s - kind_s * len(kinds)
    with phases.phase("solve"):
        between: dict[tuple[int, int], list[Use]] = {}
        for use in uses:
            if home[use.source] != home[use.target]:
                between.setdefault((home[use.source], home[use.target]), []).append(use)
        step_phases = graph.phases
        plans = [_solve_kind(graph, step_phases, k, p, w, beside, uses, between, outside, prices, weights, kind_s,
                             settings)
                 for k, p, w in zip(kinds, parts, wraps)]
        rest_bound = _solve(rest_joined, rest_s / 2, settings)
        rest_hint = rest_bound.solution[:rest.problem.num_nodes]
        rest_memory = score(rest.problem, rest_hint).peak_usage if rest.problem.num_nodes else 0
        if _picked_memory(plans, [[0] * len(k.parts) for k in kinds]) + rest_memory > budget:
            for plan in plans:
                _extend_frontier(plan, kind_s, settings)
    layer_budget = budget - rest_memory
    for attempt in range(MEMORY_RETRIES):
        with phases.phase("solve"):
            picks = _pick_points(plans, layer_budget)
            if picks is None:
                raise InfeasibleError(_too_big(plans, rest_memory, budget))
            options, storage = _layer_choices(graph, plans, picks)
            rest_solution = _solve_rest(graph, mesh, rest, rest_hint, options, storage, uses, prices,
                                        weights, rest_s / 2, settings, max(layer_budget + rest_memory
                                                                           - _picked_memory(plans, picks), 0))
            _rest_choices(rest, rest_solution, options, storage)
            if attempt == 0 and _refine_kinds(graph, mesh, plans, picks, options, storage, uses, prices, weights,
                                              kind_s / 4, settings):
                rest_solution = _solve_rest(graph, mesh, rest, rest_solution, options, storage, uses, prices,
                                            weights, rest_s / 2, settings,
                                            max(budget - _picked_memory(plans, picks), 0))
                _rest_choices(rest, rest_solution, options, storage)
        with phases.phase("pricing"):
            plan = Plan(graph, mesh, options, storage)
            validate_plan(plan)
            report = estimate(plan, hw)
        if report.peak_memory_bytes <= budget:
            break
        if attempt == 0 and len(plans[0].frontier) == 1:
            with phases.phase("solve"):
                for kind_plan in plans:
                    _extend_frontier(kind_plan, kind_s, settings)
        layer_budget -= int(report.peak_memory_bytes - budget)
    else:
        raise InfeasibleError(f"the composed plan needs {size(report.peak_memory_bytes)} per device, over the budget "
                              f"{size(budget)}, after {MEMORY_RETRIES} tries with tighter layer plans; plan the whole "
                              f"graph instead (without --layer-once)")
    with phases.phase("pricing"):
        boundary_ps = sum(_use_price(plan, u, prices, weights) for u in uses if home[u.source] != home[u.target])
        own_ps = sum(kind_plan.frontier[c].cost_ps for kind_plan, chosen in zip(plans, picks) for c in chosen)
        rest_ps = score(rest.problem, rest_solution).cost if rest.problem.num_nodes else 0
        objective = own_ps + rest_ps + boundary_ps
        lower = min(sum(p.lower_bound_ps for p in plans) + rest_bound.lower_bound, objective)
    gap = (objective - lower) / objective if objective > 0 else 0.0
    solver = _summary(kinds, plans, picks, rest, objective, lower, gap, own_ps, rest_ps, boundary_ps,
                      formulated - started, time.perf_counter() - formulated, budget)
    return PlanResult(plan, report, solver, phases)


def _homes(graph: Graph, kinds: list[LayerKind]) -> dict[tuple[str, str], int]:
    """Per formulation node (("op", name) or ("storage", tensor)): the layer it belongs to, -1 for
    the rest."""
    home: dict[tuple[str, str], int] = {("op", op.name): -1 for op in graph.ops}
    home.update((("storage", t), -1) for t, tensor in graph.tensors.items() if tensor.role != "intermediate")
    for kind in kinds:
        for part in kind.parts:
            home.update((("op", name), part.layer) for name in part.ops)
            home.update((("storage", t), part.layer) for t in part.owned)
    return home


def _beside_rest(uses: list[Use], home: dict[tuple[str, str], int]) -> set[int]:
    """The layers next to the rest: reading what its ops produce, or producing what they read (the
    stored tensors every layer reads, such as the optimizer's scalars, do not count)."""
    found = set()
    for use in uses:
        ends = (home[use.source], home[use.target])
        if ends.count(-1) == 1 and (use.source if ends[0] == -1 else use.target)[0] == "op":
            found.add(max(ends))
    return found


def _use_price(plan: Plan, use: Use, prices: ReshardingPrices, weights: Weights) -> int:
    source = plan.produced(use.tensor)
    target = plan.storage[use.target[1]] if use.index < 0 else plan.required(plan.graph.op_by_name[use.target[1]],
                                                                            use.index)
    tensor = plan.graph.tensors[use.tensor]
    seconds, comm = prices(tensor.shape, tensor.itemsize, source, target)
    return int(picoseconds(seconds, comm, weights))


def _wrap_edges(graph: Graph, kind: LayerKind, part: PartProblem, prices: ReshardingPrices,
                weights: Weights) -> tuple[dict[int, np.ndarray], list[tuple[int, int, np.ndarray]]]:
    """The reshardings between consecutive layers of `kind` (a layer reading what the one before
    or after produced), each once, as terms on the representative's nodes: an edge from the
    producing op's node to the reading op's node, or a unary term when they are one node."""
    position = {name: (j, i) for j, p in enumerate(kind.parts) for i, name in enumerate(p.ops)}
    found: set[tuple[int, int, int, int]] = set()
    for j, p in enumerate(kind.parts):
        for q, name in enumerate(p.ops):
            for a, t in enumerate(graph.op_by_name[name].inputs):
                producer = graph.producers.get(t)
                where = position.get(producer.name) if producer is not None else None
                if where is not None and where[0] != j:
                    found.add((where[1], producer.outputs.index(t), q, a))
    rep = kind.parts[0].ops
    unary: dict[int, np.ndarray] = {}
    edges = []
    for p, b, q, a in sorted(found):
        u, v = part.node_of[("op", rep[p])], part.node_of[("op", rep[q])]
        tensor = graph.op_by_name[rep[p]].outputs[b]
        matrix = price_table(prices, graph.tensors[tensor],
                             produced_by_choice(graph, ("op", rep[p]), tensor, part.choices(u)),
                             required_by_choice(graph, rep[q], a, part.choices(v)), weights)
        if u == v:
            unary[u] = unary.get(u, 0) + np.diagonal(matrix)
        else:
            edges.append((u, v, matrix))
    return unary, edges


def _solve(problem: Problem, time_s: float, settings: SolveSettings, hint: Any = None) -> Any:
    return solve(problem, time_limit_s=max(time_s, 0.1), workers=settings.workers, seed=settings.seed, hint=hint,
                 deterministic=settings.deterministic, gap_limit=settings.gap_limit)


def _solve_kind(graph: Graph, phases: dict[str, str], kind: LayerKind, part: PartProblem,
                wrap: tuple[dict[int, np.ndarray], list], beside: set[int], uses: list[Use],
                between: dict[tuple[int, int], list[Use]],
                outside: dict[tuple[str, str], tuple[PartProblem, int]], prices: ReshardingPrices, weights: Weights,
                time_s: float, settings: SolveSettings) -> KindPlan:
    """The kind's fastest plan (with the reshardings between consecutive layers) and its share of
    the certified bound: its layers not beside the rest in chains of `CHAIN_LAYERS` consecutive
    ones, each with the reshardings inside it and its readings from outside (`joined_problem`), no
    memory limit; one solve per distinct chain."""
    rest_of_kind = [layer for layer in kind.parts if layer.layer not in beside]
    groups: dict[tuple, list[list[LayerPart]]] = {}
    for start in range(0, len(rest_of_kind), CHAIN_LAYERS):
        chain = rest_of_kind[start:start + CHAIN_LAYERS]
        key = tuple(_edges_between(kind.parts[0], part, a, b, between) for a, b in zip(chain, chain[1:]))
        groups.setdefault((len(chain), key), []).append(chain)
    bound = 0
    for chains in groups.values():
        pieces = [layer_piece(part, kind.parts[0], layer) for layer in chains[0]]
        joined = joined_problem(graph, pieces, uses, prices, weights, outside)
        bound += len(chains) * _solve(joined, time_s / 2 / len(groups), settings).lower_bound
    steady = with_terms(part.problem, *wrap, None)
    fastest = _solve(steady, time_s / 4, settings)
    forward = [name for name in kind.parts[0].ops if phases[name] == "forward"]
    turn = int(part.problem.intervals[part.node_of[("op", forward[-1])], 0]) if forward else -1
    return KindPlan(kind, part, wrap, bound, turn, [_point(part, steady, turn, fastest.solution)])


def _edges_between(representative: LayerPart, part: PartProblem, first: LayerPart, second: LayerPart,
                   between: dict[tuple[int, int], list[Use]]) -> frozenset:
    """The edges between two layers of a kind, in the representative's nodes: chains with the same
    edges between their layers have the same bound."""
    side = {}
    for index, layer in enumerate((first, second)):
        side.update((key, (index, node)) for key, node in layer_piece(part, representative, layer).nodes.items())
    uses = between.get((first.layer, second.layer), []) + between.get((second.layer, first.layer), [])
    return frozenset((side[u.source], side[u.target], u.index) for u in uses)


def _point(part: PartProblem, steady: Problem, turn: int, solution: tuple[int, ...]) -> FrontierPoint:
    own = score(part.problem, solution)
    held = usage_profile(part.problem, np.asarray(solution, dtype=np.int64))
    return FrontierPoint(tuple(solution), own.cost, score(steady, solution).cost - own.cost,
                         int(held[turn]) if turn >= 0 else own.peak_usage, own.peak_usage)


def _extend_frontier(kind_plan: KindPlan, time_s: float, settings: SolveSettings) -> None:
    """Add plans of the kind solved under tighter memory limits (each kept if it holds less)."""
    if len(kind_plan.frontier) > 1:
        return
    part = kind_plan.part
    steady = with_terms(part.problem, *kind_plan.wrap, None)
    for share in FRONTIER_SHARES:
        limited = with_terms(part.problem, *kind_plan.wrap, int(share * kind_plan.frontier[0].memory_bytes))
        found = _solve(limited, time_s / 4 / len(FRONTIER_SHARES), settings)
        if found.feasible:
            point = _point(part, steady, kind_plan.turn, found.solution)
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
    layers = [(i, kind_plan) for i, kind_plan in enumerate(plans) for _ in kind_plan.kind.parts]
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


def _layer_choices(graph: Graph, plans: list[KindPlan], picks: list[list[int]]) -> tuple[dict, dict]:
    """Every layer op's option and every layer-owned tensor's storage, from its kind's
    representative at the chosen frontier point (ops and tensors matched by canonical position)."""
    options: dict = {}
    storage: dict = {}
    for kind_plan, chosen in zip(plans, picks):
        rep, part = kind_plan.kind.parts[0], kind_plan.part
        for layer, c in zip(kind_plan.kind.parts, chosen):
            solution = kind_plan.frontier[c].solution
            for name, rep_name in zip(layer.ops, rep.ops):
                node = part.node_of[("op", rep_name)]
                options[name] = part.choices(node)[solution[node]]
            for t, rep_t in zip(layer.tensors, rep.tensors):
                if t in layer.owned:
                    node = part.node_of[("storage", rep_t)]
                    storage[t] = part.choices(node)[solution[node]]
    return options, storage


def _solve_rest(graph: Graph, mesh: Mesh, rest: PartProblem, hint: tuple[int, ...], options: dict, storage: dict,
                uses: list[Use], prices: ReshardingPrices, weights: Weights, time_s: float,
                settings: SolveSettings, limit_bytes: int) -> tuple[int, ...]:
    """The rest's plan with the layers fixed: each resharding to or from a layer is a cost on the
    rest's node at its end."""
    if rest.problem.num_nodes == 0:
        return ()
    unary = _fixed_terms(graph, Plan(graph, mesh, options, storage), rest.node_of, rest.choices, uses, prices,
                         weights)
    found = _solve(with_terms(rest.problem, unary, [], limit_bytes), time_s, settings, hint=hint)
    if not found.feasible:  # the composed plan's peak is checked against the budget after
        found = _solve(with_terms(rest.problem, unary, [], None), time_s, settings, hint=hint)
    return found.solution


def _refine_kinds(graph: Graph, mesh: Mesh, plans: list[KindPlan], picks: list[list[int]], options: dict,
                  storage: dict, uses: list[Use], prices: ReshardingPrices, weights: Weights, time_s: float,
                  settings: SolveSettings) -> bool:
    """One round of `_refine_kind` over the kinds all of whose layers take the fastest plan,
    `options` and `storage` updated as each changes; whether any did."""
    changed = False
    for kind_plan, chosen in zip(plans, picks):
        if set(chosen) == {0} and _refine_kind(graph, mesh, kind_plan, options, storage, uses, prices, weights,
                                               time_s, settings):
            changed = True
            layer_options, layer_storage = _layer_choices(graph, plans, picks)
            options.update(layer_options)
            storage.update(layer_storage)
    return changed


def _fixed_terms(graph: Graph, fixed: Plan, nodes: dict[tuple[str, str], int], choices: Callable[[int], list],
                 uses: list[Use], prices: ReshardingPrices, weights: Weights) -> dict[int, np.ndarray]:
    """Per problem node (`nodes`: whole-graph node -> problem node, several may share one), the
    reshardings of its edges to nodes outside `nodes`, whose shardings `fixed` gives, by strategy."""
    unary: dict[int, np.ndarray] = {}
    for use in uses:
        source, target = nodes.get(use.source), nodes.get(use.target)
        if (source is None) == (target is None):
            continue  # inside (its own edge), or not touching
        tensor = graph.tensors[use.tensor]
        if target is not None:
            targets = choices(target)
            if use.index >= 0:
                targets = required_by_choice(graph, use.target[1], use.index, targets)
            terms = price_table(prices, tensor, [fixed.produced(use.tensor)], targets, weights)[0]
            node = target
        else:
            wanted = (fixed.storage[use.target[1]] if use.index < 0
                      else fixed.required(graph.op_by_name[use.target[1]], use.index))
            sources = produced_by_choice(graph, use.source, use.tensor, choices(source))
            terms = price_table(prices, tensor, sources, [wanted], weights)[:, 0]
            node = source
        unary[node] = unary.get(node, 0) + terms
    return unary


def _refine_kind(graph: Graph, mesh: Mesh, kind_plan: KindPlan, options: dict, storage: dict, uses: list[Use],
                 prices: ReshardingPrices, weights: Weights, time_s: float, settings: SolveSettings) -> bool:
    """Solve the kind's fastest plan again with every other layer and the rest fixed as composed
    (their reshardings with the kind's layers shared out per layer); keep it if it costs less on
    that problem. A kind solved alone does not know its neighbours: an MLP's first and last layers,
    kinds of their own, took tensor-parallel plans whose boundaries cost 30 times the step."""
    kind, part = kind_plan.kind, kind_plan.part
    nodes: dict[tuple[str, str], int] = {}
    for layer in kind.parts:
        nodes.update(layer_piece(part, kind.parts[0], layer).nodes)
    unary = dict(kind_plan.wrap[0])
    for node, terms in _fixed_terms(graph, Plan(graph, mesh, options, storage), nodes, part.choices, uses, prices,
                                    weights).items():
        unary[node] = unary.get(node, 0) + np.round(terms / len(kind.parts)).astype(np.int64)
    problem = with_terms(part.problem, unary, kind_plan.wrap[1], None)
    current = kind_plan.frontier[0].solution
    found = _solve(problem, time_s, settings, hint=current)
    if score(problem, found.solution).cost >= score(problem, current).cost:
        return False
    kind_plan.frontier[0] = _point(part, with_terms(part.problem, *kind_plan.wrap, None), kind_plan.turn,
                                   found.solution)
    return True


def _rest_choices(rest: PartProblem, solution: tuple[int, ...], options: dict, storage: dict) -> None:
    for node, pick in enumerate(solution):
        kind, name = rest.formulation.nodes[rest.kept[node]]
        (options if kind == "op" else storage)[name] = rest.choices(node)[pick]


def _too_big(plans: list[KindPlan], rest_bytes: int, budget: int) -> str:
    least = (sum(len(p.kind.parts) * min(point.memory_bytes for point in p.frontier) for p in plans)
             + max(p.transient_bytes() for p in plans))
    return (f"the layers' least-memory plans need {size(least)} per device together and the ops outside them "
            f"{size(rest_bytes)}, over the memory budget {size(budget)}; plan the whole graph instead "
            f"(without --layer-once), or raise the budget")


def _summary(kinds: list[LayerKind], plans: list[KindPlan], picks: list[list[int]], rest: PartProblem,
             objective: int, lower: int, gap: float, own_ps: int, rest_ps: int, boundary_ps: int,
             formulate_s: float, solve_s: float, budget: int) -> dict[str, Any]:
    """The plan document's `solver` section, with `composition`: how the plan was composed."""
    problems = [p.part.problem for p in plans] + [rest.problem]
    return {
        "status": "optimal" if lower >= objective else "feasible",
        "objective_ps": objective,
        "objective_s": objective / PICOSECONDS,
        "lower_bound_ps": lower,
        "gap": gap,
        "formulate_s": formulate_s,
        "solve_s": solve_s,
        "first_feasible_s": None,
        "problem": {"nodes": sum(p.num_nodes for p in problems), "edges": sum(p.num_edges for p in problems),
                    "strategies": int(sum(int(np.sum(p.num_strategies())) for p in problems))},
        "memory_budget_bytes": budget,
        "composition": {
            "method": "layer-once",
            "kinds": len(kinds),
            "layers": sum(len(k.parts) for k in kinds),
            "layer_ps": own_ps,
            "rest_ps": rest_ps,
            "boundary_ps": boundary_ps,
            "per_kind": [{"signature": k.signature, "layers": list(k.layers), "lower_bound_ps": p.lower_bound_ps,
                          "frontier": [{"cost_ps": f.cost_ps, "boundary_ps": f.boundary_ps,
                                        "memory_bytes": f.memory_bytes, "peak_bytes": f.peak_bytes,
                                        "layers": chosen.count(c)}
                                       for c, f in enumerate(p.frontier)]}
                         for k, p, chosen in zip(kinds, plans, picks)],
        },
    }

"""The sharding optimisation problem: one strategy per node, node and edge costs, a memory limit.

This is the format of the public IOPDDL contest. A node has strategies, each with an integer
cost and a per-device memory usage, and a liveness interval `[start, end)` of time steps. An
edge `(u, v)` has a `|S_u| x |S_v|` cost matrix. A solution picks one strategy per node; its
cost is the sum of the chosen node costs and edge-matrix entries, and it is infeasible when at
some time step the summed usage of the live nodes exceeds `usage_limit`.

Costs are int64. The contest marks a forbidden strategy or strategy pair with a cost of
`FORBIDDEN_COST` (10**18); scoring adds it like any other cost (as the contest does), and the
solvers avoid such choices.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from autoshard.errors import InputError, Problem as Issue

FORBIDDEN_COST = 10**18


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _int_array(value: Any, where: str, issues: list[Issue], ndim: int | None) -> np.ndarray | None:
    """`value` as a read-only int64 copy with `ndim` dimensions (any, flattened, when None),
    or None after recording why not."""
    try:
        array = np.asarray(value)
        if array.dtype.kind == "O":
            array = np.array(value, dtype=np.int64)
        elif array.size and (array.dtype.kind not in "iub"):
            raise TypeError
        elif array.size and array.dtype.kind == "u" and int(array.max()) >= 2**63:
            raise OverflowError
        array = np.array(array, dtype=np.int64)
    except OverflowError:
        issues.append(Issue(where, "integers must fit in int64 (|x| < 2**63)"))
        return None
    except (TypeError, ValueError):
        issues.append(Issue(where, f"expected integers, found {str(value)[:60]}"))
        return None
    if ndim is None:
        return _frozen(array.ravel())
    if array.size == 0 and array.ndim != ndim:
        array = array.reshape((0,) * ndim)
    if array.ndim != ndim:
        issues.append(Issue(where, f"expected a {ndim}-D array of integers, found shape {array.shape}"))
        return None
    return _frozen(array)


@dataclass(frozen=True, eq=False)
class Problem:
    """An instance, validated and stored as read-only numpy arrays.

    `node_costs[i]`, `node_usages[i]`: int64 vectors of node i's strategies (same length, >= 1);
    `intervals`: (n, 2) int64, node i is live at steps `intervals[i,0] <= t < intervals[i,1]`;
    `edges`: (m, 2) int64 node pairs; `edge_costs[e]`: int64 matrix `(|S_u|, |S_v|)`;
    `usage_limit`: the memory limit at every step, or None for no limit.
    """

    node_costs: tuple[np.ndarray, ...]
    node_usages: tuple[np.ndarray, ...]
    intervals: np.ndarray
    edges: np.ndarray
    edge_costs: tuple[np.ndarray, ...]
    usage_limit: int | None = None
    name: str = ""

    def __post_init__(self) -> None:
        issues: list[Issue] = []
        costs = [_int_array(c, f"/nodes/costs/{i}", issues, 1) for i, c in enumerate(self.node_costs)]
        usages = [_int_array(u, f"/nodes/usages/{i}", issues, 1) for i, u in enumerate(self.node_usages)]
        intervals = _int_array(self.intervals if len(self.intervals) else np.zeros((0, 2)),
                               "/nodes/intervals", issues, 2)
        edges = _int_array(self.edges if len(self.edges) else np.zeros((0, 2)), "/edges/nodes", issues, 2)
        n = len(costs)
        if len(usages) != n:
            issues.append(Issue("/nodes/usages", f"expected {n} entries (one per node), found {len(usages)}"))
        if intervals is not None and intervals.shape != (n, 2):
            issues.append(Issue("/nodes/intervals", f"expected {n} pairs [start, end], found shape {intervals.shape}"))
        elif intervals is not None and n and intervals.min() < 0:
            bad = int(np.argmin(intervals.min(axis=1)))
            issues.append(Issue(f"/nodes/intervals/{bad}", "time steps must be >= 0"))
        for i, (c, u) in enumerate(zip(costs, usages)):
            if c is None or u is None:
                continue
            if len(c) == 0:
                issues.append(Issue(f"/nodes/costs/{i}", "a node needs at least one strategy"))
            if len(u) != len(c):
                issues.append(Issue(f"/nodes/usages/{i}", f"expected {len(c)} usages (one per strategy), found {len(u)}"))
            elif len(u) and u.min() < 0:
                issues.append(Issue(f"/nodes/usages/{i}", "usages must be >= 0"))
        if edges is not None and edges.shape[1:] != (2,):
            issues.append(Issue("/edges/nodes", f"only pairwise edges [u, v] are supported, found shape {edges.shape}"))
            edges = None
        edge_costs: list[np.ndarray | None] = []
        # A matrix object shared by several edges (a formulation's identical layers) is checked
        # and stored once: the 96-layer 3-D training step shares 82 among 44k edges (165M entries).
        checked: dict[tuple[int, int, int], np.ndarray] = {}
        if edges is not None:
            if len(self.edge_costs) != len(edges):
                issues.append(Issue("/edges/costs", f"expected {len(edges)} matrices (one per edge), found {len(self.edge_costs)}"))
            for e, ((u, v), matrix) in enumerate(zip(edges.tolist(), self.edge_costs)):
                where = f"/edges/costs/{e}"
                if not (0 <= u < n and 0 <= v < n):
                    issues.append(Issue(f"/edges/nodes/{e}", f"node index out of range 0..{n - 1}: [{u}, {v}]"))
                    edge_costs.append(None)
                    continue
                if u == v:
                    issues.append(Issue(f"/edges/nodes/{e}", f"an edge joins two different nodes, found [{u}, {v}]"))
                rows = len(costs[u]) if costs[u] is not None else 0
                cols = len(costs[v]) if costs[v] is not None else 0
                known = checked.get((id(matrix), rows, cols))
                if known is not None:
                    edge_costs.append(known)
                    continue
                flat = _int_array(matrix, where, issues, None)
                if flat is not None and len(flat) != rows * cols:
                    issues.append(Issue(where, f"expected {rows} x {cols} = {rows * cols} costs for nodes "
                                               f"{u} and {v}, found {len(flat)}"))
                    flat = None
                edge_costs.append(None if flat is None else _frozen(flat.reshape(rows, cols)))
                if flat is not None:
                    checked[(id(matrix), rows, cols)] = edge_costs[-1]
        limit = self.usage_limit
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or not 0 <= int(limit) < 2**63:
                issues.append(Issue("/usage_limit", f"expected a non-negative int64 or null, found {limit!r}"))
            else:
                limit = int(limit)
        if issues:
            raise InputError(issues)
        object.__setattr__(self, "node_costs", tuple(costs))
        object.__setattr__(self, "node_usages", tuple(usages))
        object.__setattr__(self, "intervals", intervals)
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "edge_costs", tuple(edge_costs))
        object.__setattr__(self, "usage_limit", limit)

    @property
    def num_nodes(self) -> int:
        return len(self.node_costs)

    @property
    def num_edges(self) -> int:
        return len(self.edges)

    def num_strategies(self) -> np.ndarray:
        """Strategies per node, as an int64 vector."""
        return np.fromiter((len(c) for c in self.node_costs), dtype=np.int64, count=self.num_nodes)

    def __repr__(self) -> str:
        return (f"Problem({self.name!r}, nodes={self.num_nodes}, edges={self.num_edges}, "
                f"usage_limit={self.usage_limit})")


@dataclass(frozen=True)
class Score:
    """A solution scored as the contest does: exact integer cost; feasible iff memory fits everywhere.

    `forbidden` counts chosen strategies or strategy pairs whose cost is at least FORBIDDEN_COST
    (the contest adds them like any cost); `violated_steps` counts time steps over the limit.
    """

    cost: int
    feasible: bool
    peak_usage: int
    peak_step: int
    violated_steps: int
    first_violation_step: int | None
    forbidden: int


def check_solution(problem: Problem, solution: Sequence[int] | np.ndarray) -> np.ndarray:
    """`solution` as an int64 vector, or InputError naming each bad entry."""
    try:
        x = np.asarray(solution, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise InputError("expected a list of strategy indices (integers)", "/solution") from None
    if x.shape != (problem.num_nodes,):
        raise InputError(f"expected {problem.num_nodes} strategy indices (one per node), found shape {x.shape}",
                         "/solution")
    bad = np.flatnonzero((x < 0) | (x >= problem.num_strategies()))
    if len(bad):
        raise InputError([Issue(f"/solution/{i}", f"strategy {x[i]} out of range 0..{len(problem.node_costs[i]) - 1}")
                          for i in bad[:20].tolist()])
    return x


def certified_lower(bound: float) -> int:
    """The integer lower bound a float bound certifies. Costs are integers, so nothing costs less
    than the bound rounded up; the bound is first lowered by more than the rounding error a
    float sum of many large costs can carry. `bound` must be finite."""
    return math.ceil(bound - 1e-11 * abs(bound) - 1e-6)


def within_gap(objective: float, bound: float, gap_limit: float) -> bool:
    """Whether `objective` is within `gap_limit` of the float `bound`: (cost - bound) / cost at most
    the limit, with the bound certified first (0 asks for a proof of optimality)."""
    return math.isfinite(bound) and objective - certified_lower(bound) <= gap_limit * objective


def exact_sum(values: np.ndarray) -> int:
    """Sum of an int64 vector without overflow (the contest sums in 128 bits)."""
    values = np.asarray(values, dtype=np.int64)
    high, low = np.divmod(values, 1 << 32)
    return (int(high.sum()) << 32) + int(low.sum())


def usage_profile(problem: Problem, x: np.ndarray) -> np.ndarray:
    """Summed usage of the live nodes at each time step 0..max_end-1 (int64)."""
    horizon = int(problem.intervals[:, 1].max()) if problem.num_nodes else 0
    delta = np.zeros(horizon + 1, dtype=np.int64)
    live = problem.intervals[:, 0] < problem.intervals[:, 1]
    use = np.fromiter((u[s] for u, s in zip(problem.node_usages, x.tolist())), dtype=np.int64, count=len(x))
    np.add.at(delta, problem.intervals[live, 0], use[live])
    np.add.at(delta, problem.intervals[live, 1], -use[live])
    return np.cumsum(delta[:horizon])


def score(problem: Problem, solution: Sequence[int] | np.ndarray) -> Score:
    """Cost and feasibility of `solution` (one strategy index per node), exactly as the contest scores."""
    x = check_solution(problem, solution)
    node = np.fromiter((c[s] for c, s in zip(problem.node_costs, x.tolist())), dtype=np.int64, count=len(x))
    xl = x.tolist()
    edge = np.fromiter((m[xl[u], xl[v]] for m, (u, v) in zip(problem.edge_costs, problem.edges.tolist())),
                       dtype=np.int64, count=problem.num_edges)
    forbidden = int((node >= FORBIDDEN_COST).sum() + (edge >= FORBIDDEN_COST).sum())
    profile = usage_profile(problem, x)
    peak_step = int(np.argmax(profile)) if len(profile) else 0
    peak = int(profile[peak_step]) if len(profile) else 0
    if problem.usage_limit is None:
        over = np.zeros(0, dtype=np.int64)
    else:
        over = np.flatnonzero(profile > problem.usage_limit)
    return Score(cost=exact_sum(node) + exact_sum(edge), feasible=len(over) == 0, peak_usage=peak,
                 peak_step=peak_step, violated_steps=len(over),
                 first_violation_step=int(over[0]) if len(over) else None, forbidden=forbidden)


def _load_json(path: Path) -> Any:
    try:
        with path.open("rb") as handle:
            magic = handle.read(2)
        opener = gzip.open if magic == b"\x1f\x8b" else open
        with opener(path, "rt", encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise InputError(f"no such file: {path}", str(path)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"not a JSON (or gzipped JSON) file: {error}", str(path)) from None


def _field(data: Any, pointer: str) -> Any:
    value = data
    for key in pointer.strip("/").split("/"):
        if not isinstance(value, dict) or key not in value:
            raise InputError(f"missing field '{key}'", pointer)
        value = value[key]
    return value


def _list(data: Any, pointer: str) -> list:
    value = _field(data, pointer)
    if not isinstance(value, list):
        raise InputError(f"expected a list, found {type(value).__name__}", pointer)
    return value


def problem_from_json(data: Any) -> Problem:
    """A Problem from the contest's JSON document (`{"problem": {...}}` or the inner object)."""
    if isinstance(data, dict) and "problem" in data:
        data = data["problem"]
    if not isinstance(data, dict):
        raise InputError("expected a JSON object with 'nodes' and 'edges'", "/problem")
    costs = _list(data, "/nodes/costs")
    usages = _list(data, "/nodes/usages")
    intervals = _list(data, "/nodes/intervals")
    edge_nodes = _list(data, "/edges/nodes") if "edges" in data else []
    edge_costs = _list(data, "/edges/costs") if "edges" in data else []
    issues = [Issue(f"/edges/nodes/{e}", f"only pairwise edges [u, v] are supported, found {pair}")
              for e, pair in enumerate(edge_nodes) if not (isinstance(pair, list) and len(pair) == 2)]
    if issues:
        raise InputError(issues)
    problem = Problem(node_costs=tuple(costs), node_usages=tuple(usages), intervals=intervals,
                      edges=edge_nodes, edge_costs=tuple(edge_costs), usage_limit=data.get("usage_limit"),
                      name=str(data.get("name", "")))
    issues = _contest_issues(problem)
    if issues:
        raise InputError(issues)
    return problem


def _contest_issues(problem: Problem) -> list[Issue]:
    """What the contest's format rules out and `Problem` (which the planner also builds) does not check:
    a cost below zero, an interval that ends before it starts."""
    issues = [Issue(f"/nodes/costs/{i}", "costs must be >= 0") for i, c in enumerate(problem.node_costs)
              if len(c) and c.min() < 0]
    reversed_ = np.flatnonzero(problem.intervals[:, 1] < problem.intervals[:, 0])
    issues += [Issue(f"/nodes/intervals/{i}", f"ends before it starts: {problem.intervals[i].tolist()}")
               for i in reversed_[:10]]
    issues += [Issue(f"/edges/costs/{e}", "costs must be >= 0") for e, m in enumerate(problem.edge_costs)
               if m.size and m.min() < 0]
    return issues


def read_iopddl(path: str | Path) -> Problem:
    """Read a contest instance from `path` (JSON, or gzipped JSON whatever its suffix)."""
    return problem_from_json(_load_json(Path(path)))


def problem_to_json(problem: Problem) -> dict:
    """The contest's JSON document of `problem` (edge matrices flattened row-major)."""
    body: dict[str, Any] = {
        "name": problem.name,
        "nodes": {
            "intervals": problem.intervals.tolist(),
            "costs": [c.tolist() for c in problem.node_costs],
            "usages": [u.tolist() for u in problem.node_usages],
        },
        "edges": {
            "nodes": problem.edges.tolist(),
            "costs": [m.ravel().tolist() for m in problem.edge_costs],
        },
    }
    if problem.usage_limit is not None:
        body["usage_limit"] = problem.usage_limit
    return {"problem": body}


def write_iopddl(problem: Problem, path: str | Path) -> None:
    """Write `problem` in the contest's format; gzipped when `path` ends in `.gz`. The same
    problem always gives the same bytes (the gzip header carries no time stamp or file name), so
    a generated instance can be checked against a recorded hash."""
    path = Path(path)
    text = json.dumps(problem_to_json(problem), separators=(",", ":"))
    if path.suffix == ".gz":
        with path.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as handle:
            handle.write(text.encode("utf-8"))
    else:
        path.write_text(text, encoding="utf-8")


def load_solution(path: str | Path) -> list[int]:
    """A solution file: `{"solution": [...]}` (as written by the CLI) or a bare list of indices."""
    data = _load_json(Path(path))
    if isinstance(data, dict):
        data = _field(data, "/solution")
    if not isinstance(data, list):
        raise InputError("expected a list of strategy indices or {\"solution\": [...]}", str(path))
    return data

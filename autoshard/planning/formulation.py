"""From graph + mesh + hardware to the optimisation problem, and from its solution to a plan.

Nodes: one per op (its strategies are its options) and one per graph input or parameter (its
strategies are the storage shardings). Edges: one per use of a tensor, whose matrix prices the
resharding from the producer's sharding to the one the consumer reads, and one per value written
in place, pricing its resharding into the storage sharding of the value it overwrites. Node cost: the op's
compute time, plus reducing a partial graph output. Memory: each node holds its results (a
storage node its stored tensor) from the step it is produced to its last use.

A value read by several uses is resharded once to its *delivered* sharding, and each use reads
it from there (`autoshard.planning.report.delivered_shardings`, the rule the report and the
partitioned program follow): such a value gets a delivered node, whose strategies are the
shardings it may be delivered in, an edge from its producer pricing the one resharding into it,
and its uses' edges start at the delivered node instead of the producer. So a weight gathered
once for its forward and backward matmuls is paid once, and every edge stays pairwise.

Costs are integers in picoseconds of objective: every term is first weighed into seconds (see
`Weights`), then scaled by `PICOSECONDS`. CP-SAT needs integers, and 1 ps resolves the smallest
kernels while a whole training step stays far below 2**63.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from autoshard.errors import InfeasibleError, InputError
from autoshard.graph.model import Graph, Op, Tensor, live_ranges, topological_order
from autoshard.graph.recompute import PREFIX as RECOMPUTED
from autoshard.mesh import Mesh
from autoshard.planning.costs import Hardware, op_cost, result_bytes, tensor_bytes
from autoshard.planning.options import ShardingOption, operand_shardings, result_shardings
from autoshard.planning.options import dtensor_runs, enumerate_options, enumerate_storage
from autoshard.planning.plan import Plan
from autoshard.planning.ring_attention import ring_options
from autoshard.planning.symmetry import interchangeable_axes, many_axes
from autoshard.resharding import PricedMoves, resharding_cost
from autoshard.sharding import Sharding
from autoshard.solver.problem import FORBIDDEN_COST, Problem

PICOSECONDS = 1e12
WRITE_BACK = -1  # the input index of an edge that stores a value written in place into its old storage
DELIVER = -2  # the input index of an edge from a value's producer to its delivered node
SAME_OPTION = -3  # the input index of an edge holding a recomputed op to its forward op's option


@dataclass(frozen=True)
class Weights:
    """Objective weights, each turning what it weighs into seconds of objective:

        objective_s = time * step_s + comm_s_per_byte * comm_bytes + memory_s_per_byte * held_bytes

    `step_s` is the step time (compute + communication) in seconds; `comm_bytes` the bytes each
    device communicates in the step (what the report calls `communication_bytes`); `held_bytes`
    the bytes each device holds for the step's values, summed over every value (stored tensors
    and op results, each counted once whatever its live range; not the peak).
    """

    time: float = 1.0  # seconds of objective per second of step time (dimensionless)
    comm_s_per_byte: float = 0.0  # seconds of objective per byte communicated per device
    memory_s_per_byte: float = 0.0  # seconds of objective per byte held per device

    def __post_init__(self) -> None:
        for name in WEIGHT_UNITS:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise InputError(f"weight {name!r} must be a finite number >= 0, got {value!r}", "weights")

    def problem(self) -> str | None:
        """Why these weights cannot rank plans (every weight 0: every plan would cost nothing), or None.
        Formulating under them is still fine (the tie-break alone is then the objective)."""
        if not any(getattr(self, name) for name in WEIGHT_UNITS):
            return "every weight is 0, so every plan would cost nothing: give time (or another weight) a positive value"
        return None


# What each weight is, for messages and help; and the names weights had before they carried units
WEIGHT_UNITS = {"time": "seconds of objective per second of step time",
                "comm_s_per_byte": "seconds of objective per byte communicated per device",
                "memory_s_per_byte": "seconds of objective per byte held per device"}
RENAMED_WEIGHTS = {"comm_bytes": "comm_s_per_byte", "memory_bytes": "memory_s_per_byte"}


def weight_name_problem(name: str) -> str | None:
    """What is wrong with a weight's name, or None when it is one of `Weights`' fields."""
    if name in WEIGHT_UNITS:
        return None
    if name in RENAMED_WEIGHTS:
        new = RENAMED_WEIGHTS[name]
        return (f"weight {name!r} is now {new!r}, in {WEIGHT_UNITS[new]} (an old {name!r} value was in "
                f"picoseconds per byte: divide it by 1e12 for the same objective)")
    return f"unknown weight {name!r}; expected {', '.join(f'{n} ({u})' for n, u in WEIGHT_UNITS.items())}"


@dataclass
class Formulation:
    graph: Graph
    mesh: Mesh
    problem: Problem
    nodes: list[tuple[str, str]]  # ("op", op name), ("storage", tensor name) or ("delivered", tensor name)
    choices: list[list[ShardingOption | Sharding]]
    # per edge: (tensor, consumer op, input index), (new value, overwritten value, WRITE_BACK),
    # (tensor, its first reader, DELIVER) from its producer to its delivered node, or (forward
    # op, its recomputed copy, SAME_OPTION)
    uses: list[tuple[str, str, int]]
    hint: list[int] = field(default_factory=list)  # preferred strategy per node (from hints)

    def plan(self, solution: Sequence[int]) -> Plan:
        options, storage = {}, {}
        for (kind, name), choice, pick in zip(self.nodes, self.choices, solution):
            if kind != "delivered":
                (options if kind == "op" else storage)[name] = choice[int(pick)]
        return Plan(self.graph, self.mesh, options, storage)

    def solution(self, plan: Plan, delivered: Mapping[str, Sharding]) -> list[int]:
        """`plan` as one strategy per node, each delivered node at `delivered[tensor]` (the
        report's choice, `delivered_shardings`; the value as produced when absent), so that the
        solution costs what `estimate` prices."""
        picks = []
        for (kind, name), choices in zip(self.nodes, self.choices):
            wanted = (plan.options[name] if kind == "op" else plan.storage[name] if kind == "storage"
                      else delivered.get(name, plan.produced(name)))
            picks.append(choices.index(wanted))
        return picks


def resharding_prices(mesh: Mesh, hw: Hardware) -> "ReshardingPrices":
    return ReshardingPrices(mesh, hw.collective_seconds, interchangeable_axes(mesh, hw))


class ReshardingPrices:
    """Resharding seconds and bytes per (shape, itemsize, source, target), computed once."""

    def __init__(self, mesh: Mesh, price: Callable[[str, tuple[str, ...], float], float],
                 classes: tuple[tuple[str, ...], ...] = ()):
        self.mesh, self.moves = mesh, PricedMoves(price, classes)
        self._ids: dict[Sharding, int] = {}  # shardings as ints: cheap cache keys
        # (shape, itemsize) -> source id -> target id -> (seconds, bytes): a table's pairs are
        # looked up with one int key each
        self._cache: dict[tuple[tuple[int, ...], int], dict[int, dict[int, tuple[float, float]]]] = {}

    def __call__(self, shape: tuple[int, ...], itemsize: int, source: Sharding, target: Sharding) -> tuple[float, float]:
        return self._row(shape, itemsize, source, [target], [self._id(target)])[0]

    def table(self, shape: tuple[int, ...], itemsize: int, sources: list[Sharding],
              targets: list[Sharding]) -> tuple[np.ndarray, np.ndarray]:
        """Seconds and bytes of every (source, target) pair, as `|sources| x |targets|` arrays."""
        target_ids = [self._id(t) for t in targets]
        with without_gc():
            pairs = [pair for s in sources for pair in self._row(shape, itemsize, s, targets, target_ids)]
        flat = np.fromiter(itertools.chain.from_iterable(pairs), dtype=np.float64, count=2 * len(pairs))
        table = flat.reshape(len(sources), len(targets), 2)
        return table[..., 0], table[..., 1]

    def known(self) -> "KnownPrices":
        """Every price found so far, as plain data for another process (`remember`)."""
        return KnownPrices(tuple(self._ids), {key: {source: dict(row) for source, row in rows.items()}
                                              for key, rows in self._cache.items()})

    def remember(self, known: "KnownPrices") -> None:
        """Take the prices another `ReshardingPrices` of the same mesh and hardware found."""
        ids = [self._id(s) for s in known.shardings]
        for key, rows in known.rows.items():
            mine = self._cache.setdefault(key, {})
            for source, row in rows.items():
                mine.setdefault(ids[source], {}).update((ids[target], found) for target, found in row.items())

    def _id(self, sharding: Sharding) -> int:
        found = self._ids.get(sharding)
        if found is None:
            found = self._ids[sharding] = len(self._ids)
        return found

    def _row(self, shape: tuple[int, ...], itemsize: int, source: Sharding, targets: list[Sharding],
             target_ids: list[int]) -> list[tuple[float, float]]:
        """The prices from `source` to each of `targets`."""
        source_id = self._id(source)
        known = self._cache.setdefault((shape, itemsize), {}).setdefault(source_id, {})
        row = []
        for target, target_id in zip(targets, target_ids):
            found = known.get(target_id)
            if found is None:
                if source_id == target_id:
                    found = (0.0, 0.0)
                else:
                    found = resharding_cost(self.mesh, shape, itemsize, source, target, self.moves)
                known[target_id] = found
            row.append(found)
        return row


@contextlib.contextmanager
def without_gc() -> Iterator[None]:
    """No cyclic garbage collection inside: pricing a table makes hundreds of thousands of small
    acyclic objects that it keeps (the searches' states, moves and prices), and collecting after
    every few hundred of them took a fifth of a 5-axis formulation."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class KnownPrices:
    """`ReshardingPrices.known()`: the shardings by number, and per (shape, itemsize), source
    number and target number, the seconds and bytes found."""

    shardings: tuple[Sharding, ...]
    rows: dict[tuple[tuple[int, ...], int], dict[int, dict[int, tuple[float, float]]]]


# At equal time, the plan that holds less wins: each MiB held costs 1 ps, a thousandth of the
# time of moving it over the fastest link, so it never outweighs a real difference in time.
TIE_BREAK_PS_PER_BYTE = 1.0 / 2 ** 20


def _costs(seconds: Any, comm_bytes: Any, memory: Any, w: Weights) -> np.ndarray:
    """Objective terms (scalars or arrays of them) as int64 picoseconds of objective, rounded half to even."""
    total = (np.asarray(seconds, np.float64) * PICOSECONDS * w.time
             + np.asarray(comm_bytes, np.float64) * PICOSECONDS * w.comm_s_per_byte
             + np.asarray(memory, np.float64) * (w.memory_s_per_byte * PICOSECONDS + TIE_BREAK_PS_PER_BYTE))
    if not np.all(np.abs(total) < 2.0 ** 62):  # the solver sums these: keep headroom in int64
        raise InputError(f"an op or tensor costs {np.max(np.abs(total)) / PICOSECONDS:.3g} s of objective, beyond "
                         f"the 2**62 picoseconds the objective can count; shrink the graph or the weights", "graph")
    return np.round(total).astype(np.int64)


@dataclass(frozen=True)
class _NodeKind:
    """What nodes with the same signature share (a graph's identical layers give many of them):
    strategies, their costs and memory, and per strategy the shardings on the node's edges."""

    choices: list
    costs: np.ndarray
    usages: np.ndarray
    results: tuple[list[Sharding], ...]  # per output position, per strategy
    operands: tuple[list[Sharding], ...] = ()  # per input index, per strategy


def formulate(graph: Graph, mesh: Mesh, hw: Hardware, *, memory_budget_bytes: float | None = None,
              weights: Weights = Weights(), mesh_order: bool = False, delivered_nodes: bool = True,
              prices: ReshardingPrices | None = None) -> Formulation:
    """`mesh_order`: a dim split over several mesh axes takes them in mesh order only, as a
    framework that shards in mesh-dim order (DTensor) can run. `delivered_nodes=False`: every
    use is priced from the value as produced, as if none were shared (an upper bound on what
    the report prices), for callers that mirror the formulation's edges use by use. `prices`:
    resharding prices already found on this mesh and hardware, shared by two formulations."""
    order = topological_order(graph)
    step = {op.name: i for i, op in enumerate(order)}
    ranges = live_ranges(graph, order)
    prices = prices if prices is not None else resharding_prices(mesh, hw)
    pins = {c.tensor: c.sharding for c in graph.constraints if c.required}
    hints = {c.tensor: c.sharding for c in graph.constraints if not c.required}
    # a value written in place is handed over in its old value's storage sharding: priced on an
    # edge to that storage node, not as a returned output (unless pinned)
    written_back = {new: old for old, new in graph.updated_by.items() if new not in pins}
    returned = frozenset(t for t in graph.outputs if t not in written_back)

    nodes: list[tuple[str, str]] = []
    kinds: list[int] = []  # per node: its signature's number
    signatures: dict[tuple, int] = {}
    shared: list[_NodeKind] = []
    intervals, hint = [], []
    index: dict[str, int] = {}  # tensor -> node producing or storing it

    def kind_of(signature: tuple, make: Callable[[], _NodeKind]) -> int:
        found = signatures.get(signature)
        if found is None:
            found = signatures[signature] = len(shared)
            shared.append(make())
        return found

    def add_storage(tensor: Tensor) -> None:
        signature = ("storage", tensor.shape, tensor.itemsize, pins.get(tensor.name))
        k = kind_of(signature, lambda: _storage_kind(tensor.shape, tensor.itemsize, pins.get(tensor.name), mesh, weights,
                                                          mesh_order, many_axes(mesh)))
        index[tensor.name] = len(nodes)
        nodes.append(("storage", tensor.name))
        kinds.append(k)
        first, last = ranges[tensor.name]
        intervals.append((first, last + 1))
        hint.append(_hint_index(shared[k].results[0], hints.get(tensor.name)))

    # Each stored tensor is numbered right after its first consumer. The memory relaxation decodes
    # nodes in this order: a stored tensor then follows the op that reads it. Numbered up front,
    # all of them were decided before any op, each on its own among many near-equal shardings
    # (an optimizer's states and parameter), and the ops between them paid reshardings for the
    # mismatch: decodes of a 3-D training step at twice the optimum for 30 TRW-S passes.
    for op in order:
        signature = _op_signature(graph, op, pins, returned)
        k = kind_of(signature, lambda: _op_kind(graph, op, mesh, hw, pins, returned, prices, weights, mesh_order))
        for t in op.outputs:
            index[t] = len(nodes)
        nodes.append(("op", op.name))
        kinds.append(k)
        last = max(ranges[t][1] for t in op.outputs)
        intervals.append((step[op.name], last + 1))
        hint.append(_hint_index(shared[k].results[0], hints.get(op.outputs[0])))
        for t in op.inputs:
            if t not in index:
                add_storage(graph.tensors[t])
    for tensor in graph.tensors.values():
        if tensor.role != "intermediate" and tensor.name not in index:
            add_storage(tensor)

    reads: dict[str, list[tuple[int, int]]] = {}  # tensor -> (consumer node, input index) per use
    for op in order:
        for i, t in enumerate(op.inputs):
            reads.setdefault(t, []).append((index[op.outputs[0]], i))

    matrices: dict[tuple, np.ndarray] = {}
    edges, edge_costs, uses = [], [], []

    def add_edge(u: int, v: int, key: tuple, sources: list[Sharding], targets: list[Sharding], tensor: Tensor,
                 use: tuple[str, str, int]) -> None:
        matrix = matrices.get(key)
        if matrix is None:
            matrix = matrices[key] = _pair_matrix(
                sources, targets, lambda s, d: _costs(*prices.table(tensor.shape, tensor.itemsize, s, d), 0.0, weights))
        edge_costs.append(matrix)
        edges.append((u, v))
        uses.append(use)

    delivered: dict[str, int | None] = {}  # tensor -> its delivered node, made at its first use

    def deliver(t: str, u: int, out_pos: int, tensor: Tensor) -> int | None:
        """The delivered node of `t` (None when its uses cannot share a sharding)."""
        if t in delivered:
            return delivered[t]
        readers = reads[t]
        sources = shared[kinds[u]].results[out_pos]
        candidates = _delivery_candidates(sources, [shared[kinds[v]].operands[i] for v, i in readers])
        if candidates is None:
            delivered[t] = None
            return None
        signature = ("delivered", kinds[u], out_pos, tuple((kinds[v], i) for v, i in readers))
        k = kind_of(signature, lambda: _NodeKind(candidates, np.zeros(len(candidates), np.int64),
                                                 np.zeros(len(candidates), np.int64), (candidates,)))
        d = delivered[t] = len(nodes)
        nodes.append(("delivered", t))
        kinds.append(k)
        intervals.append(intervals[u])
        hint.append(candidates.index(sources[hint[u]]) if hint[u] >= 0 else -1)
        key = ("deliver", kinds[u], out_pos, k)
        matrix = matrices.get(key)
        if matrix is None:
            matrix = matrices[key] = _delivery_matrix(sources, candidates, lambda s, c: _costs(
                *prices.table(tensor.shape, tensor.itemsize, s, c), 0.0, weights))
        edge_costs.append(matrix)
        edges.append((u, d))
        uses.append((t, nodes[readers[0][0]][1], DELIVER))  # made where it is first read
        return d

    for op in order:
        v = index[op.outputs[0]]
        for i, t in enumerate(op.inputs):
            u = index[t]
            tensor = graph.tensors[t]
            out_pos = 0 if nodes[u][0] == "storage" else graph.producers[t].outputs.index(t)
            d = deliver(t, u, out_pos, tensor) if delivered_nodes and len(reads[t]) > 1 else None
            if d is None:  # the signatures fix the shape and both lists
                add_edge(u, v, (kinds[u], out_pos, kinds[v], i), shared[kinds[u]].results[out_pos],
                         shared[kinds[v]].operands[i], tensor, (t, op.name, i))
            else:
                add_edge(d, v, (kinds[d], 0, kinds[v], i), shared[kinds[d]].results[0], shared[kinds[v]].operands[i],
                         tensor, (t, op.name, i))
    for new, old in written_back.items():
        u, v = index[new], index[old]
        out_pos = graph.producers[new].outputs.index(new)
        add_edge(u, v, (kinds[u], out_pos, kinds[v], WRITE_BACK), shared[kinds[u]].results[out_pos],
                 shared[kinds[v]].results[0], graph.tensors[new], (new, old, WRITE_BACK))
    for op in order:
        copied = graph.op_by_name.get(op.name.removeprefix(RECOMPUTED)) if op.name.startswith(RECOMPUTED) else None
        if copied is not None:
            u, v = index[copied.outputs[0]], index[op.outputs[0]]
            edge_costs.append(_same_option_matrix(shared[kinds[u]].choices, shared[kinds[v]].choices))
            edges.append((u, v))
            uses.append((copied.name, op.name, SAME_OPTION))
    # A delivered node is numbered before the op after its value's producer (or stored
    # tensor): between the value and its uses, in the order the relaxation sweeps and decodes.
    # Numbered last, a 2-layer GPT training step on dp=2,tp=4 took 20 s to a gap of 1e-4, 4 s here.
    position = _delivered_after_producers(nodes, {d: index[t] for t, d in delivered.items() if d is not None})
    nodes = [nodes[i] for i in position]
    kinds = [kinds[i] for i in position]
    intervals = [intervals[i] for i in position]
    hint = [hint[i] for i in position]
    renumber = np.empty(len(position), dtype=np.int64)
    renumber[position] = np.arange(len(position))
    problem = Problem(tuple(shared[k].costs for k in kinds), tuple(shared[k].usages for k in kinds),
                      np.array(intervals, dtype=np.int64).reshape(-1, 2),
                      renumber[np.array(edges, dtype=np.int64).reshape(-1, 2)], tuple(edge_costs),
                      int(memory_budget_bytes) if memory_budget_bytes is not None else None, graph.name)
    return Formulation(graph, mesh, problem, nodes, [shared[k].choices for k in kinds], uses, hint)


def _delivered_after_producers(nodes: list[tuple[str, str]], producer_of: dict[int, int]) -> list[int]:
    """The nodes' new order (old numbers): each delivered node (`producer_of` maps it to its
    value's producing or storage node) moved just before the first op node after its producer."""
    waiting: dict[int, list[int]] = {}
    for d, u in producer_of.items():
        waiting.setdefault(u, []).append(d)
    order: list[int] = []
    pending: list[int] = []
    for i, (kind, _) in enumerate(nodes):
        if kind == "delivered":
            continue
        if kind == "op":
            order += pending
            pending = []
        order.append(i)
        pending += sorted(waiting.get(i, ()))
    return order + pending


def _op_signature(graph: Graph, op: Op, pins: dict[str, Sharding], returned: frozenset[str]) -> tuple:
    """Everything an op node's strategies and costs depend on, its name and neighbours aside."""
    inputs = tuple((graph.tensors[t].shape, graph.tensors[t].dtype) for t in op.inputs)
    outputs = tuple((graph.tensors[t].shape, graph.tensors[t].dtype, t in returned, pins.get(t)) for t in op.outputs)
    fused = tuple(t in graph.fused for t in op.operands)  # what its kernel reads and writes in memory
    return op.kind, op.nest, _hashable(op.attrs), inputs, outputs, fused


def _hashable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


def _storage_kind(shape: tuple[int, ...], itemsize: int, pin: Sharding | None, mesh: Mesh, weights: Weights,
                  mesh_order: bool, runs: bool) -> _NodeKind:
    options = [pin] if pin is not None else enumerate_storage(shape, mesh, mesh_order, runs)
    held = np.array([tensor_bytes(shape, itemsize, s, mesh) for s in options], dtype=np.int64)
    return _NodeKind(options, _costs(0.0, 0.0, held, weights), held, (options,))


def _op_kind(graph: Graph, op: Op, mesh: Mesh, hw: Hardware, pins: dict[str, Sharding], returned: frozenset[str],
             prices: ReshardingPrices, weights: Weights, mesh_order: bool) -> _NodeKind:
    # many-axis meshes offer fewer options (planning/symmetry.py); a pinned op is offered every one
    runs = many_axes(mesh) and not any(t in pins for t in op.outputs)
    options = enumerate_options(op.nest, mesh, mesh_order, runs)
    options += ring_options(op, options, mesh)
    if mesh_order:
        options = [o for o in options if dtensor_runs(op.kind, op.nest, o)]
    for position, t in enumerate(op.outputs):
        if t in pins and t not in returned:
            # A pinned intermediate is produced as pinned (partial allowed: reducing it is
            # priced on its edges); a pinned graph output is resharded to its pin at the end.
            options = [o for o in options
                       if result_shardings(op.nest, o)[position].without_partial() == pins[t].without_partial()]
    if not options:
        pinned = [t for t in op.outputs if t in pins]
        raise InfeasibleError(f"no option of op {op.name!r} ({op.kind}) produces the pinned sharding "
                              f"{[str(pins[t]) for t in pinned]} of {pinned}")
    node_seconds, node_comm, node_usage, results = [], [], [], []
    for option in options:
        produced = result_shardings(op.nest, option)
        seconds = op_cost(graph, op, option, mesh, hw).seconds
        comm = 0.0
        for t, s in zip(op.outputs, produced):
            if t in returned:  # the graph hands its outputs over reduced (or as pinned)
                target = pins.get(t, s.without_partial())
                r_s, r_b = prices(graph.tensors[t].shape, graph.tensors[t].itemsize, s, target)
                seconds, comm = seconds + r_s, comm + r_b
        node_seconds.append(seconds)
        node_comm.append(comm)
        node_usage.append(result_bytes(graph, op, option, mesh))
        results.append(produced)
    operands = [operand_shardings(op.nest, o) for o in options]
    usage = np.array(node_usage, dtype=np.int64)
    return _NodeKind(options, _costs(node_seconds, node_comm, usage, weights), usage,
                     tuple(list(r) for r in zip(*results)), tuple(list(r) for r in zip(*operands)))


def _pair_matrix(sources: list[Sharding], targets: list[Sharding],
                 table: Callable[[list[Sharding], list[Sharding]], np.ndarray]) -> np.ndarray:
    """|sources| x |targets| costs, from `table` of the distinct sources and distinct targets."""
    src_ids: dict[Sharding, int] = {}
    dst_ids: dict[Sharding, int] = {}
    src_index = np.array([src_ids.setdefault(s, len(src_ids)) for s in sources])
    dst_index = np.array([dst_ids.setdefault(d, len(dst_ids)) for d in targets])
    return table(list(src_ids), list(dst_ids))[src_index[:, None], dst_index[None, :]]


def _same_option_matrix(forward: list[ShardingOption], copy: list[ShardingOption]) -> np.ndarray:
    """A recomputed op runs as its forward op does (Megatron's recomputation reruns the forward as
    it ran): free where both take the same option, forbidden elsewhere."""
    column = {option: j for j, option in enumerate(copy)}
    matrix = np.full((len(forward), len(copy)), FORBIDDEN_COST, dtype=np.int64)
    for i, option in enumerate(forward):
        if option in column:
            matrix[i, column[option]] = 0
    return matrix


def _delivery_candidates(sources: list[Sharding], reads: list[list[Sharding]]) -> list[Sharding] | None:
    """The shardings a value read by `reads` (per use, per consumer strategy) may be delivered
    in: each sharding it may be produced in, then each one two uses may read (in order of first
    appearance); None when no two uses can read the same sharding, so one delivery saves nothing.
    `delivered_shardings` chooses among the produced sharding and those two uses do read."""
    counts: dict[Sharding, int] = {}
    for read in reads:
        for target in dict.fromkeys(read):
            counts[target] = counts.get(target, 0) + 1
    shared = [target for target, count in counts.items() if count >= 2]
    if not shared:
        return None
    distinct = list(dict.fromkeys(sources))
    return distinct + [target for target in shared if target not in distinct]


def _delivery_matrix(sources: list[Sharding], candidates: list[Sharding],
                     table: Callable[[list[Sharding], list[Sharding]], np.ndarray]) -> np.ndarray:
    """|sources| x |candidates| costs of delivering a value produced in each source in each
    candidate. A partial candidate is only the value as produced: resharding cannot make a
    value partial."""
    reachable = [c for c in candidates if not c.is_partial]
    priced = _pair_matrix(sources, reachable, table) if reachable else np.zeros((len(sources), 0), np.int64)
    matrix = np.full((len(sources), len(candidates)), FORBIDDEN_COST, dtype=np.int64)
    columns = [j for j, c in enumerate(candidates) if not c.is_partial]
    matrix[:, columns] = priced
    for i, s in enumerate(sources):
        if s.is_partial:
            matrix[i, candidates.index(s)] = 0
    return matrix


def _hint_index(candidates: list[Sharding], wanted: Sharding | None) -> int:
    if wanted is not None:
        for i, s in enumerate(candidates):
            if s == wanted:
                return i
    return -1

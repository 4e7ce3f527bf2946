"""`parallelize`: run an exported program under DTensor exactly as a plan says.

The returned module keeps every parameter (and buffer) as a DTensor stored as planned. Its
forward runs the imported graph op by op, each op as the aten call it came from: before an op,
each input is redistributed to the sharding the op's option reads it in, once for all its
consumers and through the same intermediate shardings as the plan's resharding steps (the
plan's collectives, not ones of DTensor's choosing); after it, the result is checked against the sharding the plan
says the op produces, and moved there if DTensor's own propagation chose another (`mismatches`
counts those, so a test can require none).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Collection, Mapping

from autoshard.errors import InputError, Problem
from autoshard.frontends.torch.capacity import ExpertCapacity, planned_capacity
from autoshard.frontends.torch.context_parallel import key_split_attention
from autoshard.frontends.torch.ring_attention import ring_attention
from autoshard.frontends.torch.importer import ImportedProgram, import_program
from autoshard.frontends.torch.lowering import DTYPES
from autoshard.delivery.dtensor_placements import placement_specs
from autoshard.frontends.pipelined import refuse_pipelined
from autoshard.frontends.torch.runtime import require_torch
from autoshard.graph.model import Graph
from autoshard.mesh import Mesh
from autoshard.ops.loops import loop_position
from autoshard.ops.nn import KEY_LOOP, QUERY_LOOP
from autoshard.planning.make_plan import PlanResult
from autoshard.planning.plan import Plan, option_entry, plan_from_json
from autoshard.planning.plan_contract import read_plan
from autoshard.planning.report import plan_reshardings
from autoshard.planning.sequence_layout import refuse_balanced
from autoshard.resharding import bytes_moved_price
from autoshard.sharding import Sharding

torch = require_torch()
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor  # noqa: E402  (after the check above)


def parallelize(exported_program: Any, plan: Plan | PlanResult | Mapping[str, Any], device_mesh: Any,
                expert_capacity: ExpertCapacity | None = None) -> "ShardedProgram":
    """A module that runs `exported_program` on `device_mesh` as `plan` places every value.

    `exported_program` is what `torch.export.export` gives, or that decomposed: it is imported in
    the canonical form `autoshard import torch` writes, so a plan made from the CLI's graph applies.

    `plan` is a `Plan`, a `PlanResult`, or the document of `plan.json`; it may have been made
    for the forward graph or for the training graph of the same program (`--training`). The
    mesh's dim names and sizes must be the plan's axes, in order. `expert_capacity` is the one
    the graph was imported with (`import_program`), if any; a `Plan` or `PlanResult` tells it
    itself (a plan document does not: pass it).
    """
    refuse_pipelined(plan, "autoshard.frontends.torch.parallelize")
    refuse_balanced(plan, "autoshard.frontends.torch.parallelize")
    if expert_capacity is None and isinstance(plan, (Plan, PlanResult)):
        expert_capacity = planned_capacity((plan.plan if isinstance(plan, PlanResult) else plan).graph)
    elif expert_capacity is None and any(str(op).endswith(".dispatch_tokens") for op in plan.get("ops") or ()):
        raise InputError("the plan was made for routed experts at a capacity (its ops dispatch tokens to expert "
                         "slots), which its document does not record: pass the ExpertCapacity the program was "
                         "imported with", "expert_capacity")
    imported = import_program(exported_program, expert_capacity=expert_capacity)
    mesh = check_mesh(_plan_mesh(plan), device_mesh)
    forward = _forward_plan(plan, imported, mesh)
    return ShardedProgram(imported.program, imported, forward, device_mesh, resharding_steps(plan, forward))


def resharding_steps(plan: Any, forward: Plan) -> dict[tuple[str, Sharding], list[Sharding]]:
    """(tensor, target) -> the sharding the plan's resharding starts from, then the sharding after
    each of its steps, as priced when the plan was made (a bare Plan's reshardings are found anew,
    priced by bytes moved)."""
    if isinstance(plan, PlanResult):
        entries = plan.report.reshardings
    elif isinstance(plan, Mapping):
        entries = plan.get("reshardings") or []
    else:
        entries = [{"tensor": t, "to": r.target.to_json(), "steps": [s.to_json() for s in r.steps]}
                   for t, _, _, r in plan_reshardings(forward, bytes_moved_price(forward.mesh))]
    steps: dict[tuple[str, Sharding], list[Sharding]] = {}
    for entry in entries:
        if entry["tensor"] in forward.graph.tensors and entry["steps"]:
            path = [entry["steps"][0]["before"]] + [s["after"] for s in entry["steps"]]
            steps[entry["tensor"], Sharding.parse(entry["to"])] = [Sharding.parse(s) for s in path]
    return steps


def _plan_mesh(plan: Any) -> Mesh:
    if isinstance(plan, PlanResult):
        return plan.plan.mesh
    if isinstance(plan, Plan):
        return plan.mesh
    if isinstance(plan, Mapping):
        axes = (plan.get("mesh") or {}).get("axes")
        if not isinstance(axes, list) or not all(isinstance(a, dict) and "name" in a and "size" in a for a in axes):
            raise InputError('expected the plan document\'s mesh as {"axes": [{"name": ..., "size": ...}]}', "/mesh")
        return Mesh(tuple(a["name"] for a in axes), tuple(a["size"] for a in axes))
    raise InputError(f"expected a Plan, a PlanResult or a plan.json document, got {type(plan).__name__}", "plan")


def check_mesh(mesh: Mesh, device_mesh: Any) -> Mesh:
    names = tuple(device_mesh.mesh_dim_names or ())
    sizes = tuple(device_mesh.mesh.shape)
    problems = []
    if names != mesh.axis_names:
        missing = [a for a in mesh.axis_names if a not in names]
        problems.append(Problem(f"device_mesh/{missing[0] if missing else names}",
                                f"the device mesh's dim names {list(names)} must be the plan's axes {list(mesh.axis_names)}, in order"))
    else:
        problems += [Problem(f"device_mesh/{axis}", f"mesh axis {axis!r} has size {size} in the plan but {got} in the device mesh")
                     for axis, size, got in zip(mesh.axis_names, mesh.shape, sizes) if size != got]
    if problems:
        raise InputError(problems)
    return mesh


def _forward_plan(plan: Any, imported: ImportedProgram, mesh: Mesh) -> Plan:
    """The plan of the imported forward graph: a training plan's forward ops keep their names."""
    if isinstance(plan, PlanResult):
        plan = plan.plan
    graph = imported.graph
    if isinstance(plan, Plan):
        if plan.graph is graph:
            return plan
        document = {"ops": {op.name: option_entry(op.kind, plan.options[op.name]) for op in plan.graph.ops},
                    "tensors": {t: plan.storage[t].to_json() for t in plan.storage}}
    else:
        document = dict(plan)
        if isinstance(document.get("ops"), Mapping) and set(document["ops"]) == set(graph.op_by_name):
            return read_plan(document, graph, mesh)  # made for this graph: a contract, as in the CLI
    return plan_of_ops(document, graph, mesh)


def plan_of_ops(document: Mapping[str, Any], graph: Graph, mesh: Mesh) -> Plan:
    """The plan of `graph` from a plan document made for a graph holding its ops by name (the
    training graph of the same program, or the same program on a whole batch of which `graph`
    is one microbatch): its options, and the stored shardings of its inputs and parameters."""
    ops = document.get("ops") or {}
    tensors = document.get("tensors") or {}
    missing = [op.name for op in graph.ops if op.name not in ops]
    if missing:
        raise InputError(f"the plan has no option for ops {missing[:5]}{' ...' if len(missing) > 5 else ''} of the program: "
                         "was it made for another program, or exported with other example inputs?", "/ops")
    kept = {"ops": {op.name: ops[op.name] for op in graph.ops},
            "tensors": {t: tensors[t] for t in graph.tensors if t in tensors and graph.tensors[t].role != "intermediate"}}
    return plan_from_json(kept, graph, mesh)


TORCH_DTYPES = {ours: getattr(torch, name) for name, ours in DTYPES.items()}
BLOCKWISE = ("reshape", "broadcast_in_dim", "dot_general", "matmul", "batch_matmul", "conv1d", "conv2d", "one_hot")


class ShardedProgram(torch.nn.Module):
    def __init__(self, exported_program: Any, imported: ImportedProgram, plan: Plan, device_mesh: Any,
                 resharding_steps: dict[tuple[str, Sharding], list[Sharding]], held: Collection[str] | None = None):
        """`held`: the parameters and buffers (graph names) to hold, all of them by default."""
        super().__init__()
        self.imported, self.plan, self.device_mesh = imported, plan, device_mesh
        # (tensor, target placements) -> the placements the plan's resharding starts from, then
        # those after each of its steps, where DTensor can place them all; else DTensor goes to
        # the target its own way
        self._paths: dict[tuple[str, tuple[Any, ...]], list[tuple[Any, ...]]] = {}
        for (tensor, target), after in resharding_steps.items():
            try:
                path = [self._to_torch(s, tensor) for s in after]
                self._paths[tensor, self._to_torch(target, tensor)] = path
            except InputError:
                continue
        self._placements = {name: tuple(s.to_torch() for s in placement_specs(plan.produced(name), plan.mesh, name))
                            for name in plan.graph.tensors}
        self._required = {op.name: [self._to_torch(plan.required(op, i), t) for i, t in enumerate(op.inputs)]
                          for op in plan.graph.ops}
        self.mismatches: list[str] = []  # ops whose result DTensor placed otherwise than the plan
        self._stored: dict[str, str] = {}  # graph name -> qualified name of the parameter or buffer
        self._whole_buffers: dict[str, Any] = {}  # whole values of the buffers, which training does not change
        for name, target in imported.parameters.items():
            if held is not None and name not in held:
                continue
            value = stored_value(exported_program, target)
            stored = _distribute(value.detach(), device_mesh, self._placements[name])
            if plan.graph.tensors[name].role == "parameter":
                stored = torch.nn.Parameter(stored, requires_grad=value.requires_grad)
                if stored.requires_grad:
                    stored.register_post_accumulate_grad_hook(_reduce_gradient)
            attach(self, target, stored, plan.graph.tensors[name].role == "parameter")
            if plan.graph.tensors[name].role != "parameter":
                self._whole_buffers[name] = value.detach()
            self._stored[name] = target

    def _to_torch(self, sharding: Sharding, tensor: str) -> tuple[Any, ...]:
        return tuple(s.to_torch() for s in placement_specs(sharding, self.plan.mesh, tensor))

    def stored(self, tensor: str) -> Any:
        """The DTensor of a parameter or buffer, by graph name."""
        return self.get_parameter(self._stored[tensor]) if self.plan.graph.tensors[tensor].role == "parameter" \
            else self.get_buffer(self._stored[tensor])

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        values, whole = self._inputs(args, kwargs)
        placed = self._run(self.imported.steps, values, whole)
        outputs = [placed(t, self._to_torch(self.plan.final(t), t)) for t in self.imported.outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _run(self, steps: list[Any], values: dict[str, Any],
             whole: dict[str, Any]) -> Callable[[str, tuple[Any, ...]], Any]:
        """Run `steps` on `values` (DTensors by graph name, the results added); returns the
        function placing a value as asked, through the plan's resharding steps."""
        producers = self.plan.graph.producers
        moved: dict[tuple[str, tuple[Any, ...]], Any] = {}  # a value resharded once for all its consumers, as planned

        def placed(tensor: str, placements: tuple[Any, ...]) -> Any:
            value = values[tensor]
            if tuple(value.placements) == placements:
                return value
            if (tensor, placements) not in moved:
                source, *path = self._paths.get((tensor, placements), [value.placements, placements])
                if tuple(value.placements) != source and (tensor, source) in self._paths:
                    value = placed(tensor, source)  # the plan reshards a copy it resharded before
                for step in path:
                    value = value if tuple(value.placements) == step else value.redistribute(self.device_mesh, step)
                moved[tensor, placements] = value.redistribute(self.device_mesh, placements) \
                    if tuple(value.placements) != placements else value
            return moved[tensor, placements]

        for step in steps:
            if step.opaque:
                self._run_opaque(step, values, whole, placed)
                continue
            (name,) = step.outputs
            required = self._required[name]
            inputs = [placed(t, placements) for t, placements in zip(step.inputs, required)]
            local = self._local_shape(name)
            if local is None and self._splits_keys(producers[name]):
                raise self._uneven_key_split(name)
            if local is not None and self._by_blocks(producers[name]):
                result = self._run_blocks(step, inputs, name, local)
            else:
                result = step.call(*inputs)
            planned = self._placements[name]
            if not isinstance(result, DTensor):  # an op of no inputs (an iota): each device keeps its block
                result = _distribute(result, self.device_mesh, planned)
            result = _average_as_sum(result, planned, self.device_mesh)
            if not _same_placements(tuple(result.placements), planned):
                self.mismatches.append(f"{name} ({producers[name].kind}): DTensor gave {list(result.placements)}, "
                                       f"the plan {list(planned)}")
                result = result.redistribute(self.device_mesh, planned)
            values[name] = result
        return placed

    def _local_shape(self, tensor: str) -> tuple[int, ...] | None:
        """Each device's block of `tensor` as planned, if every split dim divides evenly."""
        sharding = self.plan.produced(tensor)
        shape = []
        for d, size in enumerate(self.plan.graph.tensors[tensor].shape):
            parts = self.plan.mesh.group_size(sharding.dim_axes(d)) if sharding.dim_axes(d) else 1
            if size % parts:
                return None
            shape.append(size // parts)
        return tuple(shape)

    def _by_blocks(self, op: Any) -> bool:
        """Whether each device runs the op on its own blocks, as the plan's partitioned program
        does, rather than through DTensor's sharding propagation.

        DTensor runs `linear`, `matmul` and attention's math form as views that flatten dims
        (batch and sequence into rows, heads into features), and refuses to flatten a sharded
        dim that is not the leading one, or a dim split over several mesh dims (a strided
        placement); its convolution takes few layouts. These ops go by blocks, where a block's
        result is the result's block: a reshape (the plan only splits its major loops), a
        contraction or a convolution (a split reduction leaves the partial sum the plan says;
        the plans DTensor runs never split a convolution's windows: that needs halos), attention while its queries stay whole (the
        causal mask needs global query positions), and attention splitting its keys (its
        combine, `context_parallel`) or passing them around a ring (`ring_attention`). A
        broadcast goes by blocks too: DTensor keeps a broadcast dim replicated where the plan
        may split it. A one-hot goes by blocks too (DTensor has no rule for it; its class loop
        is never split, so a block's ids give the block's rows). The other ops go through
        DTensor, which checks the plan.
        """
        if op.kind in BLOCKWISE:
            return True
        return op.kind == "attention" and not self.plan.options[op.name].loop_axes[QUERY_LOOP] or self._splits_keys(op)

    def _splits_keys(self, op: Any) -> bool:
        """Whether the op is an attention that splits its key loop or passes its keys around a
        ring (either way each rank holds a block of the keys)."""
        option = self.plan.options[op.name]
        return op.kind == "attention" and (bool(option.loop_axes[KEY_LOOP]) or option.ring is not None)

    def _uneven_key_split(self, tensor: str) -> InputError:
        op = self.plan.graph.producers[tensor]
        return InputError(f"attention op {op.name!r} splits its key loop (context parallelism) and its result "
                          f"{tensor!r} {list(self.plan.graph.tensors[tensor].shape)} unevenly as "
                          f"{self.plan.produced(tensor)}, which the DTensor run does not take: plan even splits",
                          f"/ops/{op.name}/option")

    def _run_blocks(self, step: Any, inputs: list[Any], tensor: str, local: tuple[int, ...]) -> Any:
        op = self.plan.graph.producers[tensor]
        blocks = [x.to_local(grad_placements=self._block_grad_placements(op, i, x.placements)) for i, x in enumerate(inputs)]
        if self._splits_keys(op):
            block = self._context_parallel(op, blocks)
        else:
            block = call_at_shape(step, op.kind, blocks, local)
        shape = self.plan.graph.tensors[tensor].shape
        strides = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        return DTensor.from_local(block, self.device_mesh, self._placements[tensor],
                                  run_check=False, shape=torch.Size(shape), stride=tuple(strides))

    def _context_parallel(self, op: Any, blocks: list[Any]) -> Any:
        """The rank's block of an attention holding a block of the keys: ringed or combined."""
        option = self.plan.options[op.name]
        lengths = (op.nest.extents[QUERY_LOOP], op.nest.extents[KEY_LOOP])
        if option.ring is None:
            return key_split_attention(op.name, blocks, op.attrs, option.loop_axes[QUERY_LOOP],
                                       option.loop_axes[KEY_LOOP], lengths, self.device_mesh)
        keys_dim = loop_position(op.nest.maps[3], KEY_LOOP, op.nest.extents) if len(op.inputs) == 4 else None
        return ring_attention(op.name, blocks, op.attrs, option.loop_axes[QUERY_LOOP], option.ring, lengths,
                              keys_dim if isinstance(keys_dim, int) and keys_dim >= 0 else None, self.device_mesh)

    def _block_grad_placements(self, op: Any, index: int, placements: tuple[Any, ...]) -> tuple[Any, ...]:
        """The placements of the gradient of a block input: as the input, except over a mesh axis
        that splits a loop the input does not depend on, where each device's gradient is a
        partial sum (autograd's default would take it as replicated)."""
        used = set(self.plan.options[op.name].used_axes())
        read = set(self.plan.required(op, index).used_axes())
        return tuple(Partial("sum") if axis in used - read and isinstance(p, Replicate) else p
                     for axis, p in zip(self.plan.mesh.axis_names, placements))

    def _inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The values of the graph's inputs, laid out as planned, and the whole values every rank
        already holds (plain-tensor arguments and buffers), which opaque ops read as they are."""
        given = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        names = self.imported.user_inputs
        if len(given) != len(names):
            raise InputError(f"expected {len(names)} tensor argument(s) {names}, got {len(given)}", "forward")
        values: dict[str, Any] = {}
        whole = {name: value for name, value in zip(names, given) if not isinstance(value, DTensor)}
        whole |= self._whole_buffers
        for name, value in zip(names, given):
            placements = self._placements[name]
            values[name] = value.redistribute(self.device_mesh, placements) if isinstance(value, DTensor) \
                else _distribute(value, self.device_mesh, placements)
        return values | self._held_values(), whole

    def _held_values(self) -> dict[str, Any]:
        """The stored parameters and buffers, and the program's numbers, as DTensors by graph name."""
        values = {name: self.stored(name) for name in self._stored}
        for name, (number, dtype) in self.imported.scalars.items():
            value = torch.tensor(number, dtype=TORCH_DTYPES[dtype])
            values[name] = _distribute(value, self.device_mesh, self._placements[name])
        return values

    def _run_opaque(self, step: Any, values: dict[str, Any], whole: dict[str, Any], placed: Any) -> None:
        """PyTorch computes an opaque node on whole values; the result is replicated, as pinned.
        A value held whole by every rank is read as it is; any other is replicated first (the
        importer pins what opaque ops read, so that moves data only for a graph output, which the
        plan replicates at the end anyway)."""
        replicated = (Replicate(),) * self.device_mesh.ndim
        inputs = [whole[t] if t in whole else placed(t, replicated).to_local() if isinstance(values[t], DTensor)
                  else values[t] for t in step.inputs]
        result = step.call(*inputs)
        results = result if isinstance(result, (tuple, list)) else [result]
        for name, value in zip(step.outputs, results):
            if name:
                values[name] = DTensor.from_local(value, self.device_mesh, [Replicate()] * self.device_mesh.ndim,
                                                  run_check=False)


def stored_value(exported_program: Any, target: str) -> Any:
    """The value of a parameter, buffer or constant of the program, by qualified name."""
    state = exported_program.state_dict
    return state[target] if target in state else exported_program.constants[target]


def attach(module: Any, target: str, value: Any, parameter: bool) -> None:
    """Register under the fully qualified name, so `named_parameters()` lists `layers.0.wq.weight`."""
    *path, leaf = target.split(".")
    owner: torch.nn.Module = module
    for part in path:
        if not hasattr(owner, part):
            owner.add_module(part, torch.nn.Module())
        owner = getattr(owner, part)
    if parameter:
        owner.register_parameter(leaf, value)
    else:
        owner.register_buffer(leaf, value)


def call_at_shape(step: Any, kind: str, values: list[Any], shape: tuple[int, ...]) -> Any:
    """The step on plain tensors whose result has `shape`: a reshape or broadcast goes to the
    shape given, not to the one recorded when the program was exported (a block, or one
    microbatch)."""
    if kind == "reshape":
        return values[0].reshape(shape)
    if kind == "broadcast_in_dim":  # the importer's broadcasts align trailing dims, as expand does
        return values[0].expand(shape)
    return step.call(*values)


def _reduce_gradient(parameter: Any) -> None:
    """A parameter's gradient laid out as the parameter: autograd leaves a replicated weight's
    gradient as partial sums over the axes its inputs were split on, which an optimizer stepping
    on each device's copy would apply unreduced. Reducing it here is the data-parallel reduction
    a training step's plan makes."""
    if tuple(parameter.grad.placements) != tuple(parameter.placements):
        parameter.grad = parameter.grad.redistribute(parameter.device_mesh, parameter.placements)


def _distribute(value: Any, device_mesh: Any, placements: tuple[Any, ...]) -> Any:
    """Each rank keeps its own shard of the whole value it holds (every rank holds the same
    parameters and arguments), so laying a value out moves no data."""
    return distribute_tensor(value, device_mesh, placements, src_data_rank=None)


def _same_placements(got: tuple[Any, ...], planned: tuple[Any, ...]) -> bool:
    """Equal, counting DTensor's own kinds of partial value (an embedding's masked partial sum)
    as the plain partial value of the same reduction: they are reduced alike, and DTensor does
    not allow redistributing into a partial placement."""
    return tuple(map(_plain, got)) == tuple(map(_plain, planned))


def _plain(p: Any) -> Any:
    return Partial(p.reduce_op) if isinstance(p, Partial) else p


def _average_as_sum(result: Any, planned: tuple[Any, ...], device_mesh: Any) -> Any:
    """A mean over a split dim: DTensor leaves each device's own mean, a partial average, where
    the plan (as the op table's mean, which divides by the global count) has a partial sum of
    sum / count. Over evenly split dims the two differ by the group size, a local rescaling."""
    got = tuple(result.placements)
    averaged = [i for i, (g, p) in enumerate(zip(got, planned))
                if isinstance(g, Partial) and isinstance(p, Partial) and g.reduce_op == "avg" and p.reduce_op == "sum"]
    if not averaged or any(_plain(g) != _plain(p) for i, (g, p) in enumerate(zip(got, planned)) if i not in averaged):
        return result
    group = math.prod(device_mesh.size(i) for i in averaged)
    # the gradient coming back is each device's share of the whole mean's (divided by the group
    # with the rescaling): summed over the group, not averaged as the result's placements say
    grad_placements = tuple(Partial("sum") if i in averaged else p for i, p in enumerate(got))
    return DTensor.from_local(result.to_local(grad_placements=grad_placements) / group, device_mesh, planned,
                              run_check=False, shape=result.shape, stride=result.stride())

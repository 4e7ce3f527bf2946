"""DTensor on CPU in one process for the frontend tests: the fake process group with every rank
simulated by LocalTensorMode (private torch APIs, pinned by the torch version), a log of the
collectives DTensor issues with their bytes, and plans that must shard.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch
import torch.distributed as dist
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils import swap_tensors
from torch.utils._python_dispatch import TorchDispatchMode

import autoshard
from autoshard.planning.make_plan import PlanResult
from autoshard.ops.nn import KEY_LOOP
from autoshard.planning.options import ShardingOption, local_extents
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding

# DTensor's functional collectives -> the resharding step kinds of our plans
COLLECTIVES = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
               "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all"}


@contextlib.contextmanager
def simulated_ranks(mesh_text: str) -> Iterator[Any]:
    """A DeviceMesh of the plan's axes over fake ranks, all of them computed in this process."""
    mesh = autoshard.Mesh.parse(mesh_text)
    world = math.prod(mesh.shape)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        with LocalTensorMode(frozenset(range(world))):
            yield init_device_mesh("cpu", mesh.shape, mesh_dim_names=mesh.axis_names)
    finally:
        dist.destroy_process_group()


def per_rank_copies(module: Any) -> None:
    """Give each simulated rank its own copy of every parameter (its gradient kept). A value laid out without moving
    data keeps one plain local tensor that all simulated ranks share, so an optimizer updating it
    in place (and its state made like it) would apply the update once per rank."""
    for parameter in module.parameters():
        local = parameter._local_tensor
        if not isinstance(local, LocalTensor):
            copies = LocalTensor({rank: local.clone() for rank in range(parameter.device_mesh.size())})
            own = DTensor.from_local(copies, parameter.device_mesh, parameter.placements, run_check=False,
                                     shape=parameter.shape, stride=parameter.stride())
            copy = torch.nn.Parameter(own, requires_grad=parameter.requires_grad)
            copy.grad = parameter.grad
            swap_tensors(parameter, copy)


@dataclass(frozen=True)
class Collective:
    """One collective over one group of devices, as each device sees it."""

    kind: str  # our step kind
    group_size: int
    input_bytes: int  # per device

    def received_bytes(self) -> float:
        """What a device receives under the ring algorithms both sides assume."""
        n, b = self.group_size, self.input_bytes
        return {"all_gather": b * (n - 1), "reduce_scatter": b * (n - 1) / n,
                "all_reduce": 2 * b * (n - 1) / n, "all_to_all": b * (n - 1) / n}[self.kind]


class CollectiveLog(TorchDispatchMode):
    """Every functional collective DTensor issues, with its group size and local input bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.collectives: list[Collective] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func._overloadpacket.__name__
        if func.namespace == "_c10d_functional" and name in COLLECTIVES:
            group = _resolve_process_group(args[-1] if isinstance(args[-1], str) else kwargs["group_name"])
            x = args[0]
            self.collectives.append(Collective(COLLECTIVES[name], group.size(), x.numel() * x.element_size()))
        return out


def planned_collectives(result: PlanResult | Mapping[str, Any]) -> list[Collective]:
    """The reshardings of a plan (or of the document of its plan.json), each step over several
    mesh axes as one collective per axis (as DTensor redistributes, one mesh dim at a time), each
    axis seeing the bytes the ones before it left; steps that move no data (all_slice) are left out."""
    if isinstance(result, PlanResult):
        mesh, reshardings = result.plan.mesh, result.report.reshardings
    else:
        axes = result["mesh"]["axes"]
        mesh = autoshard.Mesh(tuple(a["name"] for a in axes), tuple(a["size"] for a in axes))
        reshardings = result["reshardings"]
    out = []
    for resharding in reshardings:
        for step in resharding["steps"]:
            if step["kind"] not in COLLECTIVES.values():
                continue
            size = step["bytes_per_device"]
            for axis in step["mesh_axes"]:
                n = mesh.axis_size(axis)
                out.append(Collective(step["kind"], n, int(size)))
                size = size * n if step["kind"] == "all_gather" else size / n if step["kind"] == "reduce_scatter" else size
    return out


def attention_collectives(plan: Plan) -> list[Collective]:
    """The collectives attention ops run themselves, beside the plan's reshardings: a key split's
    combine (all_reduce max, sum, sum over each key axis, at the local rows [B, H, S] and values
    [B, H, S, E]); a ring's rotations (the K and the V block at each of its n - 1 steps, sent as
    an all_to_all_single with one peer)."""
    out = []
    for op in plan.graph.ops:
        if op.kind != "attention":
            continue
        option = plan.options[op.name]
        b, h, s, e, t, d = local_extents(op.nest, option, plan.mesh)
        itemsize = plan.graph.tensors[op.inputs[0]].itemsize
        if option.ring is not None:
            n = plan.mesh.axis_size(option.ring)
            out += [Collective("all_to_all", n, b * h * (t // n) * width * itemsize)
                    for _ in range(n - 1) for width in (d, e)]
        for axis in option.loop_axes[KEY_LOOP]:
            rows = b * h * s * itemsize
            out += [Collective("all_reduce", plan.mesh.axis_size(axis), size) for size in (rows, rows, rows * e)]
    return out


def traffic(collectives: list[Collective]) -> dict[str, tuple[int, float]]:
    """kind -> (count, bytes each device receives in all of them)."""
    out: dict[str, tuple[int, float]] = {}
    for c in collectives:
        count, received = out.get(c.kind, (0, 0.0))
        out[c.kind] = (count + 1, received + c.received_bytes())
    return out


def replicated_peak_bytes(graph: Any, mesh: Any) -> int:
    """Per-device peak memory of the plan that splits nothing."""
    plan = Plan(graph, mesh, {op.name: ShardingOption.replicated(op.nest.num_loops) for op in graph.ops},
                {t.name: Sharding() for t in graph.tensors.values() if t.role != "intermediate"})
    return autoshard.estimate(plan, autoshard.bind_hardware("dgx-h100", mesh)).peak_memory_bytes


def sharded_plan(document: dict[str, Any], mesh_text: str, fraction: float = 0.9,
                 memory_s_per_byte: float = 1e-8) -> PlanResult:
    """A plan whose memory budget is `fraction` of the replicated footprint, so it must shard.

    The objective also charges each byte held (10 ns per byte by default): at these tiny shapes
    an H100's step time hardly depends on the plan, and a tight budget alone makes the solver
    spend a minute proving its optimum, while the charge lets it find the sharded plan in about
    a second.
    """
    mesh = autoshard.Mesh.parse(mesh_text)
    graph = autoshard.load_graph(document, mesh)
    budget = fraction * replicated_peak_bytes(graph, mesh)
    settings = autoshard.SolveSettings(time_limit_s=20, deterministic=True, memory_budget_bytes=budget, mesh_order_splits=True,
                                       weights=autoshard.Weights(memory_s_per_byte=memory_s_per_byte))
    return autoshard.make_plan(graph, mesh, autoshard.bind_hardware("dgx-h100", mesh), settings)

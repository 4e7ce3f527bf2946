"""One rank of the gloo smoke test: a real process group over loopback, the plan from plan.json's
document applied to a fresh export of the same module."""

from __future__ import annotations

import json
import warnings
from pathlib import Path


def run_rank(rank: int, world: int, port: int, plan_path: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    from autoshard.frontends.torch import parallelize
    from support.torch_models import examples, exported

    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        module, args = examples()["mlp"]
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        program = parallelize(exported(module, args), json.loads(Path(plan_path).read_text()), mesh)
        with CommDebugMode() as comm:
            out = program(*args)
        full = out.full_tensor()
        error = float((full - module(*args)).abs().max())
        counts = {str(op).rsplit(".", 1)[-1]: n for op, n in comm.get_comm_counts().items()}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"max_error": error, "collectives": counts}))
    finally:
        dist.destroy_process_group()

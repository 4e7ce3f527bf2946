"""Plan a Llama at its real width without its weights, then run the plan under torchrun.

Step 1, once, in one process: the model is built under `torch.device("meta")` (shapes and dtypes,
no memory), exported, imported and planned; the plan is written as plan.json.

    python examples/torchrun_llama.py plan --size 8b-layer --mesh dp=2,tp=4 --topology dgx-h100 -o plan.json

Step 2, on the machine, one process per device (`torchrun` sets RANK, WORLD_SIZE, MASTER_ADDR):
each builds the real model (the same config; the same seed, so every rank holds the same weights
before sharding), exports it, and runs it as the plan places every value.

    torchrun --nproc-per-node 8 examples/torchrun_llama.py run --size 8b-layer --plan plan.json

`run` uses NCCL and one GPU per rank when CUDA is there, else gloo on CPU; `--check` compares
the sharded output with the unsharded model's on every rank (the whole model on each rank: small
sizes only) and writes `rank<N>.json` with the error to `--report-dir`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import transformers

# name -> LlamaConfig fields and the example batch (batch, sequence)
SIZES = {
    # one layer of Llama 3 8B: hidden 4096, 32 query and 8 key/value heads, MLP 14336, vocabulary 128256
    "8b-layer": (dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=1,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192), (8, 4096)),
    # the same shape of model, small enough to check against the unsharded one on CPU
    "tiny": (dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64), (4, 16)),
}


def build(size: str, device: str | torch.device) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model and an example batch of token ids, on `device` ("meta": no memory is allocated)."""
    fields, (batch, sequence) = SIZES[size]
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields)).eval()
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, fields["vocab_size"], (batch, sequence), generator=generator).to(device)
    return model, tokens


def export(model: torch.nn.Module, tokens: torch.Tensor):
    return torch.export.export(model, (tokens,), {"use_cache": False})


def plan(args: argparse.Namespace) -> int:
    import autoshard
    from autoshard.delivery.document import plan_document
    from autoshard.frontends.torch import import_program

    model, tokens = build(args.size, "meta")
    imported = import_program(export(model, tokens))
    mesh = autoshard.Mesh.parse(args.mesh)
    graph = autoshard.load_graph(imported.document, mesh)
    hardware = autoshard.bind_hardware(args.topology, mesh)
    settings = autoshard.SolveSettings(time_limit_s=args.time_limit, memory_budget_bytes=args.memory_budget,
                                       mesh_order_splits=True)  # placements DTensor can express
    result = autoshard.make_plan(graph, mesh, hardware, settings)
    Path(args.output).write_text(json.dumps(plan_document(result, args.topology)))
    print(f"wrote {args.output}: step {result.report.step_s * 1e3:.4g} ms, peak memory "
          f"{result.report.peak_memory_bytes / 2**30:.3g} GiB per device on {args.mesh}")
    return 0


def run(args: argparse.Namespace) -> int:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from autoshard.frontends.torch import parallelize

    document = json.loads(Path(args.plan).read_text())
    axes = document["mesh"]["axes"]
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        rank = dist.get_rank()
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        mesh = init_device_mesh(device.type, tuple(a["size"] for a in axes),
                                mesh_dim_names=tuple(a["name"] for a in axes))
        model, tokens = build(args.size, device)
        program = parallelize(export(model, tokens), document, mesh)
        with torch.no_grad():
            logits = program(tokens)
        full = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
        if args.check:
            with torch.no_grad():
                error = float((full - model(tokens, use_cache=False).logits).abs().max())
            Path(args.report_dir).mkdir(parents=True, exist_ok=True)
            Path(args.report_dir, f"rank{rank}.json").write_text(json.dumps(
                {"rank": rank, "world": dist.get_world_size(), "max_error": error, "shape": list(full.shape)}))
            print(f"rank {rank}: logits {tuple(full.shape)}, max error against the unsharded model {error:.3g}")
    finally:
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    planning = sub.add_parser("plan", help="plan the model built on the meta device")
    planning.add_argument("--size", choices=sorted(SIZES), default="8b-layer")
    planning.add_argument("--mesh", required=True, help="e.g. dp=2,tp=4")
    planning.add_argument("--topology", default="dgx-h100")
    planning.add_argument("--time-limit", type=float, default=30.0)
    planning.add_argument("--memory-budget", type=float, help="bytes per device (default: the chip's HBM)")
    planning.add_argument("-o", "--output", default="plan.json")
    planning.set_defaults(handler=plan)
    running = sub.add_parser("run", help="run the plan, one process per device (under torchrun)")
    running.add_argument("--size", choices=sorted(SIZES), default="8b-layer")
    running.add_argument("--plan", required=True)
    running.add_argument("--check", action="store_true", help="compare with the unsharded model on every rank")
    running.add_argument("--report-dir", default=".")
    running.set_defaults(handler=run)
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())

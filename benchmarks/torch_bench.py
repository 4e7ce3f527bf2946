"""Plan torch-exported LLaMA-shaped models beside the generated graph of the same shape and print a
markdown table: export, import and plan seconds, the plan's step time, certified gap and peak memory
per device.

    python benchmarks/torch_bench.py --layers 2 4 32 --mesh tp=8 dp=2,tp=4
    python benchmarks/torch_bench.py --layers 2 --mesh tp=8 --training

The torch model is transformers' LlamaForCausalLM at 7B width (hidden 4096, 32 heads, 8 key/value
heads, ffn 11008, vocab 32000, bf16), built on the meta device (no weights are allocated) and
exported at batch 8, sequence 4096. The generated model is `autoshard generate gpt --style llama`
of the same width, which has no key/value groups and no rotary embedding.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

from autoshard.frontends.torch import import_program
from autoshard.frontends.torch.runtime import require_torch
from autoshard.graph.schema import graph_from_json
from autoshard.graph.summary import size
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.solver.heuristic import compile_kernels

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, SEQ, BATCH = 4096, 32, 8, 11008, 32000, 4096, 8


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, nargs="+", default=[2, 4, 32])
    p.add_argument("--mesh", nargs="+", default=["tp=8", "dp=2,tp=4"], help="meshes such as dp=2,tp=4")
    p.add_argument("--training", action="store_true", help="the whole training step, not just the forward")
    p.add_argument("--topology", default="dgx-h100")
    p.add_argument("--time-limit", type=float, default=30.0, help="solver seconds per plan (default %(default)s)")
    p.add_argument("--workers", type=int, default=2)
    return p.parse_args(argv)


def torch_graph(layers: int, training: bool) -> tuple[dict, float, float]:
    """The exported and imported document, export seconds, import seconds."""
    torch = require_torch()
    import transformers

    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN,
                                      num_hidden_layers=layers, num_attention_heads=HEADS,
                                      num_key_value_heads=KV_HEADS, max_position_embeddings=SEQ)
    started = time.perf_counter()
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
        ids = torch.zeros(BATCH, SEQ, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, (ids,), {"use_cache": False}).run_decompositions({})
        exported = time.perf_counter()
        imported = import_program(program, training=training, name=f"llama_{layers}l")
    return imported.document, exported - started, time.perf_counter() - exported


def plan(document: dict, mesh_text: str, args: argparse.Namespace) -> dict:
    graph = graph_from_json(document)
    mesh = Mesh.parse(mesh_text)
    started = time.perf_counter()
    result = make_plan(graph, mesh, bind_hardware(args.topology, mesh),
                       SolveSettings(time_limit_s=args.time_limit, workers=args.workers))
    return {"ops": len(graph.ops), "plan_s": time.perf_counter() - started, "step_s": result.report.step_s,
            "gap": result.solver["gap"], "status": result.solver["status"], "peak": result.report.peak_memory_bytes}


HEADER = ("| layers | mesh | graph | ops | export s | import s | plan s | step time | gap | peak memory / device |\n"
          "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


def row(layers: int, mesh: str, source: str, r: dict) -> str:
    gap = "optimal" if r["status"] == "optimal" else f"{100 * r['gap']:.2f}%"
    seconds = lambda key: f"{r[key]:.1f}" if key in r else "-"  # noqa: E731
    return (f"| {layers} | {mesh} | {source} | {r['ops']} | {seconds('export_s')} | {seconds('import_s')} "
            f"| {r['plan_s']:.1f} | {1e3 * r['step_s']:.2f} ms | {gap} | {size(r['peak'])} |")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    kind = "training step" if args.training else "forward"
    print(f"LLaMA 7B width ({kind}), batch {BATCH}, seq {SEQ}, {args.topology}, solver limit {args.time_limit:g} s, "
          f"{args.workers} workers\n")
    print(HEADER, flush=True)
    compile_kernels()  # times of a warm process: the solver's one-off compilation is not any plan's
    for layers in args.layers:
        document, export_s, import_s = torch_graph(layers, args.training)
        generated = gpt(GPTConfig(layers=layers, hidden=HIDDEN, heads=HEADS, seq=SEQ, batch=BATCH, vocab=VOCAB,
                                  ffn=FFN, style="llama"), training=args.training)
        for mesh_text in args.mesh:
            print(row(layers, mesh_text, "torch.export", plan(document, mesh_text, args) | {"export_s": export_s,
                                                                                           "import_s": import_s}),
                  flush=True)
            print(row(layers, mesh_text, "generated", plan(generated, mesh_text, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

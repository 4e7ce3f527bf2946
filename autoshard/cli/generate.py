"""`autoshard generate {gpt,mlp,moe,unet} ... [--training [--precision P]] -o FILE`: write a model's graph document."""

from __future__ import annotations

import argparse
from typing import Any, Callable

from autoshard.cli.args import integer_flag, number_flag, write_graph
from autoshard.errors import InputError, Problem
from autoshard.graph.schema import graph_from_json
from autoshard.models import GPTConfig, MLPConfig, MoEConfig, UNetConfig, gpt, mlp, moe, unet
from autoshard.models.gpt import STYLES
from autoshard.models.training import DEFAULT_PRECISION, PRECISIONS, training_precision


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("generate", help="write the graph of a model (forward, or a whole training step)")
    models = parser.add_subparsers(dest="model", metavar="MODEL", required=True)

    defaults = GPTConfig()
    p = _model_parser(models, "gpt", "decoder-only transformer, GPT or LLaMA style", defaults)
    for flag in ("layers", "hidden", "heads", "seq", "batch", "vocab", "ffn"):
        _int(p, flag, defaults)
    p.add_argument("--style", default=defaults.style, help=f"one of {', '.join(STYLES)} (default %(default)s)")
    _int(p, "kv_heads", defaults, "K/V heads, each shared by heads / kv-heads query heads (1: multi-query; default heads)")
    _int(p, "moe_experts", defaults, "routed experts in every layer's MLP (default 0: a dense MLP)")
    _int(p, "moe_top_k", defaults, "experts each token is routed to (default %(default)s)")
    _int(p, "moe_ffn", defaults, "features of each expert's MLP (fine-grained experts: many narrow ones; default ffn)")
    _int(p, "moe_shared_experts", defaults, "experts every token goes through besides the routed ones (default 0)")
    p.add_argument("--moe-capacity-factor", type=number_flag, default=defaults.moe_capacity_factor,
                   help="expert slots per routed token (default %(default)s)")
    _int(p, "moe_group_size", defaults, "tokens routed together, each group with its own capacity (default seq)")
    _int(p, "balanced_over", defaults, "store the sequence in the load-balanced causal layout for N context-parallel "
                                       "devices: chunks i and 2N-1-i together (default: the sequence's own order)")
    p.set_defaults(run=_runner(GPTConfig, gpt))

    defaults = MLPConfig()
    p = _model_parser(models, "mlp", "stack of two-matmul MLP blocks", defaults)
    for flag in ("layers", "batch", "hidden", "ffn"):
        _int(p, flag, defaults)
    p.add_argument("--activation", default=defaults.activation, help="elementwise op between the matmuls (default %(default)s)")
    p.set_defaults(run=_runner(MLPConfig, mlp))

    defaults = MoEConfig()
    p = _model_parser(models, "moe", "mixture-of-experts layers, experts as a loop", defaults)
    for flag in ("layers", "batch", "seq", "hidden", "ffn", "experts", "top_k"):
        _int(p, flag, defaults)
    p.add_argument("--capacity-factor", type=number_flag, default=defaults.capacity_factor,
                   help="expert slots per routed token (default %(default)s)")
    _int(p, "group_size", defaults, "tokens routed together, each group with its own capacity (default seq)")
    p.add_argument("--activation", default=defaults.activation, help="expert MLP activation (default %(default)s)")
    p.set_defaults(run=_runner(MoEConfig, moe))

    defaults = UNetConfig()
    p = _model_parser(models, "unet", "U-Net of 3x3 convolutions, 2x2 max pooling and skip connections", defaults)
    for flag in ("levels", "batch", "height", "width", "channels", "base", "out_channels"):
        _int(p, flag, defaults)
    p.set_defaults(run=_runner(UNetConfig, unet))


def _model_parser(models: argparse._SubParsersAction, name: str, help: str, defaults: Any) -> argparse.ArgumentParser:
    p = models.add_parser(name, help=help, description=help)
    p.add_argument("-o", "--output", required=True, help="graph JSON file to write")
    p.add_argument("--dtype", help=f"element type of activations and weights (default: the one --precision computes "
                                   f"in, else {defaults.dtype})")
    p.add_argument("--training", action="store_true",
                   help="the whole training step: forward, loss, backward, Adam update")
    p.add_argument("--precision", choices=list(PRECISIONS), metavar="PRECISION",
                   help="with --training, what is kept in which float: "
                        + "; ".join(f"{name}: {mode.doc}" for name, mode in PRECISIONS.items())
                        + f" (default {DEFAULT_PRECISION}). bf16-mixed, fp16-mixed and fp32 compute in bf16, f16 and "
                          f"f32, which is --dtype's default with them and the only --dtype they take")
    return p


def _dtype(args: argparse.Namespace, default: str) -> str:
    """The dtype the model computes in, from --dtype and --precision (which must agree)."""
    if args.precision is None:
        return args.dtype or default
    if not args.training:
        raise InputError("sets the precision of the training step; add --training", "--precision")
    wanted = PRECISIONS[args.precision].dtype
    if wanted is None:
        return args.dtype or default
    if args.dtype is not None and args.dtype != wanted:
        raise InputError(f"--precision {args.precision} computes in {wanted}, but --dtype asks for {args.dtype}: "
                         f"drop --dtype or pick a precision that computes in {args.dtype}", "--dtype")
    return wanted


def _int(parser: argparse.ArgumentParser, field: str, defaults: Any, help: str | None = None) -> None:
    default = getattr(defaults, field)
    parser.add_argument(_flag(field), dest=field, type=integer_flag, default=default,
                        help=help or (f"default {default}" if default is not None else "default 4 * hidden"))


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _runner(config_type: type, generate: Callable[..., dict[str, Any]]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        fields = {f: getattr(args, f) for f in config_type.__dataclass_fields__}
        fields["dtype"] = _dtype(args, config_type.__dataclass_fields__["dtype"].default)
        try:
            config = config_type(**fields)
        except InputError as error:
            raise InputError([Problem(_flag(p.where), p.message) for p in error.problems]) from None
        with training_precision(args.precision or DEFAULT_PRECISION):
            document = generate(config, training=args.training)
        graph = graph_from_json(document)
        write_graph(document, graph, args.output)
        return 0
    return run

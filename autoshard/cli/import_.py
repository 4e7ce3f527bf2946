"""`autoshard import FRAMEWORK SOURCE -o graph.json [--strict] [--training [--precision P]] [--batch-dim D]
[--balanced-over N]`: a framework's program
as a graph document. One row per framework in `FRAMEWORKS`; the framework's own code lives in
`autoshard.frontends.<framework>` and is imported only when its row runs.
"""

from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable

from autoshard.cli.args import integer_flag, number_flag, write_graph
from autoshard.errors import InputError
from autoshard.graph.schema import graph_from_json
from autoshard.models.training import DEFAULT_PRECISION, PRECISIONS, training_precision


@dataclass(frozen=True)
class Framework:
    help: str
    source: str  # what SOURCE names, for --help
    # the command's arguments -> (graph document, graph, warnings)
    run: Callable[[argparse.Namespace], tuple[dict[str, Any], Any, list[str]]]
    extra_args: Callable[[argparse.ArgumentParser], None] = lambda parser: None


def _torch(args: argparse.Namespace) -> tuple[dict[str, Any], Any, list[str]]:
    from autoshard.frontends.torch.runtime import require_torch
    require_torch()
    from autoshard.frontends.torch import ExpertCapacity, export_factory, import_program

    capacity = None
    if (args.expert_capacity, args.expert_group_size, args.expert_slots) != (None, None, None):
        try:
            capacity = ExpertCapacity(args.expert_capacity if args.expert_capacity is not None else 1.25,
                                      args.expert_group_size, args.expert_slots)
        except InputError as error:
            raise InputError([replace(p, where=CAPACITY_FLAGS.get(p.where, p.where)) for p in error.problems]) from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's deprecation notices while exporting
        exported = export_factory(args.source)
    name = args.source.rpartition(":")[2]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the opaque ops are printed below, once; torch's own notices are not ours
            imported = import_program(exported, strict=args.strict, training=args.training, name=name,
                                      batch_dim=args.batch_dim, expert_capacity=capacity)
    except InputError as error:
        raise InputError([replace(p, where=CAPACITY_FLAGS.get(p.where, p.where)) for p in error.problems]) from None
    return imported.document, imported.graph, imported.warnings


CAPACITY_FLAGS = {"expert_capacity": "--expert-capacity", "expert_capacity/capacity_factor": "--expert-capacity",
                  "expert_capacity/group_size": "--expert-group-size", "expert_capacity/slots": "--expert-slots"}


def _torch_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--expert-capacity", type=number_flag, metavar="FACTOR",
                        help="plan routed experts (a transformers MoE block) at a static capacity: each expert "
                             "takes FACTOR x its even share of a group's picks, picks past it dropped (GShard), "
                             "priced at top-k x FACTOR; without these flags the experts import as a dense dispatch, "
                             "every expert on every token, as the program computes")
    parser.add_argument("--expert-group-size", type=integer_flag, metavar="N",
                        help="with capacity: tokens routed together, each group with its own slots (default: a "
                             "divisor of the sequence keeping dispatch and combine near 5%% of the experts' work)")
    parser.add_argument("--expert-slots", type=integer_flag, metavar="C",
                        help="with capacity: the slots per expert and group, in place of --expert-capacity's "
                             "(the most a measured batch routes to one expert keeps the model's outputs)")


def _jax(args: argparse.Namespace) -> tuple[dict[str, Any], Any, list[str]]:
    source, strict, training, batch_dim = args.source, args.strict, args.training, args.batch_dim
    if batch_dim is not None:
        raise InputError("the JAX importer does not declare batch dims yet", "--batch-dim")
    if training:
        raise InputError("a JAX function is differentiated in JAX: import the jitted training step (jax.grad of "
                         "your loss, with the update) instead", "--training")
    from autoshard.frontends.jax import import_factory  # jax is imported only when asked for

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        document = import_factory(source, strict=strict)
    return document, graph_from_json(document), [str(w.message) for w in caught]


FRAMEWORKS: dict[str, Framework] = {
    "torch": Framework("a PyTorch module, exported with torch.export", "FILE.py:FACTORY, where FACTORY() returns "
                       "(module, args) or (module, args, kwargs)", _torch, _torch_args),
    "jax": Framework("a JAX function, traced to its jaxpr", "FILE.py:FACTORY, where FACTORY() returns (f, args), "
                     "args a tuple", _jax),
}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("import", help="a framework's program as a graph document")
    frameworks = parser.add_subparsers(dest="framework", metavar="FRAMEWORK", required=True)
    for name, framework in FRAMEWORKS.items():
        p = frameworks.add_parser(name, help=framework.help, description=framework.help)
        p.add_argument("source", help=framework.source)
        p.add_argument("-o", "--output", required=True, help="graph JSON file to write")
        p.add_argument("--strict", action="store_true", help="fail, listing them, if some ops stay opaque")
        p.add_argument("--training", action="store_true",
                       help="add a loss on the first output, the backward pass and Adam (autoshard's differentiation)")
        p.add_argument("--precision", choices=list(PRECISIONS), metavar="PRECISION",
                       help=f"with --training, what the step keeps in which float, as `generate --precision` (default "
                            f"{DEFAULT_PRECISION}: the program's own dtypes, Adam moments in f32); bf16-mixed, "
                            f"fp16-mixed and fp32 need the program's parameters in bf16, f16 and f32")
        p.add_argument("--batch-dim", type=int, metavar="D",
                       help="dim D of every argument (and of the labels) carries the batch, which --microbatches "
                            "and --pipeline split (0 for torch.distributed.pipelining)")
        p.add_argument("--balanced-over", type=integer_flag, metavar="N",
                       help="store the sequence in the load-balanced causal layout for N context-parallel devices "
                            "(chunks i and 2N-1-i together); lists the inputs to feed in that order")
        framework.extra_args(p)
        p.set_defaults(run=_runner(framework))


def _balanced(document: dict[str, Any], n: int) -> tuple[dict[str, Any], Any]:
    """The imported graph in the load-balanced causal layout, and what to feed in its order."""
    from autoshard.planning.sequence_layout import balance_layout, sequence_entries
    try:
        document = balance_layout(document, n)
    except InputError as error:  # name the flag for the layout's own problems, the op for the graph's
        raise InputError([replace(p, where="--balanced-over") if p.where == "balanced_over" else p
                          for p in error.problems]) from None
    graph = graph_from_json(document)
    fed = ", ".join(f"{name} (dim {', '.join(map(str, dims))})" for name, dims in sequence_entries(graph).items())
    print(f"load-balanced causal layout over {n}: feed and store in its order {fed}")
    return document, graph


def _runner(framework: Framework) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        if args.precision is not None and not args.training:
            raise InputError("sets the precision of the training step; add --training", "--precision")
        try:
            with training_precision(args.precision or DEFAULT_PRECISION):
                document, graph, notes = framework.run(args)
        except InputError as error:  # the precision the program's parameters do not have: name the flag
            raise InputError([replace(p, where="--precision") if p.where == "precision" else p
                              for p in error.problems]) from None
        for note in notes:
            print(f"warning: {note}")
        if args.balanced_over is not None:
            document, graph = _balanced(document, args.balanced_over)
        write_graph(document, graph, args.output)
        return 0
    return run

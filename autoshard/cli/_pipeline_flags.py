"""`plan`'s pipeline flags: `--pipeline S [--schedule gpipe|1f1b|interleaved:V|zb-h1] [--trace FILE]`,
their checks (every problem named by its flag), and the summary lines of a pipelined plan."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from autoshard.cli.args import hardware_from_args, integer_flag
from autoshard.errors import InputError, Problem
from autoshard.graph.summary import size
from autoshard.pipeline import parse_schedule
from autoshard.mesh import Mesh
from autoshard.planning.pipeline_plan import PipelineSettings, pipeline_mesh

# Where the planner names a setting -> the flag that gives it
FLAGS = {"pipeline": "--pipeline", "schedule": "--schedule", "microbatches": "--microbatches", "mesh": "--mesh"}


def add_pipeline_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pipeline", type=integer_flag, metavar="S",
                        help="cut the layers into S pipeline stages, each on its own sub-mesh with the --mesh axes "
                             "(S stages multiply the devices); needs ops with a `layer`")
    parser.add_argument("--schedule", help="pipeline schedule: gpipe, 1f1b (default), interleaved:V (V virtual "
                                           "stages per device; microbatches a multiple of S) or zb-h1")
    parser.add_argument("--trace", metavar="FILE",
                        help="write the predicted pipelined step in Trace Event Format (Perfetto, chrome://tracing)")


def pipeline_settings(args: argparse.Namespace, problems: list[Problem]) -> PipelineSettings | None:
    """The pipeline the flags ask for (None without --pipeline); its problems into `problems`."""
    if args.pipeline is None:
        problems += [Problem(flag, "needs --pipeline S") for flag, given in
                     (("--schedule", args.schedule), ("--trace", args.trace)) if given is not None]
        return None
    if args.pipeline < 1:
        problems.append(Problem("--pipeline", f"must be at least 1 stage, got {args.pipeline}"))
    if args.layer_once:
        problems.append(Problem("--layer-once", "composing layers solved once does not take --pipeline yet; "
                                                "drop one of them"))
    if args.trace is not None:
        folder = Path(args.trace).resolve().parent
        if not folder.is_dir() and not (args.output and folder == Path(args.output).resolve()):
            problems.append(Problem("--trace", f"the directory of {args.trace!r} does not exist"))
    try:
        schedule, chunks = parse_schedule(args.schedule or "1f1b")
    except InputError as error:
        problems += flagged(error).problems
        return None
    return PipelineSettings(args.pipeline, schedule, chunks)


def pipeline_hardware(args: argparse.Namespace, stage_mesh: Mesh, stages: int) -> Any:
    """The machine of `stages` stages of `stage_mesh`, bound as `pipeline_mesh` lays it out; a
    binding problem says which machine it was."""
    machine = pipeline_mesh(stage_mesh, stages)
    try:
        return hardware_from_args(args, machine)
    except InputError as error:
        raise InputError([Problem(p.where, f"{p.message} (with --pipeline {stages} the machine is {machine})")
                          for p in error.problems]) from None


def flagged(error: InputError) -> InputError:
    """`error` with each problem named by the flag that gives its setting."""
    return InputError([Problem(FLAGS.get(p.where, p.where), p.message) for p in error.problems])


def print_pipeline(section: dict[str, Any], indent: str = "  ") -> None:
    """The pipeline lines of `plan`'s summary: the schedule, the step and its bubble, then one line
    per stage with its layers, F/B/W, tail and memory."""
    stages = section["stages"]
    chunks = section["virtual_stages_per_stage"]
    schedule = section["schedule"] + (f":{chunks}" if chunks > 1 else "")
    devices = sum(len(stage["devices"]) for stage in stages)
    count = section["stage_count"]
    print(f"{indent}pipeline: {count} stage{'s' if count > 1 else ''} on {devices} devices, schedule {schedule}, "
          f"{section['microbatches']} microbatches: step {section['step_s'] * 1e3:.4g} ms "
          f"(overlapped {section['overlapped_step_s'] * 1e3:.4g} ms), "
          f"bubble {100 * section['bubble_fraction']:.1f}% of busy time; memory budget "
          f"{size(section['memory_budget_bytes_per_device'])} per device")
    for stage in stages:
        layers = ", ".join(f"{c['layers'][0]}-{c['layers'][1]}" if c["layers"][0] != c["layers"][1]
                           else str(c["layers"][0]) for c in stage["chunks"])
        memory = stage["memory"]
        tail = sum(stage["tail_s"].values())
        print(f"{indent}  stage {stage['stage']} (devices {stage['devices'][0]}-{stage['devices'][-1]}): layers {layers}; "
              f"per microbatch F {stage['forward_s'] * 1e3:.4g} ms, B {stage['backward_s'] * 1e3:.4g} ms, "
              f"W {stage['weight_s'] * 1e3:.4g} ms; tail {tail * 1e3:.4g} ms "
              f"({stage['tail_hidden_s'] * 1e3:.4g} ms of it behind the last backward); peak memory "
              f"{size(memory['peak_bytes'])} (parameters {size(memory['parameter_bytes'])}, gradients "
              f"{size(memory['gradient_bytes'])}, optimizer state {size(memory['optimizer_state_bytes'])}, "
              f"activations {size(memory['activation_bytes'])})")

"""`autoshard` command line: one module per command under `autoshard.cli`, plus the commands other
installed packages declare as `autoshard.commands` entry points (the service's `serve`).

Each command module defines `register(subparsers)`, which adds its parser and sets `run`
(a function of the parsed arguments returning an exit code). Input errors print every problem
and exit 2; no traceback reaches the user.
"""

from __future__ import annotations

import sys

try:  # a Ctrl-C while the command line is still being imported ends it as any interrupt does
    import argparse
    import os
    import importlib
    import pkgutil
    import tempfile
    import time
    import traceback
    from importlib.metadata import entry_points
    from typing import Callable, Sequence

    import autoshard
    import autoshard.cli
    from autoshard.cli.interrupts import INTERRUPTED, signals_interrupt
    from autoshard.errors import AutoshardError, InfeasibleError, InputError, Interrupted, OutOfTime
    from autoshard.phases import collect_garbage_rarely
except KeyboardInterrupt:
    print("autoshard: interrupted", file=sys.stderr)
    raise SystemExit(130) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autoshard", description="Plan how a model is sharded over a device mesh.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for _, register in sorted(_commands().items()):
        register(sub)
    return parser


NOT_COMMANDS = ("main", "args", "interrupts")  # the modules of `autoshard.cli` that are not commands


def _commands() -> dict[str, Callable[[argparse._SubParsersAction], None]]:
    """Every command's `register`, by module or entry point name."""
    found = {info.name: importlib.import_module(f"autoshard.cli.{info.name}").register
             for info in pkgutil.iter_modules(autoshard.cli.__path__)
             if not info.name.startswith("_") and info.name not in NOT_COMMANDS}
    for point in entry_points(group="autoshard.commands"):
        found.setdefault(point.name, point.load())
    return found


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()  # a command's time budget is the user's wait, imports included
    collect_garbage_rarely()
    try:
        parser = build_parser()  # imports every command's module: Ctrl-C may well land here
    except KeyboardInterrupt:
        print("autoshard: interrupted", file=sys.stderr)
        _interrupted_importing.append(True)
        return INTERRUPTED
    args = parser.parse_args(argv)
    args.command_started = started
    try:
        with signals_interrupt():
            return int(args.run(args) or 0)
    except Interrupted as error:
        print(f"autoshard {args.command}: {error}", file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:
        print(f"autoshard {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except InputError as error:
        print(f"autoshard {args.command}: {len(error.problems)} problem(s):", file=sys.stderr)
        for problem in error.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    except InfeasibleError as error:
        print(f"autoshard {args.command}: infeasible: {error}", file=sys.stderr)
        return INFEASIBLE
    except OutOfTime as error:
        print(f"autoshard {args.command}: out of time: {error}", file=sys.stderr)
        return OUT_OF_TIME
    except AutoshardError as error:
        print(f"autoshard {args.command}: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except Exception as error:  # a bug: one line for the user, the traceback in a report
        report = _write_crash_report(args)
        print(f"autoshard {args.command}: internal error, a bug in autoshard ({type(error).__name__}: {error}); "
              f"the full report is in {report}", file=sys.stderr)
        return INTERNAL_ERROR


# exit codes: 0 success, 1 a verification failed, 2 bad input, 130 interrupted (`interrupts`)
INFEASIBLE = 3  # no feasible plan
INTERNAL_ERROR = 4  # a bug
OUT_OF_TIME = 5  # a time budget ran out before any plan was found


def _write_crash_report(args: argparse.Namespace) -> str:
    with tempfile.NamedTemporaryFile("w", prefix="autoshard-crash-", suffix=".txt", delete=False) as report:
        report.write(f"autoshard {autoshard.__version__}, command line: {sys.argv}\narguments: {vars(args)}\n\n")
        report.write(traceback.format_exc())
    return report.name


# set when a Ctrl-C landed while the commands' modules were importing (`console`)
_interrupted_importing: list[bool] = []


def console() -> None:
    """The `autoshard` command: exits with `main`'s code. A Ctrl-C that lands while the commands'
    modules import is caught by `main`, yet CPython may still end the process by SIGINT at its
    shutdown (exit -2, not 130) after such an interrupt: that run leaves at once, nothing of a
    command having started."""
    code = main()
    if _interrupted_importing:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()

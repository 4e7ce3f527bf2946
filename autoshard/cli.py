"""`autoshard` command line: one module per command under `autoshard.commands`.

Each command module defines `register(subparsers)`, which adds its parser and sets `run`
(a function of the parsed arguments returning an exit code). Input errors print every problem
and exit 2; no traceback reaches the user.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import Sequence

from autoshard import commands
from autoshard.errors import AutoshardError, InfeasibleError, InputError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autoshard", description="Plan how a model is sharded over a device mesh.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        importlib.import_module(f"{commands.__name__}.{info.name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except InputError as error:
        print(f"autoshard {args.command}: {len(error.problems)} problem(s):", file=sys.stderr)
        for problem in error.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    except InfeasibleError as error:
        print(f"autoshard {args.command}: infeasible: {error}", file=sys.stderr)
        return 3
    except AutoshardError as error:
        print(f"autoshard {args.command}: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

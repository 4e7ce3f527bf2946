"""`autoshard serve [--host 127.0.0.1] [--port 8000] [--workers N] [--db PATH]`: run the plan service.

Unset flags fall back to the `AUTOSHARD_*` environment variables (`service/config.py` lists them with their defaults).
`--workers` is the number of solves run at once (one process each); the HTTP server itself is
one process, as the job runner and the plan store live in it.
"""

from __future__ import annotations

import argparse
import socket

from autoshard.cli.args import integer_flag
from autoshard.errors import AutoshardError, InputError, Problem


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="run the REST plan service")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=integer_flag, default=8000, help="port to listen on (default 8000)")
    parser.add_argument("--workers", type=integer_flag, help="solves run at once, one process each (default: the machine's cores)")
    parser.add_argument("--db", help="SQLite file for plans and job states (default autoshard-plans.sqlite3)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # the web stack is imported only by this command, so the other commands start fast
    import uvicorn
    from pydantic import ValidationError

    from service.app import create_app
    from service.config import Settings
    from service.store import Store

    if not 0 <= args.port <= 65535:
        raise InputError(f"expected a port number 0..65535, got {args.port}", "--port")
    overrides = {k: v for k, v in (("workers", args.workers), ("db", args.db)) if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as error:
        raise InputError([Problem(f"--{e['loc'][0]} (or AUTOSHARD_{str(e['loc'][0]).upper()})", e["msg"])
                          for e in error.errors()]) from None
    Store(settings.db).close()  # an unusable --db is refused here, in one line, not by the server's start-up
    listening = listening_socket(args.host, args.port)  # a port in use or an unknown host: one line, exit 2
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level=args.log_level))
    server.run(sockets=[listening])
    if not server.started:  # the app's start-up failed; uvicorn logged why
        raise AutoshardError(f"the service did not start on {args.host}:{args.port}; its log above says why")
    return 0


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` for the server to listen on, or an InputError naming the
    flag: uvicorn would log the failure and exit 3, the code of an infeasible plan."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as error:
        raise InputError(f"cannot listen on {host!r}: {error.strerror}", "--host") from None
    listening = socket.socket(family, kind, proto)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart may reuse the port
    try:
        listening.bind(address)
    except OSError as error:
        listening.close()
        raise InputError(f"cannot listen on {host}:{port}: {error.strerror}", "--port") from None
    return listening

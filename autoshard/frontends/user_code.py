"""The user's own code, run on their behalf: a `FILE.py:FACTORY` loaded and called, a module
exported or a function traced. What that code raises (a syntax or import error, an exception,
a shape mismatch, Python control flow on a traced value) is the user's to fix, not a bug of
autoshard: it becomes a `UserCodeError`, an `InputError` (exit 2, a 422) naming the file, the
line and the exception in one line. While a framework runs the user's code its own log lines
and prints (torch's multi-line tracebacks of a failed export) are held back: the error says it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

from autoshard.errors import InputError, Problem

SOURCE = "FILE.py:FACTORY"  # where a malformed factory spec is reported
MESSAGE_CHARS = 300  # an exception's message is cut to its first line and at most this long


class UserCodeError(InputError):
    """The user's file, factory or function failed; names the file, the line and the exception."""


def load_user_factory(spec: str) -> tuple[Path, Callable[[], Any]]:
    """`FILE.py:FACTORY` -> the file and its factory: the file is run as a module (its directory
    importable, so it may import its neighbours) and the factory must take no arguments."""
    path_text, sep, name = spec.rpartition(":")
    if not sep or not path_text or not name.isidentifier():
        raise InputError(f"expected FILE.py:FACTORY, got {spec!r}", SOURCE)
    path = Path(path_text)
    if not path.is_file():
        raise InputError(f"no such file: {path}", SOURCE)
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    if module_spec is None or module_spec.loader is None:
        raise InputError(f"cannot load {path} as a Python module", SOURCE)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules.setdefault(module_spec.name, module)  # so classes defined there can be found by name
    directory = str(path.parent.resolve())
    sys.path.insert(0, directory)
    try:
        with as_user_error(path, f"importing {path.name}"):
            module_spec.loader.exec_module(module)
    finally:
        sys.path.remove(directory)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise InputError(f"{path} defines no function {name!r}", SOURCE)
    _check_takes_no_arguments(path, name, factory)
    return path, factory


def call_factory(path: Path, factory: Callable[[], Any]) -> Any:
    """What `factory()` returns; what it raises is the user's error."""
    with as_user_error(path, f"{factory.__name__}()"):
        return factory()


def _check_takes_no_arguments(path: Path, name: str, factory: Callable[..., Any]) -> None:
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # builtins and some wrappers have none: calling it will tell
        return
    required = [p.name for p in signature.parameters.values()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if required:
        line = getattr(getattr(factory, "__code__", None), "co_firstlineno", None)
        where = f"{path}:{line}" if line else str(path)
        raise UserCodeError(f"{name}() must take no arguments; it needs {', '.join(required)}", where)


@contextlib.contextmanager
def as_user_error(source: Path | str | None, doing: str) -> Iterator[None]:
    """Runs the user's code: an exception escaping it (but not autoshard's own `InputError`)
    becomes a `UserCodeError` at the deepest line of `source` (the user's file) it passed
    through, `doing` saying what was being run (`make()`, `torch.export of make()'s module`)."""
    try:
        yield
    except InputError:
        raise
    except (Exception, SystemExit) as error:  # a user's sys.exit() is theirs too, not an exit code of ours
        raise UserCodeError(Problem(_location(error, source), f"{doing} raised {describe(error)}")) from error


@contextlib.contextmanager
def framework_quiet() -> Iterator[None]:
    """Holds back a framework's log records and what it prints on stderr while it runs the
    user's code; an error it raises still reaches the caller, once, through `as_user_error`."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


def describe(error: BaseException) -> str:
    """`TypeName: the first line of its message`, cut short."""
    try:
        text = str(error)
    except Exception:  # an exception whose message itself raises is still named by its type
        text = ""
    lines = text.strip().splitlines()
    message = lines[0] if lines else ""
    if isinstance(error, SyntaxError):
        message = error.msg
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS] + "..."
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def source_file(function: Callable[..., Any]) -> str | None:
    """The file `function` (unwrapped from `jit` and decorators) is defined in, if known."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    return code.co_filename if code is not None else None


def _location(error: BaseException, source: Path | str | None) -> str:
    """`FILE:LINE` of the deepest frame in `source` along the error's chain of causes; a syntax
    error's own file and line; else the file alone."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}:{error.lineno}" if error.lineno else error.filename
    if source is None:
        return ""
    wanted = os.path.realpath(source)
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:  # the error, then what it was raised from
        seen.add(id(link))
        lines = [frame.lineno for frame in traceback.extract_tb(link.__traceback__)
                 if os.path.realpath(frame.filename) == wanted]
        if lines:
            return f"{source}:{lines[-1]}"
        link = link.__cause__ or link.__context__
    return str(source)

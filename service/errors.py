"""Domain errors mapped to HTTP in one place.

Every error response has the same shape, `{"error": {"kind", "message", "problems": [{"where",
"message"}]}}`, where `where` is a JSON pointer into the request body: the same problems the
CLI prints, with the graph's pointers under `/graph`.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from autoshard.errors import AutoshardError, InfeasibleError, InputError, Problem
from autoshard.graph.schema import RepeatedKey, decode_json


class NotFound(AutoshardError):
    """No resource of that id."""


class Conflict(AutoshardError):
    """The resource exists but is not in a state that allows the request."""


class TooLarge(InputError):
    """The request is over one of the service's size limits."""


def error_body(kind: str, message: str, problems: Iterable[Problem] = ()) -> dict[str, Any]:
    return {"error": {"kind": kind, "message": message,
                      "problems": [{"where": p.where, "message": p.message} for p in problems]}}


def _input_error(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, InputError)
    status, kind = (413, "too_large") if isinstance(error, TooLarge) else (422, "input")
    count = len(error.problems)
    message = error.problems[0].message if count == 1 else f"{count} problems in the request"
    return JSONResponse(error_body(kind, message, error.problems), status_code=status)


def _domain_error(_: Request, error: Exception) -> JSONResponse:
    status, kind = {NotFound: (404, "not_found"), Conflict: (409, "conflict"),
                    InfeasibleError: (422, "infeasible")}.get(type(error), (422, "error"))
    return JSONResponse(error_body(kind, str(error)), status_code=status)


def _request_validation(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    errors = list(error.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {}).get("error", "")
        return JSONResponse(error_body("malformed", f"the request body is not JSON: {detail}".rstrip(": ")),
                            status_code=400)
    problems = [Problem(_where(e["loc"]), e["msg"]) for e in errors]
    message = problems[0].message if len(problems) == 1 else f"{len(problems)} problems in the request"
    return JSONResponse(error_body("input", message, problems), status_code=422)


# pydantic names the member of a union a value failed to match; a JSON pointer leaves it out
_UNION_TAGS = {"str", "int", "float", "MeshSpec", "dict", "list", "none"}


def _where(loc: tuple[Any, ...]) -> str:
    """`("body", "options", "seed")` -> `/options/seed`; `("query", "wait")` -> `?wait`."""
    source, *path = loc or ("body",)
    if source == "query":
        return "?" + ".".join(str(p) for p in path)
    parts = [str(p) for p in path if not (isinstance(p, str) and ("[" in p or p in _UNION_TAGS))]
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, HTTPException)
    if error.status_code == 400 and isinstance(error.__cause__, ValueError):
        # FastAPI's parser cannot convert an integer literal of over 4300 digits; ours names where it is
        try:
            decode_json(await request.body())
        except InputError as named:
            return _input_error(request, named)
        except (ValueError, RecursionError, RepeatedKey):
            pass
    # 400: a body FastAPI could not parse at all (nested too deeply, not UTF-8)
    kind = {400: "malformed", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(error.status_code,
                                                                                                 "http")
    message = error.detail if isinstance(error.detail, str) else json.dumps(error.detail)
    return JSONResponse(error_body(kind, message), status_code=error.status_code, headers=error.headers)


def add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(InputError, _input_error)
    app.add_exception_handler(AutoshardError, _domain_error)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(HTTPException, _http_error)

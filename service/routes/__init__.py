"""One router per resource: plans, estimate, validate, topologies, health."""

from __future__ import annotations

from typing import Any

from service.schemas import ErrorResponse

_MEANING = {
    400: "the body is not JSON",
    404: "no plan of that id",
    409: "the plan is not in a state that allows this",
    413: "over the body size or graph size limits",
    422: "invalid request: every problem with its JSON pointer",
}


def errors(*codes: int, text_route: bool = False) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for error statuses, each with the one JSON error body (`ErrorResponse`).

    A route answering text names the schema by reference only: given the model, FastAPI would
    list it under the route's text media type.
    """
    if text_route:
        content = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
        return {code: {"description": _MEANING[code], "content": content} for code in codes}
    return {code: {"description": _MEANING[code], "model": ErrorResponse} for code in codes}


INPUT_ERRORS = errors(400, 413, 422)

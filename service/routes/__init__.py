"""One router per resource: plans, estimate, validate, topologies, health."""

from __future__ import annotations

from typing import Any

from service.schemas import ErrorResponse

INPUT_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "the body is not JSON"},
    413: {"model": ErrorResponse, "description": "over the body size or graph size limits"},
    422: {"model": ErrorResponse, "description": "invalid request: every problem with its JSON pointer"},
}

"""What a request body must be before a route reads it: within the size limit, JSON, free of
repeated keys, and text UTF-8 can encode.

A declared `Content-Length` over the limit is refused at once; a body without one (chunked) is
counted as it arrives and refused once it passes the limit.
"""

from __future__ import annotations


from fastapi import Request
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autoshard.encodable import check_encodable, printable
from autoshard.errors import InputError
from autoshard.graph.schema import RepeatedKey, decode_json
from service.errors import error_body


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _message(self, size: str) -> str:
        return f"the request body is {size}; this service accepts at most {self.max_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            response = JSONResponse(error_body("too_large", self._message(f"{int(declared)} bytes")), status_code=413)
            await response(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # an HTTPException passes through FastAPI's body reading to the error handler
                    raise HTTPException(413, self._message(f"over {self.max_bytes} bytes"))
            return message

        await self.app(scope, limited, send)


class JsonBodies:
    """A request that sends a body must say it is JSON (`application/json` or a `+json` type):
    any other content type is answered 415, naming what it sent."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            has_body = headers.get(b"content-length", b"0") not in (b"", b"0") or b"transfer-encoding" in headers
            kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if has_body and not (kind == b"application/json" or kind.endswith(b"+json")):
                sent = kind.decode("latin-1") or "no content type"
                response = JSONResponse(error_body("unsupported_media_type", f"the request body must be JSON "
                                                   f"(Content-Type: application/json), got {sent}"), status_code=415)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def readable_body(request: Request) -> None:
    """A dependency of every route: a JSON body repeating a key in one object is refused (422)
    naming the key, as a graph file is; JSON parsers keep the last value without a word. So is
    a string UTF-8 cannot encode (a lone surrogate escape, `"\\ud800"`), by its pointer: it could
    never be sent back, so a job holding one is never stored; and so is an integer literal too long
    to mean anything, by its pointer. A body that is not JSON at all is
    left to the route's parser (400)."""
    body = await request.body()  # read once: the route's parser gets the same bytes
    if not body:
        return
    try:
        document = decode_json(body)
    except RepeatedKey as error:
        raise InputError(f"the key {printable(error.args[0])!r} appears twice in one object; JSON would keep only "
                         "the last", "") from None
    except (ValueError, RecursionError):
        return
    check_encodable(document)

"""The FastAPI application: settings, plan store and job runner assembled in `create_app`."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import Depends, FastAPI

from autoshard import __version__
from service.config import Settings, get_settings
from service.errors import add_error_handlers
from service.limits import BodyLimit, JsonBodies, readable_body
from service.routes import estimate, health, plans, searches, topologies, validate
from service.runner import Runner
from service.searches import Searches
from service.store import Store

log = logging.getLogger("autoshard.service")

DESCRIPTION = """Plans how every tensor and op of a model is split across a device mesh.

`POST /v1/plans` starts a solve in a worker process and answers with a job; follow its
`Location` (or pass `?wait=SECONDS`). Errors carry every problem with a JSON pointer into the
request body."""


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(settings.db)
        interrupted = store.mark_interrupted()
        if interrupted:
            log.warning("%d job(s) left solving by a previous run are marked interrupted", interrupted)
        runner = Runner(store, settings)
        waiting = store.queued()
        if waiting:
            log.warning("%d job(s) left queued by a previous run are run now", len(waiting))
            runner.resume(waiting)
        app.state.store, app.state.runner = store, runner
        app.state.searches = Searches()
        try:
            yield
        finally:
            app.state.searches.shutdown()
            runner.shutdown()
            store.close()

    app = FastAPI(title="autoshard", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                  dependencies=[Depends(readable_body)])
    app.state.settings = settings
    add_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(JsonBodies)
    for module in (plans, searches, estimate, validate, topologies, health):
        app.include_router(module.router)
    return app

"""`/healthz` (the process answers) and `/readyz` (the plan store answers too)."""

from __future__ import annotations

import sqlite3

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from service import deps
from service.schemas import Health
from service.store import Store

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz(store: Store = Depends(deps.store)) -> Health:
    """The process answers; with the jobs per status when the plan store answers too."""
    try:
        return Health(status="ok", jobs=store.counts())
    except sqlite3.Error:
        return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(store: Store = Depends(deps.store)) -> Health | JSONResponse:
    try:
        counts = store.counts()
    except sqlite3.Error as error:
        return JSONResponse(Health(status=f"plan store unavailable: {error}").model_dump(), status_code=503)
    return Health(status="ready", jobs=counts)

"""`/v1/topologies`: the hardware profiles a request may name."""

from __future__ import annotations

from fastapi import APIRouter

import cost_models
from service.schemas import Topology

router = APIRouter(prefix="/v1/topologies", tags=["topologies"])


@router.get("", response_model=list[Topology])
def list_topologies() -> list[Topology]:
    profiles = [cost_models.load_profile(name) for name in cost_models.list_profiles()]
    return [Topology(name=p.name, kind=p.kind, chip=p.chip, description=p.description, hbm_bytes=p.hbm_bytes)
            for p in profiles]

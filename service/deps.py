"""Request dependencies: the app's settings, plan store and job runner (set up by `create_app`)."""

from __future__ import annotations

from fastapi import Request

from service.config import Settings
from service.runner import Runner
from service.store import Store


def settings(request: Request) -> Settings:
    return request.app.state.settings


def store(request: Request) -> Store:
    return request.app.state.store


def runner(request: Request) -> Runner:
    return request.app.state.runner

"""Fixtures shared by the test modules; shared helpers that are not fixtures are in `support/`."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from autoshard.client import Client
from service.app import create_app
from support.service import settings_for


@pytest.fixture
def http(tmp_path):
    """The service app, with its plan store in the test's directory, behind FastAPI's TestClient."""
    with TestClient(create_app(settings_for(tmp_path))) as client:
        yield client


@pytest.fixture
def client(http):
    """The typed Python client over `http`."""
    return Client(http=http)

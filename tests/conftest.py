"""Fixtures shared by the test modules; shared helpers that are not fixtures are in `support/`."""

from __future__ import annotations

import os

import pytest
from fastapi.testclient import TestClient

from autoshard.client import Client
from service.app import create_app
from support.devices import JAX_DEVICES_FLAG
from support.service import settings_for

# The JAX tests need 8 fake CPU devices, which jax fixes when it is first imported: they run in a
# process of their own (tests/test_jax_process.py sets XLA_FLAGS for it), not in this one.
if JAX_DEVICES_FLAG not in os.environ.get("XLA_FLAGS", ""):
    collect_ignore = ["frontend_jax"]


@pytest.fixture
def http(tmp_path):
    """The service app, with its plan store in the test's directory, behind FastAPI's TestClient."""
    with TestClient(create_app(settings_for(tmp_path))) as client:
        yield client


@pytest.fixture
def client(http):
    """The typed Python client over `http`."""
    return Client(http=http)

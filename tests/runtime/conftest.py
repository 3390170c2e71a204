"""Fixtures for runtime tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def default_model() -> str:
    from tokenflow.model_store import resolve_model_path

    return resolve_model_path("default")

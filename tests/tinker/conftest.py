"""A live `tokenflow tinker` service on a free loopback port for each test module, and the
official `tinker` SDK pointed at it."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("tinker")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """(base URL, the TinkerService behind it)."""
    from tokenflow.serve.server import BackgroundServer
    from tokenflow.tinker.app import create_app
    from tokenflow.tinker.service import Settings, TinkerService

    os.environ.setdefault("TINKER_API_KEY", "tml-test")  # the SDK insists on a key with this prefix
    svc = TinkerService(Settings(root=str(tmp_path_factory.mktemp("tinker-root")), max_models=64))
    with BackgroundServer(create_app(svc)) as server:
        yield server.url, svc
    svc.close()


@pytest.fixture(scope="module")
def client(service):
    import tinker

    with tinker.ServiceClient(base_url=service[0]) as sc:  # leaving it finishes the session
        yield sc

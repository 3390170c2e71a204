"""Ray tests run on a small local cluster that each module starts and shuts down."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()

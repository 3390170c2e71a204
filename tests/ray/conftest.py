"""Ray tests run on a small local cluster that each module starts and shuts down."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    import ray  # a declared test dependency: missing, it fails rather than skips

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()

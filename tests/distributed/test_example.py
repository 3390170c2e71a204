"""The shipped Ray example config loads and says what docs/distributed.md says it does."""

from __future__ import annotations

from pathlib import Path

from tokenflow.config.loading import load_config
from tokenflow.config.root import TrainConfig

EXAMPLE = Path(__file__).parents[2] / "examples" / "ray_cluster.toml"


def test_ray_example_config_loads():
    cfg = load_config(TrainConfig, EXAMPLE)
    assert cfg.runtime.backend == "ray" and cfg.runtime.num_engines == 2 and cfg.runtime.scorer_workers == 2
    assert cfg.trainer.world_size == 2 and cfg.sync.transport == "broadcast"
    assert cfg.runtime.ray_placement_strategy == "PACK"

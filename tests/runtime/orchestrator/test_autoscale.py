"""``runtime.elastic``'s rule: add an engine after the trainer waited on generation for
``patience`` steps, remove one after the engines waited on the trainer as long, within bounds."""

from __future__ import annotations

import pytest

from tokenflow.config.loading import load_config
from tokenflow.config.root import TrainConfig
from tokenflow.runtime.orchestrator.autoscale import AutoScale, Reading, reading

TRAINER_WAITS, ENGINES_WAIT, BOTH, NEITHER = Reading(0.7, 0.1), Reading(0.1, 0.8), Reading(0.6, 0.6), Reading(0.2, 0.2)


def test_a_reading_is_the_idle_share_of_each_side():
    r = reading(wall_s=10.0, trainer_busy_s=2.5, engine_wall_s=20.0, engine_busy_s=19.0)
    assert r.trainer_wait == pytest.approx(0.75) and r.engine_wait == pytest.approx(0.05)
    assert reading(0.0, 0.0, 0.0, 0.0) == Reading(0.0, 0.0)  # an empty window waits for nothing
    assert reading(1.0, 1.2, 1.0, -0.1) == Reading(0.0, 1.0)  # clamped


def test_patience_bounds_and_ties():
    s = AutoScale(min_engines=1, max_engines=3, idle_frac=0.5, patience=2)
    assert [s.observe(TRAINER_WAITS, 1), s.observe(TRAINER_WAITS, 1)] == [0, 1]
    assert s.observe(TRAINER_WAITS, 2) == 0  # the count starts again after a change
    assert [s.observe(NEITHER, 2), s.observe(TRAINER_WAITS, 2), s.observe(TRAINER_WAITS, 2)] == [0, 0, 1]
    assert [s.observe(TRAINER_WAITS, 3), s.observe(TRAINER_WAITS, 3)] == [0, 0]  # at max_engines
    assert [s.observe(BOTH, 3) for _ in range(4)] == [0, 0, 0, 0]  # both wait: taking turns, not short of engines
    assert [s.observe(ENGINES_WAIT, 3), s.observe(ENGINES_WAIT, 3)] == [0, -1]
    assert [s.observe(ENGINES_WAIT, 1) for _ in range(3)] == [0, 0, 0]  # at min_engines


def test_nothing_is_decided_once_fewer_than_patience_steps_remain():
    s = AutoScale(min_engines=1, max_engines=3, idle_frac=0.5, patience=2)
    assert [s.observe(ENGINES_WAIT, 2, steps_left=3), s.observe(ENGINES_WAIT, 2, steps_left=2)] == [0, -1]
    assert [s.observe(TRAINER_WAITS, 1, steps_left=k) for k in (3, 1, 0)] == [0, 0, 0]  # too late to pay for itself


def test_the_config_keeps_the_engine_count_within_its_bounds():
    def cfg(*args):
        return load_config(TrainConfig, None, list(args))

    assert cfg("--runtime.backend", "ray", "--runtime.elastic", "true", "--runtime.max_engines", "4").runtime.elastic
    for args, why in [
        (("--runtime.elastic", "true", "--runtime.max_engines", "2"), 'set runtime.backend = "ray"'),
        (("--runtime.backend", "ray", "--runtime.elastic", "true"), "needs runtime.max_engines"),
        (("--runtime.num_engines", "3", "--runtime.max_engines", "2"), "must lie within"),
        (("--runtime.min_engines", "2"), "must lie within"),
    ]:
        with pytest.raises(Exception, match=why):
            cfg(*args)

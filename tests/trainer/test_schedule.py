import math

import pytest

from tokenflow.config.trainer import TrainerConfig
from tokenflow.trainer.schedule import lr_multiplier


def test_constant_with_warmup():
    f = lr_multiplier(TrainerConfig(warmup_steps=4))
    assert [f(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_multiplier(TrainerConfig())(0) == 1.0


def test_cosine_reaches_the_floor_at_total_steps():
    f = lr_multiplier(TrainerConfig(warmup_steps=2, schedule="cosine", total_steps=12, min_lr_ratio=0.1))
    assert f(1) == 1.0 and f(2) == 1.0
    assert f(7) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(12) == pytest.approx(0.1) and f(50) == pytest.approx(0.1)

"""Trainer settings and trainer/algorithm combinations refused at start, naming the fields."""

import pytest
from pydantic import ValidationError

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.trainer import Trainer, TrainerConfig, check_compatible
from tests.trainer.trainer_testlib import tiny_model


@pytest.mark.parametrize("kwargs,fields", [
    (dict(schedule="cosine"), ["schedule", "total_steps"]),
    (dict(warmup_steps=5, total_steps=3), ["warmup_steps", "total_steps"]),
    (dict(value_lr=1e-3), ["value_lr", "value_head"]),
    (dict(compile_layers=True, keep_routing=True), ["compile_layers", "keep_routing"]),
    (dict(compile_layers=True, world_size=2), ["compile_layers", "world_size"]),
])
def test_trainer_config_refusals(kwargs, fields):
    with pytest.raises(ValidationError) as e:
        TrainerConfig(**kwargs)
    for f in fields:
        assert f in str(e.value)


def test_gae_without_value_head_is_refused_at_start():
    with pytest.raises(ValueError, match=r"trainer\.value_head"):
        Trainer(tiny_model(), TrainerConfig(device="cpu"), AlgorithmConfig(advantage="gae"))
    with pytest.raises(ValueError, match=r"value_head.*advantage"):
        check_compatible(TrainerConfig(value_head=True), AlgorithmConfig(advantage="grpo"))
    check_compatible(TrainerConfig(value_head=True), AlgorithmConfig(advantage="gae"))


def test_field_constraints_and_docs():
    for bad in (dict(dtype="float16"), dict(micro_batch_tokens=0), dict(lr=-1.0), dict(device="tpu")):
        with pytest.raises(ValidationError):
            TrainerConfig(**bad)
    for name, field in TrainerConfig.model_fields.items():
        assert field.description, name


def test_missing_behaviour_logprobs_are_refused_with_advice():
    import numpy as np

    from tests.trainer.trainer_testlib import make_rollouts

    rs = make_rollouts(groups=1)
    rs[0].logprobs[:] = np.nan
    tr = Trainer(tiny_model(), TrainerConfig(device="cpu"), AlgorithmConfig())
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        tr.train_step(rs)
    # Without engine log-probs the step runs against π_prox instead (ratio 1, no corrections).
    tr = Trainer(tiny_model(), TrainerConfig(device="cpu"), AlgorithmConfig(behaviour_logprobs=False))
    m = tr.train_step(rs)
    assert m["offpolicy/is_ratio_max"] == pytest.approx(1.0, abs=1e-5)

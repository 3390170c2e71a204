"""Invalid algorithm settings are refused at start, with a message naming the fields."""

import pytest
from pydantic import ValidationError

from tokenflow.algorithms import AlgorithmConfig


@pytest.mark.parametrize("kwargs,fields", [
    (dict(clip_low=0.3, clip_high=0.2), ["clip_low", "clip_high"]),
    (dict(advantage="dr_grpo", scale_std=True), ["dr_grpo", "scale_std"]),
    (dict(aggregation="dr_grpo_constant"), ["max_completion_tokens"]),
    (dict(is_mask_low=2.0, is_mask_high=1.0), ["is_mask_low", "is_mask_high"]),
    (dict(behaviour_logprobs=False, tis_cap=2.0), ["tis_cap", "behaviour_logprobs"]),
    (dict(behaviour_logprobs=False, opsm_delta=0.1), ["opsm_delta", "behaviour_logprobs"]),
    (dict(value_clip=0.2), ["value_clip", "gae"]),
])
def test_refused_with_field_names(kwargs, fields):
    with pytest.raises(ValidationError) as e:
        AlgorithmConfig(**kwargs)
    for f in fields:
        assert f in str(e.value)


@pytest.mark.parametrize("objective", ["direct", "decoupled"])
def test_without_behaviour_logprobs_either_objective_is_accepted(objective):
    """Without μ both objectives clip π_θ/π_prox with no weight; the default (decoupled) must not
    make ``behaviour_logprobs = false`` alone a refused config."""
    assert AlgorithmConfig(behaviour_logprobs=False, objective=objective).needs_prox_pass
    assert AlgorithmConfig(behaviour_logprobs=False).objective == "decoupled"


@pytest.mark.parametrize("kwargs", [dict(clip_low=1.0), dict(tis_cap=-1.0), dict(advantage="ppo"),
                                    dict(gamma=1.5), dict(max_token_age=-1), dict(unknown_key=1)])
def test_field_constraints(kwargs):
    with pytest.raises(ValidationError):
        AlgorithmConfig(**kwargs)


def test_one_line_choices_and_assignment_checks():
    cfg = AlgorithmConfig(advantage="rloo", clip_high=0.28, aggregation="seq_mean_token_mean")
    assert cfg.clip_high == 0.28 and cfg.advantage == "rloo"
    with pytest.raises(ValidationError, match="clip_high"):
        cfg.clip_high = 0.1  # below clip_low = 0.2
    assert AlgorithmConfig(advantage="dr_grpo").advantage == "dr_grpo"  # default scale_std is fine


def test_every_field_is_documented():
    for name, field in AlgorithmConfig.model_fields.items():
        assert field.description, name


def test_tis_is_on_by_default_and_off_is_spelled_so_a_toml_file_keeps_it():
    """The default bounds the behaviour weight (min(w, 2)); 0 turns TIS off, and None (Python)
    becomes 0, so a resolved config written as TOML (which has no null) reads back the same."""
    import tomllib

    from tokenflow.config.loading import load_config, to_toml
    from tokenflow.config.root import TrainConfig

    assert AlgorithmConfig().tis_cap == 2.0
    assert AlgorithmConfig(tis_cap=None).tis_cap == 0.0
    cfg = load_config(TrainConfig, None, ["--algorithm.tis_cap", "0"])
    again = TrainConfig.model_validate(tomllib.loads(to_toml(cfg)))
    assert again.algorithm.tis_cap == 0.0 == cfg.algorithm.tis_cap
    # Without behaviour log-probs the default cap is moot (w ≡ 1), not a refused config.
    assert AlgorithmConfig(behaviour_logprobs=False).tis_cap == 2.0

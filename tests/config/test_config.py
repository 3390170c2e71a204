"""The typed config: TOML + overrides, errors that name the key, cross-field checks."""

from __future__ import annotations

import pytest

from tokenflow.config.loading import ConfigError, load_config, parse_overrides, to_toml
from tokenflow.config.root import TrainConfig


def test_overrides_parse_as_toml_values():
    assert parse_overrides(["--a.b", "0.28", "--c.d=true", "--e.f", "text", "--g.h", "[1, 2]"]) == {
        "a.b": 0.28, "c.d": True, "e.f": "text", "g.h": [1, 2]}


def test_file_and_overrides_resolve(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[algorithm]\nadvantage = "rloo"\n[rollout]\ngroup_size = 4\n')
    cfg = load_config(TrainConfig, f, ["--algorithm.clip_high", "0.28"])
    assert cfg.algorithm.advantage == "rloo"
    assert cfg.algorithm.clip_high == 0.28
    assert cfg.trainer.rollouts_per_step == cfg.rollout.prompts_per_step * 4
    again = tmp_path / "resolved.toml"
    again.write_text(to_toml(cfg))
    assert load_config(TrainConfig, again) == cfg


def test_unknown_key_names_it_and_lists_valid_ones():
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, None, ["--algorithm.advantag", "rloo"])
    msg = str(e.value)
    assert "'algorithm.advantag'" in msg and "did you mean 'algorithm.advantage'" in msg
    assert "clip_high" in msg  # the valid keys are listed


def test_ill_typed_and_bad_choice_are_refused():
    with pytest.raises(ConfigError, match="rollout.group_size"):
        load_config(TrainConfig, None, ["--rollout.group_size", "many"])
    with pytest.raises(ConfigError, match="known: dr_grpo, gae, grpo, reinforce_pp, reinforce_pp_baseline, rloo"):
        load_config(TrainConfig, None, ["--algorithm.advantage", "ppo2"])


@pytest.mark.parametrize("key,typo,meant", [
    ("algorithm.advantage", "rlo", "rloo"),
    ("algorithm.policy_loss", "gpso", "gspo"),
    ("algorithm.aggregation", "token_means", "token_mean"),
    ("task.name", "arithmetics", "arithmetic"),
])
def test_unknown_registered_name_lists_the_known_ones_and_suggests_one(key, typo, meant):
    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, None, [f"--{key}", typo])
    msg = str(err.value)
    assert f"{key} = {typo!r} is not a known" in msg and f"did you mean {meant!r}?" in msg and "known: " in msg


@pytest.mark.parametrize("overrides,needle", [
    (["--algorithm.clip_low", "0.3", "--algorithm.clip_high", "0.2"], "clip_high"),
    (["--algorithm.advantage", "gae"], "value head"),
    (["--sync.every", "3", "--rollout.max_staleness", "0"], "max_staleness"),
    (["--sync.transport", "broadcast", "--sync.slots", "1"], "sync.slots applies to"),
    (["--engine.max_num_seqs", "4", "--rollout.group_size", "8"], r"engine.max_num_seqs \(4\) is below rollout.group_size \(8\)"),
    (["--task.name", "dataset"], "train_path"),
    (["--algorithm.overlong_buffer_tokens", "100", "--sampling.max_tokens", "96"], "overlong_buffer_tokens"),
    (["--algorithm.dynamic_sampling", "true", "--scorer.token", "m:f"], "per-token rewards"),
])
def test_invalid_combinations_are_refused_at_start(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(TrainConfig, None, overrides)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(TrainConfig, tmp_path / "nope.toml")


def test_builtin_tasks_take_no_plugin_options():
    with pytest.raises(ConfigError, match=r"task.options \(depth\) is for plugin tasks"):
        load_config(TrainConfig, None, ["--task.options.depth", "3"])


def test_max_engine_restarts_is_read_as_max_worker_restarts(tmp_path):
    """A config (or a run folder's config.toml) from before healing covered every worker."""
    old = tmp_path / "old.toml"
    old.write_text("[runtime]\nmax_engine_restarts = 1\n")
    assert load_config(TrainConfig, old).runtime.max_worker_restarts == 1
    assert "max_engine_restarts" not in to_toml(load_config(TrainConfig, old))
    assert load_config(TrainConfig, None, []).runtime.max_worker_restarts == 3  # on by default
    with pytest.raises(ConfigError, match=r"runtime.max_engine_restarts is now runtime.max_worker_restarts.*set "
                                          r"only runtime.max_worker_restarts"):
        load_config(TrainConfig, old, ["--runtime.max_worker_restarts", "2"])

"""Loading the simulator config: sections, training keys, presets, overrides, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenflow.sim import PRESETS, ConfigError, load_config, simulate
from tokenflow.sim.loading import TRAINING_KEYS

EXAMPLE = Path(__file__).parents[2] / "examples" / "simulate_7b.toml"


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    return path


def test_training_sections_map_onto_the_simulator(tmp_path):
    path = write(tmp_path, """
[run]
name = "ignored: a training-only section"
[model]
path = "default"
[rollout]
prompts_per_step = 32
group_size = 4
max_staleness = 3
[algorithm]
max_token_age = 2
loss = "ppo"
[sampling]
max_tokens = 1000
temperature = 0.7
[engine]
update_mode = "abort"
device = "cuda"
[sync]
every = 2
transport = "broadcast"
bucket_mb = 64
checksum = true
[hardware]
gpus = 4
inference_gpus = 2
""")
    cfg = load_config(path)
    assert (cfg.workload.prompts_per_step, cfg.workload.group_size, cfg.workload.max_tokens) == (32, 4, 1000)
    p = cfg.pipeline
    assert (p.max_staleness, p.max_token_age, p.update_mode) == (3, 2, "abort")
    assert (p.sync_every, p.transport, p.bucket_mb) == (2, "broadcast", 64)
    assert {s for s, _ in TRAINING_KEYS} == {"rollout", "algorithm", "sampling", "engine", "sync"}


def test_defaults_shared_with_training_agree():
    from tokenflow.config.rollout import RolloutConfig
    from tokenflow.config.sync import SyncConfig

    cfg = load_config(preset="h100-7b-vllm")
    assert cfg.pipeline.max_staleness == RolloutConfig().max_staleness
    assert cfg.pipeline.sync_every == SyncConfig().every


def test_unknown_key_in_an_own_section_names_the_valid_keys(tmp_path):
    path = write(tmp_path, "[hardware]\ngpus = 4\ninference_gpus = 2\ninferance_gpus = 3\n")
    with pytest.raises(ConfigError, match=r"\[hardware\] has unknown key\(s\) inferance_gpus; valid keys: gpus, "):
        load_config(path)
    with pytest.raises(ConfigError, match="valid keys: .*completion_p90"):
        load_config(preset="h100-7b-vllm", overrides={"workload.p90": 5})


def test_conflicting_training_and_simulator_keys_are_refused(tmp_path):
    path = write(tmp_path, "[rollout]\ngroup_size = 4\n[workload]\ngroup_size = 8\n"
                           "[hardware]\ngpus = 2\ninference_gpus = 1\n")
    with pytest.raises(ConfigError, match="conflicts"):
        load_config(path)


def test_precedence_preset_then_file_then_overrides(tmp_path):
    path = write(tmp_path, "[hardware]\ninference_gpus = 6\n[rollout]\nmax_staleness = 4\n")
    cfg = load_config(path, preset="h100-7b-vllm", overrides={"rollout.max_staleness": 1})
    assert cfg.hardware.inference_pool == 6 and cfg.hardware.training_pool == 2
    assert cfg.pipeline.max_staleness == 1
    assert cfg.hardware.decode_step_base_s == PRESETS["h100-7b-vllm"]["hardware"]["decode_step_base_s"]


@pytest.mark.parametrize("hardware,message", [
    ({"gpus": 8}, "give gpus and inference_gpus"),
    ({"gpus": 8, "inference_gpus": 8}, "leaves none"),
    ({"gpus": 8, "inference_gpus": 3, "training_gpus": 3}, r"!= gpus"),
    ({"inference_gpus": 1, "training_gpus": 1, "gpus_per_engine": 2}, "cannot hold one engine"),
])
def test_bad_gpu_splits(hardware, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides={f"hardware.{k}": v for k, v in hardware.items()})


def test_sync_every_needs_a_staleness_budget():
    with pytest.raises(ConfigError, match="sync.every = 3 needs rollout.max_staleness ≥ 2"):
        load_config(preset="h100-7b-vllm", overrides={"sync.every": 3, "rollout.max_staleness": 1})


def test_no_hardware_says_what_to_do():
    with pytest.raises(ConfigError, match="--preset"):
        load_config()
    with pytest.raises(ConfigError, match="unknown preset 'h200'; presets: h100-7b-vllm"):
        load_config(preset="h200")


def test_sweep_spec_values_are_toml_scalars():
    from tokenflow.sim.sweep import parse_spec

    axis = parse_spec("pipeline.update_mode=inflight, abort")
    assert axis.key == "pipeline.update_mode" and axis.values == ["inflight", "abort"]
    assert parse_spec("hardware.decode_step_base_s=0.01,1e-3").values == [0.01, 1e-3]


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.slow
def test_every_preset_simulates(name):
    r = simulate(load_config(preset=name, overrides={"sim.steps": 3, "sim.warmup_steps": 1,
                                                      "workload.completion_median": 512,
                                                      "workload.completion_p90": 1024}))
    assert r.tokens_per_s > 0 and 0 <= r.trainer_idle_frac <= 1


def test_example_toml_loads_and_runs():
    cfg = load_config(EXAMPLE, overrides={"sim.steps": 4})
    assert cfg.hardware.engines == 4 and cfg.pipeline.transport == "broadcast"
    assert simulate(cfg).steps == 4


def test_the_training_config_loads_unchanged():
    """Every section of the real TrainConfig, as its TOML would hold it, on top of a preset."""
    from tokenflow.config import root
    from tokenflow.sim.loading import load_layers, preset_layer

    train = root.TrainConfig()
    raw = train.model_dump(mode="json")
    cfg = load_layers([("preset", preset_layer("h100-7b-vllm")), ("training config", raw)])
    assert cfg.workload.prompts_per_step == train.rollout.prompts_per_step
    assert cfg.workload.group_size == train.rollout.group_size
    assert cfg.workload.max_tokens == train.sampling.max_tokens
    assert cfg.pipeline.max_staleness == train.rollout.max_staleness
    assert cfg.pipeline.max_token_age == train.algorithm.max_token_age
    assert cfg.pipeline.update_mode == train.engine.update_mode
    assert (cfg.pipeline.sync_every, cfg.pipeline.transport, cfg.pipeline.bucket_mb) == (
        train.sync.every, train.sync.transport, train.sync.bucket_mb)

"""Helpers shared by the simulator tests: small, fast configurations."""

from __future__ import annotations

import copy

import pytest

from tokenflow.sim import SimConfig

# One engine whose throughput does not depend on the batch (t(n) = b n), no prefill, a free
# weight sync: the setting in which the textbook laws hold exactly.
IDEAL = {
    "hardware": {"inference_gpus": 1, "training_gpus": 1, "decode_step_base_s": 0.0,
                 "decode_step_per_seq_s": 1e-3, "max_running_seqs": 64, "prefill_s_per_token": 0.0,
                 "train_step_overhead_s": 0.0, "model_bytes": 1.0, "num_param_tensors": 1,
                 "sync_latency_s": 0.0, "broadcast_bandwidth_gbps": 1e6},
    "workload": {"prompts_per_step": 8, "group_size": 8, "completion_median": 200,
                 "completion_p90": 200, "prompt_length": 10},
    "pipeline": {"max_staleness": 1000},
    "sim": {"steps": 30, "warmup_steps": 5},
}

# A scaled-down 7B/H100 pipeline: two engines, two trainer GPUs, 16 prompts x 4 per step.
SMALL = {
    "hardware": {"gpus": 4, "inference_gpus": 2, "decode_step_base_s": 0.012,
                 "decode_step_per_seq_s": 1.353e-4, "prefill_s_per_token": 3.3e-5,
                 "train_s_per_token": 1.5e-4, "train_step_overhead_s": 2.0},
    "workload": {"prompts_per_step": 16, "group_size": 4, "completion_median": 1024,
                 "completion_p90": 3072, "max_tokens": 16384},
    "pipeline": {"max_staleness": 1},
    "sim": {"steps": 15, "warmup_steps": 2},
}


def make(base: dict, **overrides) -> SimConfig:
    """``base`` with ``section__key=value`` overrides, validated."""
    raw = copy.deepcopy(base)
    for k, v in overrides.items():
        section, key = k.split("__")
        raw[section][key] = v
    return SimConfig.model_validate(raw)


@pytest.fixture
def ideal():
    return lambda **kw: make(IDEAL, **kw)


@pytest.fixture
def small():
    return lambda **kw: make(SMALL, **kw)

"""The survey's generation times for one synchronous GRPO step, from the presets.

Hugging Face's 2026 survey of async RL libraries: 512 rollouts (64 prompts x 8) at ~6,300
output tokens/s (7B on one H100) take ~3 min, ~11 min and ~45 min at 2K, 8K and 32K tokens per
rollout; a 32B model ~14 min, ~56 min and ~3.7 h. Its figures are rollouts x tokens / rate with
K = 1024 tokens; for 32B the quoted times imply ~1,250 tokens/s (the text rounds to "~1,200").
"""

from __future__ import annotations

import pytest

from tokenflow.sim import load_config, simulate

MIN, HOUR = 60.0, 3600.0

CASES = [  # preset, tokens per rollout, rate the survey quotes (tokens/s), quoted time (s)
    ("h100-7b-vllm", 2048, 6300, 3 * MIN),
    ("h100-7b-vllm", 8192, 6300, 11 * MIN),
    ("h100-7b-vllm", 32768, 6300, 45 * MIN),
    ("h100-32b-vllm", 2048, 1250, 14 * MIN),
    ("h100-32b-vllm", 8192, 1250, 56 * MIN),
    ("h100-32b-vllm", 32768, 1250, 3.7 * HOUR),
]


def generation_time(preset: str, tokens: int) -> float:
    cfg = load_config(preset=preset, overrides={
        "hardware.inference_gpus": 1, "rollout.max_staleness": 0,
        "rollout.prompts_per_step": 64, "rollout.group_size": 8,
        "workload.completion_median": tokens, "workload.completion_p90": tokens,
        "sampling.max_tokens": tokens, "sim.steps": 1, "sim.warmup_steps": 0})
    return simulate(cfg).generation_s


@pytest.mark.parametrize("preset,tokens,rate,quoted", CASES)
def test_reproduces_survey_generation_time(preset, tokens, rate, quoted):
    simulated = generation_time(preset, tokens)
    arithmetic = 512 * tokens / rate  # the survey's own calculation
    assert simulated == pytest.approx(arithmetic, rel=0.05)
    # Against the rounded figure as printed. "~3 min" is the survey's 2.77 min rounded up
    # (512 x 2048 / 6300 = 166 s), 7.5 % away from 180 s; every other figure is within 5 %.
    tolerance = 0.08 if (preset, tokens) == ("h100-7b-vllm", 2048) else 0.05
    assert simulated == pytest.approx(quoted, rel=tolerance)

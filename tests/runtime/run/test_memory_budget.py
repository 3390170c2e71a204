"""Memory is a budget: a run whose trainer cannot fit in ``trainer.memory_budget_gb`` (or, unset,
in what the machine has left after the other workers) is refused before any process starts, with
the estimate, the budget and settings that do fit; a generous budget starts; --dry-run prints the
budget; the estimate moves the right way with each memory setting."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest

from tests.runtime.runtime_testlib import SMALL, small_config
from tokenflow.errors import InputError
from tokenflow.runtime.run.memory_budget import check_memory, largest_micro_batch
from tokenflow.runtime.run.memory_estimate import (AVAILABLE_ENV, GB, ModelShape, estimate, micro_batch_fill,
                                                   run_trainer_parts, sequence_tokens, trainer_parts)

# SmolLM2-135M's shapes (its config.json), so the estimate's arithmetic is checked on a real model
# without building it.
SMOLLM2 = ModelShape(params=134_515_008, hidden=576, layers=30, intermediate=1536, vocab=49152, kv_dim=192,
                     max_positions=8192, family="llama")


def _cli(args: list[str], **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "train", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})


def test_a_trainer_over_its_budget_is_refused_before_any_worker_starts(tmp_path):
    run = tmp_path / "run"
    out = _cli([*SMALL, "--trainer.memory_budget_gb", "0.01", "--output-dir", str(run)])
    assert out.returncode == 2, out.stderr[-3000:]
    line = out.stderr.strip().splitlines()[-1]
    assert re.match(r"error: the trainer needs about \d+\.\d\d GB with trainer\.micro_batch_tokens = 2048 \(base ",
                    line), line
    assert "but its budget is 0.01 GB (trainer.memory_budget_gb = 0.01)" in line
    assert "raise trainer.memory_budget_gb" in line and "runtime.check_memory = false" in line
    assert not run.exists()  # no run folder, so no worker was started


def _run_need(cfg, m: ModelShape, seq: int, tokens: int) -> float:
    """A run's trainer: its step at ``tokens`` and what the run adds (sync slots, checkpoint copy)."""
    return sum(run_trainer_parts(cfg, m, micro_batch_fill(cfg, seq, tokens)).values())


def test_the_refusal_names_a_micro_batch_that_fits(monkeypatch, default_model):
    """A budget between one sequence's need and the configured micro-batch's: the refusal names
    the largest micro_batch_tokens that fits, and that one does fit (the next size up does not)."""
    monkeypatch.setenv(AVAILABLE_ENV, "1000")
    cfg = small_config("--trainer.micro_batch_tokens", "8192", "--rollout.prompts_per_step", "16")
    m, seq = ModelShape.read(default_model), sequence_tokens(cfg, ModelShape.read(default_model), 100)
    full, least = (_run_need(cfg, m, seq, n) for n in (8192, 1))
    budget = (full + least) / 2
    cfg = small_config("--trainer.micro_batch_tokens", "8192", "--rollout.prompts_per_step", "16",
                       "--trainer.memory_budget_gb", str(budget / GB))
    with pytest.raises(InputError) as e:
        check_memory(cfg, default_model, prompt_tokens=100)
    msg = str(e.value)
    assert f"the trainer needs about {full / GB:.2f} GB with trainer.micro_batch_tokens = 8192" in msg, msg
    assert f"but its budget is {budget / GB:.2f} GB (trainer.memory_budget_gb = " in msg
    n = int(re.search(r"to fit, set trainer\.micro_batch_tokens = (\d+) \(about ", msg).group(1))
    assert n == largest_micro_batch(cfg, m, seq, budget) and 0 < n < 8192
    need = lambda k: _run_need(cfg, m, seq, k)  # noqa: E731
    assert need(n) <= budget < need(n + 128)
    # the other switch, with its estimate: the run's trainer at 8,192 tokens with it on
    on = small_config("--trainer.micro_batch_tokens", "8192", "--rollout.prompts_per_step", "16",
                      "--trainer.gradient_checkpointing", "true")
    assert f"trainer.gradient_checkpointing = true (about {_run_need(on, m, seq, 8192) / GB:.2f} GB)" in msg, msg


def test_a_generous_budget_starts_and_an_unset_one_is_what_the_other_workers_leave(monkeypatch, caplog, default_model):
    monkeypatch.setenv(AVAILABLE_ENV, "1000")
    est = check_memory(small_config("--trainer.memory_budget_gb", "50"), default_model)
    assert 0.1 * GB < est.worker("trainer") < 50 * GB
    cfg = small_config()  # unset: the machine's memory less the engine's estimate
    est = estimate(cfg, default_model)
    trainer = est.parts["trainer"]
    room = (est.worker("engine") + (trainer["base"] + est.worker("trainer")) / 2) / GB  # above an idle process
    monkeypatch.setenv(AVAILABLE_ENV, f"{room:.4f}")
    with pytest.raises(InputError) as e:
        check_memory(cfg, default_model)
    assert str(e.value).startswith("the trainer needs about "), str(e.value)
    assert f"(TOKENFLOW_MEMORY_AVAILABLE_GB={room:.4f}: {room:.2f} GB, less {est.worker('engine') / GB:.2f} GB " \
           "for the engine)" in str(e.value)
    assert "free some memory" in str(e.value)
    with caplog.at_level(logging.WARNING, logger="test-budget"):  # the switch that starts anyway
        check_memory(small_config("--runtime.check_memory", "false"), default_model, log=logging.getLogger("test-budget"))
    assert "the trainer needs about" in caplog.text and "starting anyway" in caplog.text


def test_dry_run_prints_the_trainer_budget(tmp_path):
    out = _cli([*SMALL, "--trainer.memory_budget_gb", "0.3", "--dry-run"], **{AVAILABLE_ENV: "1000"})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    budget = next(line for line in lines if line.startswith("#   trainer budget: "))
    assert budget.startswith("#   trainer budget: 0.30 GB (trainer.memory_budget_gb = 0.3); the trainer's "), budget
    assert budget.endswith("GB with trainer.micro_batch_tokens = 2048 does not fit"), budget
    assert any(line.startswith("#   trainer: ") and "raise trainer.memory_budget_gb" in line for line in lines)
    out = _cli([*SMALL, "--dry-run"], **{AVAILABLE_ENV: "1000"})
    assert any(line.startswith("#   trainer budget: ") and line.endswith(" fits") and "less " in line
               for line in out.stdout.splitlines()), out.stdout[-2000:]


def test_each_memory_setting_moves_the_estimate_the_right_way():
    def need(*overrides: str, tokens: int = 8192) -> float:
        cfg = small_config("--rollout.prompts_per_step", "64", *overrides)
        return sum(trainer_parts(cfg, SMOLLM2, micro_batch_fill(cfg, 300, tokens)).values())

    base = need()
    assert need(tokens=2048) < need(tokens=4096) < base  # more micro-batch tokens, more memory
    assert need("--trainer.gradient_checkpointing", "true") < base
    assert need("--trainer.logprob_chunk_tokens", "512") < base
    assert need("--trainer.gradient_checkpointing", "true", "--trainer.logprob_chunk_tokens", "512") < \
        need("--trainer.gradient_checkpointing", "true")
    assert need("--trainer.lora_rank", "8") < base  # no gradients or AdamW state for the base weights
    # lean activations take, per token and layer, one intermediate-size float32 value off the
    # peak in float32 (the tiny test config's dtype; measured, memory_estimate.LEAN_FP32), and 2.5
    # hidden-size and one intermediate-size values under bfloat16 autocast (LEAN_BF16)
    lean_off = need("--trainer.lean_activations", "false")
    assert lean_off - base == pytest.approx(4 * 8192 * SMOLLM2.layers * SMOLLM2.intermediate)
    bf16 = ("--trainer.dtype", "bfloat16")
    lean_off = need(*bf16, "--trainer.lean_activations", "false")
    assert lean_off - need(*bf16) == pytest.approx(4 * 8192 * SMOLLM2.layers * (2.5 * SMOLLM2.hidden + SMOLLM2.intermediate))
    # one weight-sync slot instead of two: one copy of the weights as they travel (bfloat16) less
    slots = {n: run_trainer_parts(small_config("--sync.slots", str(n), "--engine.dtype", "bfloat16"), SMOLLM2, 4096)
             for n in (1, 2)}
    assert slots[2]["sync_slots"] - slots[1]["sync_slots"] == 2 * SMOLLM2.params
    # a micro-batch never holds less than one sequence, nor more than the whole batch
    cfg = small_config("--rollout.prompts_per_step", "2", "--rollout.group_size", "2")
    assert micro_batch_fill(cfg, 300, 100) == 300 and micro_batch_fill(cfg, 300, 8192) == 1200

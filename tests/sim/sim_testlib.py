"""Synthetic ``calibration.json`` runs: component timings drawn from known rates, and a
"measured" wall time produced by simulating those rates (the stand-in for a real run)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenflow.sim import Calibration, SimConfig, simulate
from tokenflow.sim.calibration.timings import (
    EngineTimings,
    Measured,
    RunInfo,
    SyncTimings,
    TrainerTimings,
)

# A CPU-sized pipeline: one engine and one trainer process, a tiny model.
TRUTH = {"a": 0.004, "b": 0.0006, "prefill": 2e-5, "train_o": 0.3, "train_s": 4e-4,
         "sync_bytes": 4.0e7, "sync_s": 0.08, "swap_s": 0.01, "median": 40, "p90": 90,
         "prompt": 24, "prompts_per_step": 4, "group_size": 4, "max_tokens": 160}


def truth_config(t: dict, *, lengths: list[int], max_staleness: int, update_mode: str,
                 steps: int, slow: float, seed: int) -> SimConfig:
    return SimConfig.model_validate({
        "hardware": {"inference_gpus": 1, "training_gpus": 1, "decode_step_base_s": t["a"] * slow,
                     "decode_step_per_seq_s": t["b"] * slow, "max_running_seqs": 256,
                     "prefill_s_per_token": t["prefill"] * slow, "train_step_overhead_s": t["train_o"] * slow,
                     "train_s_per_token": t["train_s"] * slow, "model_bytes": t["sync_bytes"],
                     "shared_memory_bandwidth_gbps": t["sync_bytes"] / t["sync_s"] / 1e9,
                     "sync_latency_s": 0.0, "swap_bandwidth_gbps": 1e9, "swap_overhead_s": t["swap_s"]},
        "workload": {"prompts_per_step": t["prompts_per_step"], "group_size": t["group_size"],
                     "completion_lengths": lengths, "empirical_order": "replay",
                     "prompt_length": t["prompt"],
                     "max_tokens": t["max_tokens"]},
        "pipeline": {"max_staleness": max_staleness, "update_mode": update_mode},
        "sim": {"steps": steps, "warmup_steps": 0, "seed": seed},
    })


def make_run(run_dir: Path, mode: str, *, t: dict = TRUTH, max_staleness: int = 2, steps: int = 12,
             update_mode: str = "inflight", slow: float = 1.0, seed: int = 0) -> Calibration:
    """Write ``run_dir/calibration.json`` for a run whose components run ``slow`` times the rates."""
    rng = np.random.default_rng(seed)
    k = 0 if mode == "sync" else max_staleness
    sigma = np.log(t["p90"] / t["median"]) / 1.2816
    lengths = np.clip(np.rint(rng.lognormal(np.log(t["median"]), sigma, 300)), 1, t["max_tokens"]).astype(int).tolist()
    n = rng.integers(1, (k + 1) * t["prompts_per_step"] * t["group_size"] + 1, 2000)
    noise = 1 + 0.03 * rng.standard_normal(n.size)
    noise[rng.random(n.size) < 0.01] = 6.0  # the odd GC pause
    decode = np.stack([n, (t["a"] + t["b"] * n) * slow * noise], 1).tolist()
    ptoks = rng.integers(t["prompt"], t["prompt"] * t["group_size"], 200)
    prefill = np.stack([ptoks, t["prefill"] * ptoks * slow], 1).tolist()
    rollouts = t["prompts_per_step"] * t["group_size"]
    ttoks = rng.integers(rollouts * (t["prompt"] + t["median"] // 2), rollouts * (t["prompt"] + 2 * t["median"]), steps)
    trainer = np.stack([ttoks, (t["train_o"] + t["train_s"] * ttoks) * slow], 1).tolist()
    truth = simulate(truth_config(t, lengths=lengths, max_staleness=k, update_mode=update_mode,
                                  steps=steps, slow=slow, seed=1000 + seed))
    run_dir.mkdir(parents=True, exist_ok=True)
    cal = Calibration(
        run=RunInfo(mode=mode, prompts_per_step=t["prompts_per_step"], group_size=t["group_size"],
                    max_staleness=k, steps=steps, update_mode=update_mode, sync_every=1,
                    wall_s=truth.wall_s, engine_threads=1, trainer_threads=1),
        engine=EngineTimings(decode_steps=decode, prefill=prefill),
        completion_lengths=lengths, prompt_lengths=[t["prompt"]] * 50,
        trainer=TrainerTimings(steps=trainer),
        sync=SyncTimings(updates=[[t["sync_bytes"], t["sync_s"]]] * steps, engine_pauses=[t["swap_s"]] * steps),
        measured=Measured(wall_s=truth.wall_s, trainer_idle_frac=truth.trainer_idle_frac,
                          engine_idle_frac=truth.inference_idle_frac, steps=steps),
    )
    cal.to_json(run_dir)
    return cal


def make_bench(root: Path, *, async_slow: float = 1.0, **kw) -> Path:
    """A ``tokenflow bench pipeline``-style folder: ``sync/`` and ``async/`` runs."""
    make_run(root / "sync", "sync", seed=1, **kw)
    make_run(root / "async", "async", seed=2, slow=async_slow, **kw)
    return root

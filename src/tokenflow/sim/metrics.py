"""Results of one simulation, summarised from the raw recorder.

Rates are steady-state: measured over the window from the end of the warm-up steps to the end
of the last step (the whole run when there are no more steps than warm-up). ``wall_s`` is the
whole run from t = 0.

Idle fractions follow the runtime's definitions, so calibrated predictions compare like with
like: the trainer is idle while it waits for a batch (sending weights, including any wait for
a slot or for the engines to join, counts as busy); an engine is idle whenever it neither
decodes nor prefills (a weight swap, a pause in blocking mode, an empty queue).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from tokenflow.config.sim import SimConfig
from tokenflow.sim.costs import Costs
from tokenflow.sim.recorder import ENGINE_STATES, Recorder, StepRecord


@dataclass
class SimResult:
    wall_s: float
    """Simulated seconds from the start to the end of the last step."""
    steps: int
    window_s: float
    """Length of the steady-state window (s)."""
    tokens_per_s: float
    """Completion tokens trained on (not rejected) per second."""
    generated_tokens_per_s: float
    """Completion tokens the inference pool emitted per second."""
    steps_per_hour: float
    step_time_s: float
    """Mean seconds per optimizer step in the window."""
    step_breakdown_s: dict[str, float]
    """Mean seconds per step: wait_data, train, sync_wait, sync."""
    trainer_idle_frac: float
    inference_idle_frac: float
    inference_breakdown: dict[str, float]
    """Fraction of engine time per state (decode, prefill, swap, paused, idle)."""
    inference_mean_batch: float
    """Mean running sequences per decode step."""
    staleness: dict
    """Token-weighted age at consumption: mean, p50, p90, max, histogram {age: fraction}."""
    tokens_rejected: int
    """Completion tokens dropped by version rejection (window)."""
    tokens_reprefilled: int
    """Tokens re-prefilled to resume aborted rollouts (window)."""
    wasted_frac: float
    """(rejected + re-prefilled) / completion tokens consumed, in the window."""
    setup: dict
    """The configuration that produced this result, in a few numbers."""
    step_records: list[StepRecord] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("step_records")
        d["staleness"]["histogram"] = {str(k): v for k, v in self.staleness["histogram"].items()}
        return d

    @property
    def generation_s(self) -> float:
        """Mean seconds per step the trainer waited for its batch (the generation time in sync mode)."""
        return self.step_breakdown_s["wait_data"]


def _staleness(ages: Counter) -> dict:
    total = sum(ages.values())
    if not total:
        return {"mean": 0.0, "p50": 0, "p90": 0, "max": 0, "histogram": {}}
    keys = sorted(ages)
    counts = np.array([ages[k] for k in keys], dtype=float)
    cdf = np.cumsum(counts) / total
    pick = lambda q: int(keys[int(np.searchsorted(cdf, q - 1e-12))])
    return {"mean": float(np.dot(keys, counts) / total), "p50": pick(0.5), "p90": pick(0.9),
            "max": int(keys[-1]), "histogram": {k: ages[k] / total for k in keys}}


def summarise(cfg: SimConfig, costs: Costs, rec: Recorder) -> SimResult:
    steps = rec.steps
    warm = cfg.sim.warmup_steps if cfg.sim.warmup_steps < len(steps) else 0
    t0 = steps[warm - 1].end_s if warm else 0.0
    t1 = steps[-1].end_s
    window = max(t1 - t0, 1e-12)
    measured = steps[warm:]

    kept = sum(s.completion_tokens - s.rejected_tokens for s in measured)
    consumed = sum(s.completion_tokens for s in measured)
    rejected = sum(s.rejected_tokens for s in measured)
    reprefilled = sum(tok for t, tok in rec.reprefill if t0 <= t <= t1)
    ages: Counter = Counter()
    for s in measured:
        ages.update(s.ages)
    n = len(measured)
    breakdown = {
        "wait_data": sum(s.wait_data_s for s in measured) / n,
        "train": sum(s.train_s for s in measured) / n,
        "sync_wait": sum(s.sync_wait_s for s in measured) / n,
        "sync": sum(s.sync_s for s in measured) / n,
    }

    states = {k: 0.0 for k in ENGINE_STATES}
    generated = decode_steps = 0.0
    for e in range(rec.engines):
        for state in ENGINE_STATES[:-1]:
            secs, tok, st = rec.engine_time(e, state, t0, t1)
            states[state] += secs
            if state == "decode":
                generated += tok
                decode_steps += st
    total_engine = window * rec.engines
    states["idle"] = max(total_engine - sum(states.values()), 0.0)
    inference_breakdown = {k: v / total_engine for k, v in states.items()}
    hw, p = cfg.hardware, cfg.pipeline
    return SimResult(
        wall_s=t1,
        steps=len(steps),
        window_s=window,
        tokens_per_s=kept / window,
        generated_tokens_per_s=generated / window,
        steps_per_hour=n / window * 3600.0,
        step_time_s=window / n,
        step_breakdown_s=breakdown,
        trainer_idle_frac=breakdown["wait_data"] * n / window,
        inference_idle_frac=1.0 - inference_breakdown["decode"] - inference_breakdown["prefill"],
        inference_breakdown=inference_breakdown,
        inference_mean_batch=generated / decode_steps if decode_steps else 0.0,
        staleness=_staleness(ages),
        tokens_rejected=rejected,
        tokens_reprefilled=reprefilled,
        wasted_frac=(rejected + reprefilled) / consumed if consumed else 0.0,
        setup={"inference_gpus": hw.inference_pool, "training_gpus": hw.training_pool,
               "engines": hw.engines, "max_staleness": p.max_staleness,
               "update_mode": p.update_mode, "sync_every": p.sync_every,
               "rollouts_per_step": cfg.workload.rollouts_per_step, "transport": p.transport,
               "sync_send_s": costs.sync_s, "swap_s": costs.swap_s},
        step_records=list(steps),
    )

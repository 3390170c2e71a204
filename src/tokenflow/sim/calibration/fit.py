"""Fit the simulator's rate parameters to the component timings of a real run.

Only component measurements are used (decode steps, prefill calls, optimizer steps, weight
updates, lengths); the run's wall time and idle fractions are what the fit is judged against
and never enter it.

* decode step: ``t(n) = a + b n`` by least squares over the per-n medians (weighted by how
  often each n occurs), so a GC pause or a scheduler hiccup does not tilt the line;
* prefill: ``c0 + c * tokens``; optimizer step: ``o + s * tokens``; trainer side of a weight
  update: ``S0 + bytes / bandwidth``: ordinary least squares; engine swap pause: the mean;
* lengths: the run's own completion and prompt lengths, resampled (empirical distribution).

Every line is constrained to non-negative coefficients: a negative intercept is refitted
through the origin, a negative slope becomes a constant. With a single distinct x the slope
cannot be told from the intercept; the fit then passes through the origin, i.e. assumes
the cost is proportional to the work.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tokenflow.sim.calibration.timings import Calibration

log = logging.getLogger(__name__)


def fit_line(points, robust: bool = False) -> tuple[float, float]:
    """(intercept, slope) >= 0 of ``seconds = a + b * x`` over ``[[x, seconds], ...]``."""
    arr = np.asarray(points, dtype=float).reshape(-1, 2)
    if len(arr) == 0:
        return 0.0, 0.0
    x, y = arr[:, 0], arr[:, 1]
    w = np.ones_like(x)
    if robust:
        xs = np.unique(x)
        y = np.array([np.median(arr[x == v, 1]) for v in xs])
        w = np.array([np.sum(x == v) for v in xs], dtype=float)
        x = xs
    if len(np.unique(x)) < 2:
        return (0.0, float(np.sum(w * y) / np.sum(w * x))) if np.any(x > 0) else (float(np.mean(y)), 0.0)
    sw = np.sqrt(w)
    (a, b), *_ = np.linalg.lstsq(np.stack([sw, sw * x], axis=1), sw * y, rcond=None)
    if b < 0:
        return float(np.sum(w * y) / np.sum(w)), 0.0
    if a < 0:
        return 0.0, float(np.sum(w * x * y) / np.sum(w * x * x))
    return float(a), float(b)


@dataclass
class FittedRates:
    """Rate parameters fitted from one run (seconds, tokens, bytes)."""

    decode_base_s: float
    decode_per_seq_s: float
    max_running_seqs: int
    prefill_overhead_s: float
    prefill_s_per_token: float
    train_overhead_s: float
    train_s_per_token: float
    sync_overhead_s: float
    sync_s_per_byte: float
    sync_bytes: float
    swap_s: float
    completion_lengths: list[int]
    prompt_lengths: list[int]

    def hardware_layer(self) -> dict:
        """A raw ``[hardware]`` table for one engine and one trainer, as on the measured machine."""
        gbps = 1.0 / (self.sync_s_per_byte * 1e9) if self.sync_s_per_byte > 0 else 1e9
        return {
            "inference_gpus": 1, "training_gpus": 1, "gpus_per_engine": 1,
            "decode_step_base_s": self.decode_base_s, "decode_step_per_seq_s": self.decode_per_seq_s,
            "max_running_seqs": self.max_running_seqs,
            "prefill_overhead_s": self.prefill_overhead_s, "prefill_s_per_token": self.prefill_s_per_token,
            "prefix_sharing": True,
            "train_step_overhead_s": self.train_overhead_s, "train_s_per_token": self.train_s_per_token,
            "model_bytes": max(self.sync_bytes, 1.0), "num_param_tensors": 1, "sync_latency_s": 0.0,
            "sync_overhead_s": self.sync_overhead_s,
            "broadcast_bandwidth_gbps": gbps, "shared_memory_bandwidth_gbps": gbps,
            "swap_bandwidth_gbps": 1e9, "swap_overhead_s": self.swap_s,
        }

    def summary(self) -> dict:
        d = asdict(self)
        d["completion_lengths"] = _describe(self.completion_lengths)
        d["prompt_lengths"] = _describe(self.prompt_lengths)
        return d


def _describe(v: list[int]) -> dict:
    if not v:
        return {"n": 0}
    a = np.asarray(v)
    return {"n": int(a.size), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "max": int(a.max())}


def _trace_timings(run_dir: Path) -> dict[str, list]:
    """Timings from a merged ``trace.json``, for runs whose calibration lacks them: spans
    ``engine/decode`` (arg ``seqs``), ``engine/prefill`` (arg ``tokens``), ``engine/weight_swap``."""
    path = run_dir / "trace.json"
    out: dict[str, list] = {"decode_steps": [], "prefill": [], "engine_pauses": []}
    if not path.exists():
        return out
    events = json.loads(path.read_text(encoding="utf-8")).get("traceEvents", [])
    for ev in events:
        args = ev.get("args") or {}
        if ev.get("ph") != "X":
            continue
        if ev.get("name") == "engine/decode" and "seqs" in args:
            out["decode_steps"].append([args["seqs"], ev["dur"] / 1e6])
        elif ev.get("name") == "engine/prefill" and "tokens" in args:
            out["prefill"].append([args["tokens"], ev["dur"] / 1e6])
        elif ev.get("name") == "engine/weight_swap":
            out["engine_pauses"].append(ev["dur"] / 1e6)
    return out


def fit_rates(cal: Calibration, fallback: Calibration | None = None,
              run_dir: Path | None = None) -> FittedRates:
    """Fit one run's rates; a component this run lacks is taken from ``fallback`` (the other
    run of a bench pair), then from the run's trace."""
    trace = _trace_timings(run_dir) if run_dir is not None else {}

    def pick(get):
        for src in (cal, fallback):
            if src is not None and get(src):
                return get(src)
        return []

    decode = pick(lambda c: c.engine.decode_steps) or trace.get("decode_steps", [])
    prefill = pick(lambda c: c.engine.prefill) or trace.get("prefill", [])
    train = pick(lambda c: c.trainer.steps)
    sync = pick(lambda c: c.sync.updates)
    pauses = pick(lambda c: c.sync.engine_pauses) or trace.get("engine_pauses", [])
    completions = pick(lambda c: c.completion_lengths)
    prompts = pick(lambda c: c.prompt_lengths)
    if not decode:
        raise ValueError("calibration has no engine.decode_steps (and no trace.json with engine/decode spans)")
    if not train:
        raise ValueError("calibration has no trainer.steps")
    if not completions:
        raise ValueError("calibration has no completion_lengths")
    a, b = fit_line(decode, robust=True)
    p0, p1 = fit_line(prefill)
    t0, t1 = fit_line(train)
    s0, s1 = fit_line(sync)
    seen = [int(n) for n, _ in decode]
    return FittedRates(
        decode_base_s=a, decode_per_seq_s=b, max_running_seqs=max(seen),
        prefill_overhead_s=p0, prefill_s_per_token=p1,
        train_overhead_s=t0, train_s_per_token=t1,
        sync_overhead_s=s0, sync_s_per_byte=s1,
        sync_bytes=float(np.mean([u[0] for u in sync])) if sync else 1.0,
        swap_s=float(np.mean(pauses)) if pauses else 0.0,
        completion_lengths=list(completions), prompt_lengths=list(prompts),
    )

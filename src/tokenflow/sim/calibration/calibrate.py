"""``--calibrate RUN_DIR``: fit rates on a real run, replay its configuration, compare wall times.

RUN_DIR is either one run folder holding ``calibration.json`` or a ``tokenflow bench pipeline``
output folder holding ``sync/`` and ``async/`` run folders. Each run is simulated with the rates
fitted on its own component timings: those of the async run already contain whatever the
engine and trainer cost each other when they share a machine (two processes on two cores), so
contention is fitted, not guessed. A component a run lacks comes from the other run.

A run is replayed with its own completion and prompt lengths in the order they were recorded
(``empirical_order = "replay"``): over a few steps the stragglers decide the wall time, and
resampling would hand each step different ones. A run predicted with the other run's lengths
(the synchronous counterpart of a lone async run) resamples them, averaging ``seeds``
simulations.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokenflow.config.sim import SimConfig
from tokenflow.sim.calibration.timings import FILENAME, Calibration
from tokenflow.sim.calibration.fit import FittedRates, fit_rates
from tokenflow.sim.loading import load_layers
from tokenflow.sim.metrics import SimResult
from tokenflow.sim.pipeline import simulate

log = logging.getLogger(__name__)


@dataclass
class RunPrediction:
    label: str
    predicted_wall_s: float
    predicted_trainer_idle_frac: float
    predicted_engine_idle_frac: float
    measured_wall_s: float | None = None
    measured_trainer_idle_frac: float | None = None
    measured_engine_idle_frac: float | None = None

    @property
    def error(self) -> float | None:
        """Relative error of the predicted wall time."""
        if not self.measured_wall_s:
            return None
        return self.predicted_wall_s / self.measured_wall_s - 1.0


@dataclass
class CalibrationReport:
    source: str
    runs: dict[str, RunPrediction] = field(default_factory=dict)
    rates: dict[str, FittedRates] = field(default_factory=dict)

    def ratio(self, which: str) -> float | None:
        """async / sync wall time, ``which`` = "predicted" or "measured"."""
        if "async" not in self.runs or "sync" not in self.runs:
            return None
        a = getattr(self.runs["async"], f"{which}_wall_s")
        s = getattr(self.runs["sync"], f"{which}_wall_s")
        return a / s if a and s else None

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "runs": {k: {**vars(v), "error": v.error} for k, v in self.runs.items()},
            "ratio_async_over_sync": {"predicted": self.ratio("predicted"),
                                      "measured": self.ratio("measured")},
            "rates": {k: v.summary() for k, v in self.rates.items()},
        }


def find_runs(path: str | Path) -> dict[str, tuple[Path, Calibration]]:
    """``{mode: (run folder, calibration)}`` for a run folder or a bench output folder."""
    path = Path(path)
    if (path / FILENAME).exists():
        cal = Calibration.from_json(path)
        return {cal.run.mode: (path, cal)}
    runs = {}
    for sub in sorted(p for p in path.iterdir() if (p / FILENAME).exists()) if path.is_dir() else []:
        cal = Calibration.from_json(sub)
        mode = cal.run.mode if cal.run.mode in ("sync", "async") else sub.name
        if mode in runs:
            raise ValueError(f"{path}: two {mode} runs ({runs[mode][0].name}, {sub.name})")
        runs[mode] = (sub, cal)
    if not runs:
        raise ValueError(f"{path}: no {FILENAME} here nor in sync/ and async/ subfolders")
    return runs


def replay_config(rates: FittedRates, cal: Calibration, *, max_staleness: int, seed: int,
                  replay: bool = True) -> SimConfig:
    """The simulator config of a measured run: its shape and update settings, fitted rates."""
    r = cal.run
    workload = {"prompts_per_step": r.prompts_per_step, "group_size": r.group_size,
                "completion_lengths": rates.completion_lengths,
                "empirical_order": "replay" if replay else "resample",
                "max_tokens": max(rates.completion_lengths)}
    if rates.prompt_lengths:
        workload["prompt_lengths"] = rates.prompt_lengths
    update_mode = r.update_mode if r.update_mode in ("inflight", "abort", "drain", "blocking") else "inflight"
    layer = {
        "hardware": rates.hardware_layer(),
        "workload": workload,
        "pipeline": {"max_staleness": max_staleness, "update_mode": update_mode,
                     # The fitted send time already holds any wait the real transport had;
                     # shared memory adds none of its own unless an engine lags two versions.
                     "sync_every": r.sync_every, "transport": "shared_memory"},
        "sim": {"steps": r.steps, "warmup_steps": 0, "seed": seed},
    }
    return load_layers([(f"calibration ({r.mode})", layer)])


def _predict(rates: FittedRates, cal: Calibration, max_staleness: int, seeds: int,
             replay: bool) -> list[SimResult]:
    if replay:  # deterministic: one simulation is the prediction
        return [simulate(replay_config(rates, cal, max_staleness=max_staleness, seed=0))]
    return [simulate(replay_config(rates, cal, max_staleness=max_staleness, seed=s, replay=False))
            for s in range(seeds)]


def calibrate(path: str | Path, seeds: int = 5) -> CalibrationReport:
    """Fit, replay and compare every run found under ``path``."""
    runs = find_runs(path)
    report = CalibrationReport(source=str(path))
    for mode, (run_dir, cal) in runs.items():
        other = next((c for m, (_, c) in runs.items() if m != mode), None)
        report.rates[mode] = fit_rates(cal, fallback=other, run_dir=run_dir)
    targets = dict(runs)
    if "sync" not in targets and "async" in targets:
        # One async run: also predict its synchronous counterpart with the same rates.
        targets["sync"] = (None, runs["async"][1])
        report.rates.setdefault("sync", report.rates["async"])
    for mode, (run_dir, cal) in targets.items():
        k = 0 if mode == "sync" else cal.run.max_staleness
        results = _predict(report.rates[mode], cal, k, seeds, replay=run_dir is not None)
        m = cal.measured if run_dir is not None else None
        report.runs[mode] = RunPrediction(
            label=mode,
            predicted_wall_s=float(np.mean([x.wall_s for x in results])),
            predicted_trainer_idle_frac=float(np.mean([x.trainer_idle_frac for x in results])),
            predicted_engine_idle_frac=float(np.mean([x.inference_idle_frac for x in results])),
            measured_wall_s=m.wall_s if m else None,
            measured_trainer_idle_frac=m.trainer_idle_frac if m else None,
            measured_engine_idle_frac=m.engine_idle_frac if m else None,
        )
        log.info("%s: predicted %.1f s, measured %s", mode, report.runs[mode].predicted_wall_s,
                 f"{m.wall_s:.1f} s" if m else "-")
    return report

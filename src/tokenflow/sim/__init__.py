"""Capacity planner: a discrete-event simulation (SimPy) of the tokenflow pipeline.

    from tokenflow.sim import load_config, simulate
    result = simulate(load_config(preset="h100-7b-vllm", overrides={"pipeline.max_staleness": 2}))
    result.tokens_per_s, result.trainer_idle_frac, result.staleness["mean"]

Modules (the sections are ``tokenflow.config.sim``): ``loading`` (TOML, presets, overrides), ``presets``,
``workload`` (length distributions), ``costs`` (rate model), ``engine`` / ``trainer`` /
``buffer`` / ``pipeline`` (the processes), ``metrics`` (results), ``sweep``, ``calibration``
(``timings``: the runtime's ``calibration.json`` schema; ``fit`` and ``calibrate``: fitting a real run),
``report`` (tables, figure). See docs/simulate.md.

May import: layers 1-5 (today only ``tokenflow.config``: it models the pipeline, it does not run
it); no other front end.
"""

from tokenflow.config.sim import (
    HardwareConfig,
    PipelineConfig,
    SimConfig,
    SimSection,
    WorkloadConfig,
)
from tokenflow.sim.calibration.calibrate import CalibrationReport, calibrate
from tokenflow.sim.calibration.timings import Calibration
from tokenflow.sim.loading import ConfigError, load_config
from tokenflow.sim.metrics import SimResult
from tokenflow.sim.pipeline import simulate
from tokenflow.sim.presets import PRESETS
from tokenflow.sim.sweep import SweepResult, run_sweep

__all__ = [
    "PRESETS",
    "Calibration",
    "CalibrationReport",
    "ConfigError",
    "HardwareConfig",
    "PipelineConfig",
    "SimConfig",
    "SimResult",
    "SimSection",
    "SweepResult",
    "WorkloadConfig",
    "calibrate",
    "load_config",
    "run_sweep",
    "simulate",
]

"""Metric sinks on one global step axis (optimizer steps).

Keys are namespaced (``reward/mean``, ``loss/policy``, ``offpolicy/is_ratio_mean``,
``buffer/fill``, ``sync/engine_pause_s``, ``perf/tokens_per_s`` ...). JSONL is always written;
TensorBoard and Weights & Biases are chosen in ``[metrics] sinks``.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import time
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


class MetricSink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Called once per optimizer step (and for evaluations) with flat namespaced scalars."""
        ...

    def close(self) -> None:
        """Called once at the end of the run; flushes files."""
        ...


def strict(value):
    """``value`` with every non-finite float replaced by None, so that ``json.dumps(...,
    allow_nan=False)`` writes strict JSON (a bare ``NaN`` is not JSON; other tools refuse it)."""
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps_strict(value, **kwargs) -> str:
    return json.dumps(strict(value), allow_nan=False, **kwargs)


def _clean(metrics: dict) -> dict:
    """Finite real scalars only, as plain Python numbers (NumPy scalars included; NaN/inf and
    non-numbers dropped)."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, numbers.Real):
            v = v if type(v) in (int, float) else float(v)
            if math.isfinite(v):
                out[k] = v
    return out


class JsonlSink:
    """One JSON object per line: ``{"step": s, ...metrics}``; appends, so resume continues a file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        from tokenflow.metrics.safe_files import open_text

        self._f = open_text(self.path, "a")  # never through a link the run folder carries

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._f.write(json.dumps({"step": step, **_clean(metrics)}, allow_nan=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class TensorBoardSink:
    """Scalars in TensorBoard's event-file format, written with the ``tensorboard`` package's own
    writer (what ``torch.utils.tensorboard.SummaryWriter`` wraps), so the orchestrator's process
    never imports torch for it."""

    def __init__(self, log_dir: str | Path, purge_step: int | None = None) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        # flush_secs: a live TensorBoard (and a killed run's files) lag at most this much.
        self.writer = EventFileWriter(str(log_dir), max_queue_size=10, flush_secs=10)
        if purge_step is not None:
            # On resume, TensorBoard hides the events a killed run logged at or after purge_step
            # (what SummaryWriter(purge_step=...) writes).
            self.writer.add_event(Event(step=purge_step, file_version="brain.Event:2"))
            self.writer.add_event(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in _clean(metrics).items()]
        if values:
            self.writer.add_event(Event(wall_time=time.time(), step=int(step), summary=Summary(value=values)))

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbSink:
    def __init__(self, run_dir: str | Path, project: str, name: str, mode: str, config: dict) -> None:
        try:
            import wandb
        except ImportError:
            raise RuntimeError('metrics sink "wandb" needs W&B: pip install "tokenflow-rl[wandb]"') from None
        # Files go to <run_dir>/wandb/. Each run is finished in close(), so several runs in one
        # process (bench pipeline) need no reinit option.
        self.run = wandb.init(project=project, name=name, dir=str(run_dir), mode=mode, config=config)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(_clean(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MetricLogger:
    """Fans one ``log(step, metrics)`` out to every configured sink."""

    def __init__(self, sinks: list[MetricSink]) -> None:
        self.sinks = sinks

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for s in self.sinks:
            s.log(step, metrics)

    def close(self) -> None:
        for s in self.sinks:
            try:
                s.close()
            except Exception as e:  # noqa: BLE001 - one broken sink must not lose the others
                log.warning("closing metrics sink %s failed: %s", type(s).__name__, e)


def build_logger(cfg, run_dir: Path, run_name: str, config_dict: dict,
                 resume_step: int | None = None) -> MetricLogger:
    sinks: list[MetricSink] = [JsonlSink(run_dir / "metrics.jsonl")]
    if "tensorboard" in cfg.sinks:
        sinks.append(TensorBoardSink(run_dir / "tensorboard", purge_step=resume_step))
    if "wandb" in cfg.sinks:
        sinks.append(WandbSink(run_dir, cfg.wandb_project, run_name, cfg.wandb_mode, config_dict))
    return MetricLogger(sinks)


def read_jsonl(path: str | Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a run killed mid-write leaves a torn last line
    return rows

"""Metric sinks: what is logged comes back from the files each sink writes, on the step axis."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.metrics.wandb_testlib import history
from tokenflow.config.run import MetricsConfig
from tokenflow.metrics.sinks import (
    JsonlSink,
    MetricLogger,
    TensorBoardSink,
    build_logger,
    read_jsonl,
)


def tensorboard_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in ``log_dir`` read with TensorBoard's own event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_jsonl_keeps_finite_numbers_and_appends(tmp_path):
    path = tmp_path / "metrics.jsonl"
    sink = JsonlSink(path)
    sink.log(1, {"reward/mean": np.float32(0.25), "loss/total": -1.5, "optim/skipped": True,
                 "perf/bad": float("nan"), "perf/inf": math.inf, "note": "text", "buffer/n": np.int64(3)})
    sink.close()
    sink = JsonlSink(path)  # a resumed run appends
    sink.log(2, {"reward/mean": 0.5})
    sink.close()
    rows = read_jsonl(path)
    assert rows == [{"step": 1, "reward/mean": 0.25, "loss/total": -1.5, "optim/skipped": 1.0, "buffer/n": 3.0},
                    {"step": 2, "reward/mean": 0.5}]


def test_jsonl_reader_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a"')
    assert read_jsonl(path) == [{"step": 1, "a": 1.0}]


def test_tensorboard_scalars_read_back_with_tensorboards_reader(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb")
    for step in range(1, 6):
        sink.log(step, {"reward/mean": 0.1 * step, "offpolicy/token_age_mean": np.float64(step / 4),
                        "perf/nan": float("nan")})
    sink.close()
    scalars = tensorboard_scalars(tmp_path / "tb")
    assert set(scalars) == {"reward/mean", "offpolicy/token_age_mean"}
    assert [s for s, _ in scalars["reward/mean"]] == [1, 2, 3, 4, 5]
    assert [v for _, v in scalars["reward/mean"]] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5], rel=1e-6)
    assert [v for _, v in scalars["offpolicy/token_age_mean"]] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.25])


def test_tensorboard_resume_purges_steps_after_the_checkpoint(tmp_path):
    sink = TensorBoardSink(tmp_path / "tb")
    for step in range(1, 6):
        sink.log(step, {"loss/total": float(step)})
    sink.close()
    sink = TensorBoardSink(tmp_path / "tb", purge_step=4)  # resumed from the step-3 checkpoint
    for step in (4, 5, 6):
        sink.log(step, {"loss/total": 10.0 * step})
    sink.close()
    assert tensorboard_scalars(tmp_path / "tb")["loss/total"] == [
        (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]


def test_a_sink_that_fails_to_close_does_not_lose_the_others(tmp_path, caplog):
    class Broken:
        def log(self, step, metrics):
            pass

        def close(self):
            raise OSError("disk gone")

    jsonl = JsonlSink(tmp_path / "m.jsonl")
    logger = MetricLogger([Broken(), jsonl])
    logger.log(1, {"a": 1.0})
    logger.close()
    assert jsonl._f.closed
    assert "Broken" in caplog.text


@pytest.fixture()
def offline_wandb(tmp_path, monkeypatch):
    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path),
                       "WANDB_CONFIG_DIR": str(tmp_path / ".wandb-config"),
                       "WANDB_CACHE_DIR": str(tmp_path / ".wandb-cache")}.items():
        monkeypatch.setenv(key, value)
    return tmp_path


@pytest.mark.slow
def test_wandb_offline_run_writes_its_history(offline_wandb):
    run_dir = offline_wandb / "run"
    run_dir.mkdir()
    cfg = MetricsConfig(sinks=["jsonl", "wandb"], wandb_mode="offline")
    logger = build_logger(cfg, run_dir, "sinks-test", {"rollout": {"group_size": 4}})
    for step in range(1, 4):
        logger.log(step, {"reward/mean": step / 10, "loss/total": -float(step), "perf/nan": float("nan")})
    logger.close()
    files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, list(run_dir.rglob("*"))
    rows = history(files[0])
    assert [r["_step"] for r in rows] == [1, 2, 3]
    assert [r["reward/mean"] for r in rows] == pytest.approx([0.1, 0.2, 0.3])
    assert all("perf/nan" not in r for r in rows)
    # the JSONL sink is written alongside, whatever else is chosen
    assert [r["loss/total"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [-1.0, -2.0, -3.0]


def test_two_wandb_runs_in_one_process(offline_wandb):
    """bench pipeline trains twice in one process: each run gets its own W&B files."""
    cfg = MetricsConfig(sinks=["wandb"], wandb_mode="offline")
    for name in ("sync", "async"):
        d = offline_wandb / name
        d.mkdir()
        logger = build_logger(cfg, d, name, {})
        logger.log(1, {"reward/mean": 1.0 if name == "sync" else 2.0})
        logger.close()
    for name, want in (("sync", 1.0), ("async", 2.0)):
        (f,) = (offline_wandb / name / "wandb").glob("offline-run-*/run-*.wandb")
        assert [r["reward/mean"] for r in history(f)] == [want]
    assert json.loads((offline_wandb / "sync" / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1

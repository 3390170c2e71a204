"""Calibration: the calibration.json schema, the fit, predictions of synthetic runs (known
rates), and predictions of two real recorded runs (tests/sim/fixtures/real_bench)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.sim.sim_testlib import TRUTH, make_bench, make_run
from tokenflow.sim import Calibration, calibrate
from tokenflow.sim.calibration.calibrate import find_runs
from tokenflow.sim.calibration.fit import fit_line, fit_rates


def test_calibration_json_round_trip(tmp_path):
    cal = make_run(tmp_path / "run", "async")
    back = Calibration.from_json(tmp_path / "run")
    assert back == cal
    raw = json.loads((tmp_path / "run" / "calibration.json").read_text())
    assert set(raw) == {"run", "engine", "completion_lengths", "prompt_lengths", "trainer", "sync", "measured"}
    assert set(raw["run"]) >= {"mode", "prompts_per_step", "group_size", "max_staleness", "steps",
                               "update_mode", "sync_every", "wall_s", "engine_threads", "trainer_threads"}


def test_reads_the_documented_schema_and_ignores_new_keys(tmp_path):
    doc = {"run": {"mode": "sync", "prompts_per_step": 2, "group_size": 2, "max_staleness": 0, "steps": 3,
                   "update_mode": "inflight", "sync_every": 1, "wall_s": 9.0, "engine_threads": None,
                   "trainer_threads": None, "added_later": 1},
           "engine": {"decode_steps": [[4, 0.01]], "prefill": [[30, 0.002]]},
           "completion_lengths": [5, 7], "prompt_lengths": [10],
           "trainer": {"steps": [[60, 0.5]]}, "sync": {"updates": [[1000, 0.01]]},
           "measured": {"wall_s": 9.0, "trainer_idle_frac": 0.5, "engine_idle_frac": 0.4, "steps": 3}}
    (tmp_path / "calibration.json").write_text(json.dumps(doc))
    cal = Calibration.from_json(tmp_path / "calibration.json")
    assert cal.run.mode == "sync" and cal.engine.decode_steps == [[4, 0.01]]
    assert cal.sync.engine_pauses == []
    assert cal.measured.wall_s == 9.0


def test_fit_line_recovers_a_line_despite_outliers():
    rng = np.random.default_rng(0)
    x = rng.integers(1, 64, 3000)
    y = (0.004 + 0.0006 * x) * (1 + 0.02 * rng.standard_normal(x.size))
    y[::97] *= 8
    a, b = fit_line(np.stack([x, y], 1), robust=True)
    assert a == pytest.approx(0.004, rel=0.1)
    assert b == pytest.approx(0.0006, rel=0.03)


def test_fit_line_edge_cases():
    assert fit_line([]) == (0.0, 0.0)
    assert fit_line([[10, 2.0], [10, 4.0]]) == (0.0, pytest.approx(0.3))  # one x: through the origin
    a, b = fit_line([[1, 1.0], [2, 0.5], [3, 0.0]])  # falling: a constant
    assert (a, b) == (pytest.approx(0.5), 0.0)
    a, b = fit_line([[1, 0.0], [2, 2.0], [3, 4.0]])  # negative intercept: refit through 0
    assert a == 0.0 and b > 0


def test_fit_recovers_the_rates(tmp_path):
    cal = make_run(tmp_path / "run", "async")
    rates = fit_rates(cal)
    assert rates.decode_base_s == pytest.approx(TRUTH["a"], rel=0.15)
    assert rates.decode_per_seq_s == pytest.approx(TRUTH["b"], rel=0.03)
    assert rates.prefill_s_per_token == pytest.approx(TRUTH["prefill"], rel=1e-6)
    assert rates.train_overhead_s == pytest.approx(TRUTH["train_o"], rel=1e-6)
    assert rates.train_s_per_token == pytest.approx(TRUTH["train_s"], rel=1e-6)
    assert rates.swap_s == pytest.approx(TRUTH["swap_s"])
    assert rates.completion_lengths == cal.completion_lengths


def test_find_runs_in_a_bench_folder_and_a_run_folder(tmp_path):
    make_bench(tmp_path / "bench")
    assert set(find_runs(tmp_path / "bench")) == {"sync", "async"}
    assert set(find_runs(tmp_path / "bench" / "async")) == {"async"}
    with pytest.raises(ValueError, match="calibration.json"):
        find_runs(tmp_path)


REAL = Path(__file__).parent / "fixtures" / "real_bench"
# Wall-time tolerance on the real runs. The simulator does not model start-up inside the
# measured window (the trainer loads for ~2 s while the engine generates step 1; part of it is
# hidden behind that generation) nor load on a shared machine; it predicted these runs within
# 7 % (sync -6.6 %, async -5.9 %, when recorded), the documented 2-core check within 3 %. 15 %
# is twice that, and a third of what a 3x slower simulated decode moves the predictions
# (+46 %, +62 %): the check separates a calibrated simulator from a broken one.
WALL_TOL = 0.15
RATIO_TOL = 0.05  # async/sync: start-up and machine load largely cancel (0.700 vs 0.695)


def test_predicts_both_runs_and_their_ratio():
    """Two real runs (measured by the runtime, not simulated): each one's wall time and the
    async / sync ratio are predicted from the components' timings alone."""
    rep = calibrate(REAL, seeds=2)
    assert set(rep.runs) == {"sync", "async"}
    for mode in ("sync", "async"):
        run = rep.runs[mode]
        assert run.measured_wall_s == json.loads((REAL / mode / "summary.json").read_text())["train_wall_s"]
        assert abs(run.error) < WALL_TOL, (mode, rep.to_dict()["runs"])
    assert rep.ratio("predicted") == pytest.approx(rep.ratio("measured"), rel=RATIO_TOL)
    assert rep.ratio("measured") < 1.0  # asynchrony paid on this run: the claim being predicted


def test_a_simulator_with_decode_three_times_slower_misses_the_real_runs(monkeypatch):
    """The same check against a broken simulator (every decode step 3x slower): it fails."""
    from tokenflow.sim.costs import Costs

    decode = Costs.decode_step
    monkeypatch.setattr(Costs, "decode_step", lambda self, n, trainer_busy=False: 3 * decode(self, n, trainer_busy))
    rep = calibrate(REAL, seeds=2)
    for mode in ("sync", "async"):
        assert rep.runs[mode].error > 2 * WALL_TOL, (mode, rep.to_dict()["runs"])


@pytest.mark.parametrize("async_slow", [1.0, 1.3])
def test_predicts_synthetic_runs_with_contention_fitted_per_run(tmp_path, async_slow):
    """Components of the async run 30 % slower (two processes sharing cores): fitted per run."""
    rep = calibrate(make_bench(tmp_path / "bench", async_slow=async_slow), seeds=5)
    for mode in ("sync", "async"):
        assert abs(rep.runs[mode].error) < 0.03, (mode, rep.to_dict()["runs"])
    assert rep.ratio("predicted") == pytest.approx(rep.ratio("measured"), rel=0.03)
    assert rep.rates["async"].decode_per_seq_s == pytest.approx(async_slow * rep.rates["sync"].decode_per_seq_s, rel=0.05)


def test_prediction_never_reads_the_measured_wall_time(tmp_path):
    root = make_bench(tmp_path / "bench")
    before = calibrate(root, seeds=2).to_dict()
    for mode in ("sync", "async"):
        path = root / mode / "calibration.json"
        raw = json.loads(path.read_text())
        raw["measured"]["wall_s"] *= 3
        raw["run"]["wall_s"] *= 3
        path.write_text(json.dumps(raw))
    after = calibrate(root, seeds=2).to_dict()
    for mode in ("sync", "async"):
        assert after["runs"][mode]["predicted_wall_s"] == before["runs"][mode]["predicted_wall_s"]


def test_one_async_run_also_predicts_its_synchronous_counterpart(tmp_path):
    make_run(tmp_path / "run", "async")
    rep = calibrate(tmp_path / "run", seeds=2)
    assert rep.runs["sync"].measured_wall_s is None
    assert rep.runs["async"].measured_wall_s is not None
    assert rep.ratio("predicted") < 1.0


def test_missing_decode_timings_come_from_the_trace(tmp_path):
    cal = make_run(tmp_path / "run", "async")
    events = [{"name": "engine/decode", "ph": "X", "ts": i * 1e4, "dur": (0.004 + 0.0006 * n) * 1e6,
               "args": {"seqs": n}} for i, n in enumerate([1, 5, 9, 17, 33] * 20)]
    events.append({"name": "engine/weight_swap", "ph": "X", "ts": 0, "dur": 2e4})
    (tmp_path / "run" / "trace.json").write_text(json.dumps({"traceEvents": events}))
    cal.engine.decode_steps = []
    cal.sync.engine_pauses = []
    rates = fit_rates(cal, run_dir=tmp_path / "run")
    assert rates.decode_per_seq_s == pytest.approx(0.0006, rel=1e-6)
    assert rates.swap_s == pytest.approx(0.02)
    cal.trainer.steps = []
    with pytest.raises(ValueError, match="trainer.steps"):
        fit_rates(cal, run_dir=tmp_path / "run")

"""`tokenflow simulate` end to end through the CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.sim.sim_testlib import make_bench
from tokenflow.cli.main import main

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "simulate_7b.toml")
QUICK = ["--sim.steps", "4", "--sim.warmup_steps=1"]


def run_json(capsys, *argv) -> dict:
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_single_run_json(capsys):
    out = run_json(capsys, "--preset", "h100-7b-vllm", "--pipeline.max_staleness", "1", *QUICK)
    assert out["steps"] == 4 and out["setup"]["max_staleness"] == 1
    assert {"tokens_per_s", "steps_per_hour", "trainer_idle_frac", "inference_idle_frac", "staleness",
            "tokens_rejected", "tokens_reprefilled", "step_breakdown_s"} <= set(out)


def test_config_file_with_dotted_overrides_before_and_after_it(capsys):
    out = run_json(capsys, "--rollout.max_staleness", "0", EXAMPLE, "--hardware.inference_gpus", "2", *QUICK)
    assert out["setup"]["inference_gpus"] == 2 and out["setup"]["training_gpus"] == 6
    assert out["staleness"]["max"] == 0


def test_tables_are_printed(capsys):
    assert main(["simulate", "--preset", "h100-32b-vllm", *QUICK]) == 0
    text = capsys.readouterr().out
    assert "trainer idle" in text and "token age at consumption" in text


@pytest.mark.slow
def test_sweep_two_axes_table_figure_and_best(capsys, tmp_path):
    argv = ["simulate", "--preset", "h100-7b-vllm", "--sweep", "hardware.inference_gpus=2,4,8",
            "--sweep", "rollout.max_staleness=0,2", "--out", str(tmp_path), *QUICK]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "best: hardware.inference_gpus = " in text and "invalid" in text  # 8 leaves no trainer
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    out = run_json(capsys, *argv[1:])
    assert len(out["points"]) == 6 and out["best"]["rollout.max_staleness"] == 2
    assert out["points"][-1]["error"] and out["points"][-1]["result"] is None


def test_sweep_from_the_config_file(capsys, tmp_path):
    cfg = tmp_path / "s.toml"
    cfg.write_text('[hardware]\ngpus = 4\ninference_gpus = 2\n[sim]\nsteps = 3\nsweep = ["rollout.max_staleness=0,1"]\n')
    out = run_json(capsys, str(cfg), "--out", str(tmp_path))
    assert [p["values"]["rollout.max_staleness"] for p in out["points"]] == [0, 1]


def test_calibrate_a_bench_folder(capsys, tmp_path):
    root = make_bench(tmp_path / "bench", async_slow=1.2)
    out = run_json(capsys, "--calibrate", str(root), "--seeds", "2")
    ratio = out["ratio_async_over_sync"]
    assert ratio["predicted"] == pytest.approx(ratio["measured"], rel=0.03)
    assert main(["simulate", "--calibrate", str(root)]) == 0
    assert "async / sync wall time: predicted" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--preset", "h100-7b-vllm", "--hardware.bogus", "1"], "unknown key(s) bogus; valid keys"),
    (["--preset", "nope"], "unknown preset"),
    ([], "no [hardware] section"),
    (["--preset", "h100-7b-vllm", "--sweep", "max_staleness"], "expected section.key=v1,v2"),
    (["--calibrate", "/nonexistent/run"], "calibration.json"),
])
def test_errors_exit_2_with_a_message(capsys, argv, message):
    assert main(["simulate", *argv]) == 2
    assert message in capsys.readouterr().out.replace("\n", " ")


def test_list_presets(capsys):
    assert main(["simulate", "--list-presets"]) == 0
    assert "h100-32b-vllm" in capsys.readouterr().out

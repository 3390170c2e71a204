"""benchmarks/trl/run.py end to end for 2 steps (the comparison itself is not part of the suite).

The tokenflow sides always run; the TRL side needs the TRL environment (`run.py --setup` builds
.venv-trl, too slow for the suite), so its test is skipped, with the reason, where that is absent,
and the other test checks that the script then skips the side cleanly and still writes its table,
JSON and figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "benchmarks" / "trl" / "run.py"
TRL_VENV = ROOT / ".venv-trl"
needs_trl = pytest.mark.skipif(not (TRL_VENV / "bin" / "python").exists(),
                               reason="no TRL environment at .venv-trl (python benchmarks/trl/run.py --setup builds it)")


def env_with_src() -> dict[str, str]:
    """The environment with tokenflow's sources first on PYTHONPATH (as benchmarks/trl/sides.py runs its sides)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}


def run_script(out: Path, sides: str, *extra: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, str(SCRIPT), "--workloads", "default", "--steps", "2", "--seeds", "0",
                        "--sides", sides, "--eval-limit", "16", "--curve-every", "1", "--out", str(out), *extra],
                       capture_output=True, text=True, env=env_with_src(), timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r


def check_row(row: dict, side: str) -> None:
    assert row["side"] == side and row["workload"] == "default" and row["seeds"] == [0]
    assert row["train_wall_s"] > 0 and row["s_per_step"] == pytest.approx(row["train_wall_s"] / 2)
    assert row["completion_tokens_per_s"] > 0 and 0.0 <= row["accuracy"] <= 1.0


@pytest.mark.slow
def test_tokenflow_sides_run_and_a_missing_trl_environment_is_skipped_with_a_reason(tmp_path):
    r = run_script(tmp_path, "trl,tokenflow-sync,tokenflow-async", "--trl-venv", str(tmp_path / "no-venv"))
    assert "skipping the TRL side: no TRL environment" in r.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert "--setup" in results["skipped"]["trl"]
    assert [row["side"] for row in results["summary"]] == ["tokenflow-sync", "tokenflow-async"]
    for row in results["summary"]:
        check_row(row, row["side"])
    for run in results["runs"]:
        # The starting model, the checkpoint after step 1, the final model: each scored.
        assert [p["step"] for p in run["points"]] == [0, 1, 2]
        assert all(0.0 <= p["accuracy"] <= 1.0 for p in run["points"])
        assert run["points"][-1]["wall_s"] == run["train_wall_s"]
    assert (tmp_path / "accuracy_vs_wall.png").read_bytes()[:4] == b"\x89PNG"
    assert "| default | tokenflow-async |" in (tmp_path / "table.md").read_text()
    assert "| default | tokenflow-sync |" in r.stdout


@needs_trl
def test_trl_side_runs(tmp_path):
    run_script(tmp_path, "trl")
    results = json.loads((tmp_path / "results.json").read_text())
    (row,) = results["summary"]
    check_row(row, "trl")
    (run,) = results["runs"]
    assert [p["step"] for p in run["points"]] == [0, 1, 2]
    assert run["extra"]["versions"]["trl"] == "1.16.0"
    assert run["extra"]["prompts_in_stream_order"]  # TRL trained on tokenflow's prompts, in order


@needs_trl
def test_trl_micro_batches_train_the_same_step(tmp_path):
    """`--trl-micro-batches` only splits the backward pass: one step trained in 4 micro-batches
    lands on the weights of the one-piece step (same seed, so the same completions)."""
    from safetensors.torch import load_file

    from tokenflow.model_store import resolve_model_path

    weights = {}
    for pieces in (1, 4):
        out = tmp_path / f"mb{pieces}"
        r = subprocess.run([str(TRL_VENV / "bin" / "python"), str(ROOT / "benchmarks" / "trl" / "trl_side.py"),
                            "--model", resolve_model_path("default"), "--out", str(out), "--steps", "1",
                            "--seed", "0", "--threads", "2", "--micro-batches", str(pieces)],
                           capture_output=True, text=True, timeout=900, env=env_with_src())
        assert r.returncode == 0, r.stderr[-4000:]
        assert json.loads((out / "result.json").read_text())["micro_batches"] == pieces
        weights[pieces] = load_file(out / "model" / "model.safetensors")
    start = load_file(Path(resolve_model_path("default")) / "model.safetensors")
    moved = 0.0
    for name, w in weights[1].items():
        step = (w - start[name]).abs().max().item()
        moved = max(moved, step)
        # Adam's first step moves a weight by lr * g / (|g| + eps), about lr * sign(g) (lr = 3e-4),
        # so one step compares the gradients' signs: a loss that weighted the four micro-batches
        # otherwise than the one piece flips the entries where they pull different ways, and moves
        # those weights 2 * lr apart. (A constant factor on the whole gradient would not show and
        # does not matter to Adam.) Summation order changes a float32 gradient in its last bits;
        # lr / 30 leaves room for that at entries near zero, where eps sets the step's size.
        assert (weights[4][name] - w).abs().max().item() < 1e-5, name
    assert moved > 1e-4  # the step did move the weights

"""Numbers that would poison a run are refused where they enter: a non-finite float in the config
(exit 2, one line naming the key), a NaN or infinite reward (that sample fails and is counted,
the run goes on), and what a run writes is strict JSON (no bare NaN)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest

from tests.runtime.runtime_testlib import small_config, step_rows
from tokenflow.runtime.launch import train
from tokenflow.scoring.pool import normalise_reward


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("args, key", [
    (["--trainer.lr", "inf"], "trainer.lr"),
    (["--trainer.lr", "-inf"], "trainer.lr"),
    (["--algorithm.clip_high", "nan"], "algorithm.clip_high"),
    (["--sampling.temperature", "inf"], "sampling.temperature"),
])
@pytest.mark.slow
def test_a_non_finite_float_in_the_config_is_one_line_and_exit_2(args, key):
    proc = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "train", *args, "--dry-run"],
                          capture_output=True, text=True, timeout=120)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert key in errors[0] and "finite number" in errors[0]


@pytest.mark.slow
def test_a_non_finite_float_in_a_toml_file_is_refused_too(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text("[trainer]\nlr = nan\n")
    proc = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "train", str(cfg), "--dry-run"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "trainer.lr: Input should be a finite number" in proc.stderr, proc.stderr


@pytest.mark.parametrize("out", [math.nan, math.inf, -math.inf, {"reward": 1.0, "format": math.nan}])
def test_a_non_finite_reward_is_an_error_naming_it(out):
    with pytest.raises(ValueError, match="must be a finite number"):
        normalise_reward(out)


@pytest.mark.slow
def test_nan_and_inf_rewards_fail_their_samples_and_the_run_writes_strict_json(tmp_path):
    (tmp_path / "nan_reward.py").write_text(textwrap.dedent("""
        import math
        from tokenflow.tasks.arithmetic import arithmetic_reward
        def reward(prompt, completion, example):
            if not completion:  # the preflight's call: a real example, an empty completion
                return arithmetic_reward(prompt, completion, example)
            if example["a"] % 3 == 0:
                return math.nan
            if example["a"] % 5 == 0:
                return {"reward": 1.0, "bonus": math.inf}
            return arithmetic_reward(prompt, completion, example)
    """))
    from tokenflow.tasks.arithmetic import ArithmeticTask

    t = ArithmeticTask()
    rows = [{"prompt": p.text, **p.example} for p in (t.train_prompt(i) for i in range(64))]
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = small_config("--task.name", "dataset", "--task.train_path", str(data),
                       "--task.reward", f"{tmp_path / 'nan_reward.py'}:reward",
                       "--run.steps", "2", "--run.checkpoint_every", "0", "--run.eval_limit", "8")
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 2
    steps = step_rows(tmp_path / "run")
    hit = [r["a"] % 3 == 0 or r["a"] % 5 == 0 for r in rows]
    assert any(hit[:8]) and any(r["reward/failed_frac"] > 0 for r in steps)
    assert all(math.isfinite(r["reward/mean"]) for r in steps)
    _strict((tmp_path / "run" / "summary.json").read_text())
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        _strict(line)

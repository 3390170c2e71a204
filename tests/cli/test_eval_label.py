"""`tokenflow eval` names the set it scored: the eval file, or the share held out of the training file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SUMS = ROOT / "examples" / "custom_task" / "sums.jsonl"
REWARD = f"{ROOT / 'examples' / 'custom_task' / 'reward.py'}:score"


@pytest.mark.parametrize("eval_file", [True, False], ids=["eval_path", "held_out"])
@pytest.mark.slow
def test_eval_names_the_scored_set(tmp_path, eval_file):
    args = ["--task.name", "dataset", "--task.train_path", str(SUMS), "--task.reward", REWARD]
    if eval_file:
        held = tmp_path / "held_out_sums.jsonl"
        held.write_text("".join(SUMS.read_text().splitlines(keepends=True)[:8]))
        args += ["--task.eval_path", str(held)]
    r = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "eval", "default", "--limit", "4", "--json", *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["eval_set"] == ("held_out_sums.jsonl" if eval_file else "sums.jsonl (the 10% held out)")
    assert out["prompts"] == 4

"""summary.json after a resume covers the whole run; a reward that fails every sample stops the
run instead of letting it exit 0 having trained nothing."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.runtime.helpers import small_config, step_rows
from tokenflow.runtime.launch import train
from tokenflow.runtime.orchestrator import RunFailed


def test_summary_after_a_resume_counts_every_invocation(tmp_path):
    common = ("--rollout.max_staleness", "0", "--run.checkpoint_every", "0")
    first = train(small_config(*common, "--run.steps", "2"), tmp_path / "run")
    resumed = train(small_config(*common, "--run.steps", "4"), tmp_path / "run", resume=True)
    assert resumed["steps"] == 4
    rows = step_rows(tmp_path / "run")
    later_tokens = sum(r["rollout/count"] * r["rollout/completion_len_mean"] for r in rows if r["step"] > 2)
    # The second call alone generated steps 3-4 plus one evaluation; the whole run also holds
    # everything the first call generated.
    assert resumed["tokens_generated"] >= first["tokens_generated"] + later_tokens
    assert resumed["wall_s"] > first["wall_s"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["tokens_generated"] == resumed["tokens_generated"]


def test_a_reward_that_raises_on_every_call_stops_the_run(tmp_path):
    (tmp_path / "broken_reward.py").write_text(textwrap.dedent("""
        def reward(prompt, completion, example):
            raise RuntimeError("the verifier is down")
    """))
    rows = [{"prompt": f"{i}+{i}="} for i in range(40)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = small_config("--task.name", "dataset", "--task.train_path", str(tmp_path / "data.jsonl"),
                       "--task.reward", f"{tmp_path / 'broken_reward.py'}:reward", "--run.steps", "2",
                       "--run.eval_limit", "2")
    with pytest.raises(RunFailed, match="every sample of step 1 failed scoring .*the verifier is down"):
        train(cfg, tmp_path / "run")
    assert step_rows(tmp_path / "run") == []

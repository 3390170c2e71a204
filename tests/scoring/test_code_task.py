"""The example code task through the real scorer pool: unit tests run against the model's
function in the sandbox; a program the sandbox stops fails its sample with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scoring.scoring_testlib import wait_scored
from tokenflow.rollout import Rollout
from tokenflow.scoring.pool import ScorerPool
from tokenflow.tasks.arithmetic import worked_solution

ROOT = Path(__file__).parents[2]
REWARD = f"{ROOT / 'examples/code_task/reward.py'}:score"
pytestmark = pytest.mark.timeout(120)


def rollout(text: str, i: int) -> Rollout:
    return Rollout(prompt_ids=[1], completion_ids=[2], logprobs=[0.0], versions=[0], text=text, sample_index=i)


@pytest.mark.slow
def test_code_task_scores_in_the_sandbox_and_fails_a_runaway_program():
    row = json.loads((ROOT / "examples/code_task/problems.jsonl").read_text().splitlines()[0])
    a, b = map(int, row["prompt"].rstrip("=").split("+"))
    right = worked_solution(a, b)
    steps, _, _ = right.rpartition(">")
    texts = [right, f"{steps}>{a + b + 10}", "7+9=17>1", "```python\nwhile True:\n    pass\n```",
             "```python\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n```"]
    pool = ScorerPool(REWARD, workers=1, timeout_s=30.0)
    try:
        pool.submit([rollout(t, i) for i, t in enumerate(texts)], row["prompt"], row, group_id=3)
        (scored, _), = wait_scored(pool, timeout_s=90)
    finally:
        pool.close()
    assert [r.reward for r in scored[:3]] == [1.0, 0.5, 0.0]
    from tokenflow.scoring.sandbox import Sandbox

    contained = float(Sandbox().isolated)  # this machine's probe, as the scorer process's
    assert [r.rewards["sandbox_contained"] for r in scored[:3]] == [contained] * 3
    for r in scored[3:]:
        assert r.failed and r.reward is None
        assert "SandboxViolation" in r.info["score_error"]
    assert any(k in scored[3].info["score_error"] for k in ("cpu_limit", "timeout"))

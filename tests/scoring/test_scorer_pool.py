"""Scoring in worker processes: a reward that raises or hangs fails its sample, not the run."""

from __future__ import annotations

import textwrap

import pytest

from tokenflow.rollout import Rollout
from tests.scoring.scoring_testlib import wait_scored
from tokenflow.scoring.pool import ScorerPool


@pytest.fixture()
def rewards(tmp_path):
    f = tmp_path / "rewards_mod.py"
    f.write_text(textwrap.dedent("""
        import time
        def by_text(prompt, completion, example):
            if completion == "raise":
                raise ValueError("cannot score this")
            if completion == "hang":
                time.sleep(60)
            return float(completion == example["want"])
    """))
    return f


def rollout(text: str, i: int) -> Rollout:
    return Rollout(prompt_ids=[1], completion_ids=[2], logprobs=[0.0], versions=[0], text=text, sample_index=i)


@pytest.mark.slow
def test_failures_are_per_sample(rewards):
    pool = ScorerPool(f"{rewards}:by_text", workers=2, timeout_s=1.0)
    try:
        group = [rollout(t, i) for i, t in enumerate(["yes", "no", "raise", "hang"])]
        pool.submit(group, "p", {"want": "yes"}, group_id=7)
        done = wait_scored(pool)
        (scored, meta), = done
        assert meta == {"group_id": 7}
        assert [r.reward for r in scored[:2]] == [1.0, 0.0]
        assert scored[2].failed and "ValueError: cannot score this" in scored[2].info["score_error"]
        assert scored[3].failed and "exceeded" in scored[3].info["score_error"]
        assert (pool.failed, pool.timeouts) == (2, 1)
        # The pool replaced the killed worker and keeps scoring.
        pool.submit([rollout("yes", 0)], "p", {"want": "yes"}, group_id=8)
        done = wait_scored(pool)
        assert done[0][0][0].reward == 1.0
    finally:
        pool.close()


@pytest.mark.slow
def test_a_sample_scored_again_loses_its_earlier_failure(rewards):
    """A resume hands back a kept group whose samples failed scoring once (a timeout); scored
    again, a sample that now scores is no longer failed and carries no stale error."""
    pool = ScorerPool(f"{rewards}:by_text", workers=1, timeout_s=5.0)
    try:
        group = [rollout("yes", 0), rollout("no", 1)]
        for r in group:
            r.failed, r.info["score_error"] = True, "reward function exceeded 1s"
        pool.submit(group, "p", {"want": "yes"}, group_id=3)
        (scored, _), = wait_scored(pool)
        assert [(r.failed, r.reward, "score_error" in r.info) for r in scored] == [(False, 1.0, False), (False, 0.0, False)]
    finally:
        pool.close()

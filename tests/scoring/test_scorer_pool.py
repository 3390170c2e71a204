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

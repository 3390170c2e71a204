"""task.reward = "math_verify": the real math-verify library reads the model's final answer and
compares it by value, under a time bound, in the scorer pool's worker processes too."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.scoring.scoring_testlib import wait_scored
from tokenflow.config.task import TaskConfig
from tokenflow.rollout import Rollout
from tokenflow.scoring.math_reward import math_verify_reward
from tokenflow.scoring.pool import ScorerPool
from tokenflow.tasks import build_task

LAPTOP_MATH = Path(__file__).parents[2] / "examples" / "laptop_math"


@pytest.mark.parametrize("completion,answer,fmt,correct", [
    ("4 + 3 = 7. The answer is 7.", "7", 1, 1),
    ("The answer is 8.", "7", 1, 0),
    ("The answer is 8. No wait, the answer is 7.", "7", 1, 1),
    ("The answer is 1000.5", "1000", 1, 0),     # the old regex's false positive
    ("The answer is 1000.5", "1000.5", 1, 1),
    ("So the answer is **24**.", "24", 1, 1),   # markdown bold
    ("**25**", "24", 1, 0),
    (r"Hence $\boxed{24}$.", "24", 1, 1),
    (r"\boxed{23}", "24", 1, 0),
    ("The answer is 1,000.", "1000", 1, 1),     # thousands separator
    ("1,000,000", 1000000, 1, 1),               # an int answer in the row
    (r"The answer is $\frac{1}{2}$", "0.5", 1, 1),
    ("0.5", r"\frac{1}{2}", 1, 1),
    ("The answer is 50%.", "0.5", 1, 1),        # a percentage matches its fraction ...
    ("The answer is 50%.", "50", 1, 1),         # ... and its number (math-verify's rule)
    ("The answer is 40%.", "0.5", 1, 0),
    ("The answer is -3.", "-3", 1, 1),
    ("I do not know.", "7", 0, 0),
    ("", "7", 0, 0),
])
def test_the_answer_is_compared_by_value(completion, answer, fmt, correct):
    got = math_verify_reward("", completion, {"answer": answer})
    assert got == {"reward": float(correct), "format": float(fmt), "correct": float(correct)}


def test_a_missing_or_unreadable_answer_is_an_error_not_a_zero():
    with pytest.raises(KeyError, match='no "answer" field'):
        math_verify_reward("", "7", {"solution": "7"})
    with pytest.raises(ValueError, match="cannot be parsed"):
        math_verify_reward("", "7", {"answer": ""})


@pytest.mark.slow  # the library's 2 s bound
@pytest.mark.timeout(60)
def test_a_comparison_that_would_run_for_ages_is_cut_off():
    """sympy would evaluate 9^(9^(9^9)) for a very long time; the library's bound stops it."""
    start = time.monotonic()
    got = math_verify_reward("", r"$9^{9^{9^{9}}}$", {"answer": "7"})
    assert got == {"reward": 0.0, "format": 1.0, "correct": 0.0}
    assert time.monotonic() - start < 10


def test_the_name_works_in_a_dataset_tasks_config():
    task = build_task(TaskConfig(name="dataset", train_path=str(LAPTOP_MATH / "train.jsonl"),
                                 eval_path=str(LAPTOP_MATH / "heldout.jsonl"), reward="math_verify"))
    assert task.reward_fn is math_verify_reward
    p = task.eval_prompts()[0]
    assert task.reward_fn(p.text, f"The answer is {p.example['answer']}.", p.example)["correct"] == 1.0


@pytest.mark.slow
def test_the_scorer_pool_runs_it_by_name_within_the_bound():
    """In pebble's workers (rewards run on the main thread there, so the alarm can be set): the
    slow sample fails nothing and costs the library's bound, not the pool's timeout."""
    pool = ScorerPool("math_verify", workers=1, timeout_s=30.0)
    try:
        texts = ["The answer is **24**.", "The answer is 1000.5", r"$9^{9^{9^{9}}}$", "no idea"]
        group = [Rollout(prompt_ids=[1], completion_ids=[2], logprobs=[0.0], versions=[0], text=t, sample_index=i)
                 for i, t in enumerate(texts)]
        start = time.monotonic()
        pool.submit(group, "p", {"answer": "24"}, group_id=1)
        (scored, _), = wait_scored(pool, timeout_s=60)
        assert time.monotonic() - start < 20
        assert not any(r.failed for r in scored)
        assert [r.reward for r in scored] == [1.0, 0.0, 0.0, 0.0]
        assert [r.rewards["format"] for r in scored] == [1.0, 1.0, 1.0, 0.0]
    finally:
        pool.close()

"""The default task: deterministic prompts, a held-out split, a reward that checks the sum."""

from __future__ import annotations

import numpy as np

from tokenflow.tasks.arithmetic import ArithmeticTask, arithmetic_reward, parse_answer, worked_solution


def test_worked_solution_is_correct_and_slips_are_consistent():
    assert worked_solution(347, 85) == "7+5=12,4+8+1=13,3+0+1=4>432"
    assert worked_solution(999, 1) == "9+1=10,9+0+1=10,9+0+1=10,0+0+1=1>1000"
    slipped = worked_solution(347, 85, drop_carry=np.array([False, True, False]))
    assert slipped == "7+5=12,4+8=12,3+0+1=4>422"
    rng = np.random.default_rng(0)
    for _ in range(300):
        a, b = (int(x) for x in rng.integers(0, 10**6, 2))
        assert parse_answer(worked_solution(a, b)) == str(a + b)


def test_reward():
    ex = {"answer": 432}
    assert arithmetic_reward("347+85=", "7+5=12,4+8+1=13,3+0+1=4>432", ex) == 1.0
    assert arithmetic_reward("347+85=", "7+5=12>422", ex) == 0.0
    assert arithmetic_reward("347+85=", "no answer", ex) == 0.0


def test_prompts_are_reproducible_and_eval_is_held_out():
    t1, t2 = ArithmeticTask(seed=3), ArithmeticTask(seed=3)
    assert [t1.train_prompt(i) for i in range(50)] == [t2.train_prompt(i) for i in range(50)]
    assert t1.train_prompt(7).id == 7
    eval_pairs = {(p.example["a"], p.example["b"]) for p in t1.eval_prompts()}
    assert len(eval_pairs) == t1.num_eval
    train_pairs = {(p.example["a"], p.example["b"]) for p in (t1.train_prompt(i) for i in range(3000))}
    assert not eval_pairs & train_pairs


def test_completion_lengths_have_a_long_tail():
    t = ArithmeticTask()
    lens = np.array([len(worked_solution(p.example["a"], p.example["b"]))
                     for p in (t.train_prompt(i) for i in range(2000))])
    p10, p50, p99 = np.percentile(lens, [10, 50, 99])
    assert p99 > 1.8 * p50 and p50 > 1.8 * p10  # stragglers: the slowest take 2-4x the typical
    assert lens.max() > 2.4 * p50

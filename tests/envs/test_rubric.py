"""Rubric: weighted components, weight-0 metrics, group-level functions, step rewards, bad functions."""

from __future__ import annotations

import asyncio

import pytest

from tokenflow.envs import Episode, Rubric, RubricError, StepResult, group_reward


def episode(answer: str, *, example=None, step_rewards=(), info=None, state=None) -> Episode:
    ep = Episode(example or {"answer": "42"}, [{"role": "user", "content": "6*7?"}])
    for r in step_rewards:
        ep.record({"role": "assistant", "content": "mul(6,7)"}, StepResult([{"role": "tool", "content": "42"}], r, False,
                                                                           {"tool_calls": 1}))
    ep.record({"role": "assistant", "content": answer}, StepResult([], None, True, info or {}))
    ep.state = state or {}
    return ep


def correct(completion, example):
    return completion.strip() == example["answer"]


def brevity(messages):
    return -0.01 * sum(len(m.get("content") or "") for m in messages if m["role"] == "assistant")


def calls(info):
    return info.get("tool_calls", 0)


def test_reward_is_the_weighted_sum_and_weight_zero_is_only_logged():
    rubric = Rubric([correct, brevity, calls], weights=[1.0, 2.0, 0.0])
    (right, wrong) = rubric.score([episode("42", step_rewards=[None]), episode("41")])
    assert right["correct"] == 1.0 and wrong["correct"] == 0.0
    assert right["brevity"] == pytest.approx(-0.1) and wrong["brevity"] == pytest.approx(-0.02)
    assert right["calls"] == 1.0  # logged ...
    assert right["reward"] == pytest.approx(1.0 + 2 * -0.1)  # ... but not in the reward
    assert wrong["reward"] == pytest.approx(2 * -0.02)
    assert "step_reward" not in right  # no step returned a reward


def test_step_rewards_are_summed_into_the_episode_reward():
    rubric = Rubric([correct])
    a, b = rubric.score([episode("42", step_rewards=[0.25, -0.5]), episode("41")])
    assert a["step_reward"] == pytest.approx(-0.25) and a["reward"] == pytest.approx(0.75)
    assert b["step_reward"] == 0.0 and b["reward"] == 0.0
    # No rubric functions at all: the steps' rewards are the reward.
    (only,) = Rubric().score([episode("x", step_rewards=[2.0])])
    assert only == {"step_reward": 2.0, "reward": 2.0}


def test_group_functions_see_every_sample_of_the_prompt():
    seen = {}

    @group_reward
    def rank(completion, example):
        seen["args"] = (list(completion), list(example))
        order = sorted(range(len(completion)), key=lambda i: len(completion[i]))
        return [1.0 - order.index(i) / (len(completion) - 1) for i in range(len(completion))]

    out = Rubric([correct, rank], weights=[1.0, 0.5]).score([episode("42"), episode("4"), episode("4242")])
    assert seen["args"][0] == ["42", "4", "4242"] and len(seen["args"][1]) == 3
    assert [o["rank"] for o in out] == [0.5, 1.0, 0.0]
    assert [o["reward"] for o in out] == [1.25, 0.5, 0.0]


def test_state_and_async_functions():
    async def judged(state):
        await asyncio.sleep(0)
        return state["score"]

    (out,) = Rubric([judged]).score([episode("1", state={"score": 0.3})])
    assert out["reward"] == pytest.approx(0.3)

    async def inside_a_loop():
        with pytest.raises(RuntimeError, match="score_async"):
            Rubric([judged]).score([episode("1", state={"score": 0.3})])
        return await Rubric([judged]).score_async([episode("1", state={"score": 0.5})])

    assert asyncio.run(inside_a_loop())[0]["reward"] == 0.5


def test_kwargs_functions_get_everything():
    got = {}

    def everything(**kwargs):
        got.update(kwargs)
        return 0.0

    Rubric([everything]).score([episode("42", info={"n": 1})])
    assert set(got) == {"messages", "completion", "example", "info", "state"} and got["completion"] == "42"


def test_functions_that_cannot_be_used_are_refused_at_construction():
    def takes_prompt(prompt, completion):
        return 0.0

    with pytest.raises(RubricError, match="takes prompt; reward functions take keyword arguments from: messages"):
        Rubric([takes_prompt])
    with pytest.raises(RubricError, match="2 reward functions but 1 weights"):
        Rubric([correct, calls], weights=[1.0])
    with pytest.raises(RubricError, match="used twice"):
        Rubric([correct, correct])

    def reward(completion):
        return 0.0

    with pytest.raises(RubricError, match="may not be called 'reward'"):
        Rubric([reward])


def test_returns_that_are_not_rewards_name_the_function():
    def text(completion):
        return "high"

    @group_reward
    def short(completion):
        return [1.0]

    with pytest.raises(RubricError, match="reward function text returned 'high'; it must return a finite number"):
        Rubric([text]).score([episode("1")])
    with pytest.raises(RubricError, match="group reward function short returned .* list of 2 numbers"):
        Rubric([short]).score([episode("1"), episode("2")])


def test_episode_info_sums_numbers_and_keeps_the_last_of_anything_else():
    ep = Episode({})
    ep.record({"role": "assistant", "content": "a"}, StepResult([], None, False, {"n": 1, "tag": "x"}))
    ep.record({"role": "assistant", "content": "b"}, StepResult([], 1.0, True, {"n": 2, "tag": "y"}))
    assert ep.info == {"n": 3, "tag": "y"} and ep.step_rewards == [1.0] and ep.completion == "b"

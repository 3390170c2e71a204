"""Advantages at their edges, with values worked out by hand: eps where it changes the answer,
whitening of an empty, all-masked or one-token batch, GAE's value targets through
`compute_advantages` beside failed rollouts, a batch where every rollout failed, scorer-given
per-token rewards, and the refusals' messages word for word."""

import numpy as np
import pytest

from tokenflow.algorithms import AdvantageInputs, AlgorithmConfig, compute_advantages, estimate
from tokenflow.algorithms.advantages import whiten
from tokenflow.rollout import Rollout

SQRT2 = 2 ** 0.5


def rollout(n: int, *, reward=None, failed=False, mask=None, token_rewards=None, group=0, rid="r") -> Rollout:
    return Rollout(np.array([1, 2]), np.arange(3, 3 + n), np.zeros(n), np.zeros(n), loss_mask=mask,
                   reward=reward, failed=failed, token_rewards=token_rewards, group_id=group, request_id=rid)


def test_grpo_divides_by_std_plus_eps():
    # rewards 0 and 1: centred ∓0.5, sample std 1/√2; eps 0.5 → ∓0.5 / (1/√2 + 1/2) = ∓(√2 − 1)
    inp = AdvantageInputs(rewards=np.array([0.0, 1.0]), group_ids=np.array([4, 4]), masks=[np.ones(1), np.ones(2)])
    out = estimate(inp, AlgorithmConfig(advantage="grpo", eps=0.5)).advantages
    np.testing.assert_allclose(out[0], [1 - SQRT2], rtol=1e-6)
    np.testing.assert_allclose(out[1], [SQRT2 - 1, SQRT2 - 1], rtol=1e-6)


def test_whiten_divides_by_population_std_plus_eps_over_loss_tokens():
    # loss tokens 0 and 2 (the 5 is masked): mean 1, population std 1; eps 1 → (x − 1) / 2
    out = whiten([np.array([0.0, 5.0, 2.0])], [np.array([1, 0, 1])], eps=1.0)
    assert out[0].tolist() == [-0.5, 0.0, 0.5] and out[0].dtype == np.float32


def test_whiten_of_no_loss_token_changes_nothing_and_of_one_token_gives_zero():
    assert whiten([], [], eps=1e-6) == []
    kept = whiten([np.array([3.0], dtype=np.float32)], [np.array([0])], eps=1e-6)
    assert kept[0].tolist() == [3.0]  # nothing to normalise over: no mean of nothing, no NaN
    assert whiten([np.array([4.0])], [np.array([1])], eps=1e-6)[0].tolist() == [0.0]  # (4 − 4) / (0 + eps)


def test_gae_without_values_says_what_it_needs():
    inp = AdvantageInputs(rewards=np.array([1.0]), group_ids=np.array([0]), masks=[np.ones(2)])
    with pytest.raises(ValueError, match=r'^advantage = "gae" needs per-token values \(a value head\)$'):
        estimate(inp, AlgorithmConfig(advantage="gae"))


def test_gae_returns_through_compute_advantages_beside_a_failed_rollout():
    # γ = λ = 1, loss tokens 0 and 2 with V = 0.5, 0.25 (the tool token's 9 is no step), reward 1:
    # δ_1 = 1 − 0.25 = 0.75, δ_0 = 0.25 − 0.5 = −0.25; A = [0.5, 0.75], R = A + V = [1, 1]
    rollouts = [rollout(3, reward=1.0, mask=[1, 0, 1]), rollout(2, failed=True)]
    values = [np.array([0.5, 9.0, 0.25]), np.array([7.0, 7.0])]
    res = compute_advantages(rollouts, AlgorithmConfig(advantage="gae", gamma=1.0, lam=1.0), values=values)
    assert res.advantages[0].tolist() == [0.5, 0.0, 0.75] and res.returns[0].tolist() == [1.0, 0.0, 1.0]
    assert res.advantages[1].tolist() == [0.0, 0.0] and res.returns[1].tolist() == [0.0, 0.0]
    assert {a.dtype for a in res.advantages + res.returns} == {np.dtype(np.float32)}


def test_a_batch_of_failed_rollouts_gets_zeros_and_value_targets_only_with_values():
    failed = [rollout(2, failed=True), rollout(1, failed=True)]
    res = compute_advantages(failed, AlgorithmConfig(advantage="gae"), values=[np.ones(2), np.ones(1)])
    assert [a.tolist() for a in res.advantages] == [[0.0, 0.0], [0.0]]
    assert [r.tolist() for r in res.returns] == [[0.0, 0.0], [0.0]]
    assert {a.dtype for a in res.advantages} == {np.dtype(np.float32)}
    assert compute_advantages(failed, AlgorithmConfig(advantage="grpo")).returns is None


def scored_batch():
    # a: scorer rewards 0.5, 0, −0.25 and outcome 1; b: no scorer rewards, outcome 0
    return [rollout(3, reward=1.0, token_rewards=np.array([0.5, 0.0, -0.25]), group=1),
            rollout(2, reward=0.0, group=2)]


def test_scorer_token_rewards_add_to_the_outcome_and_to_given_token_rewards():
    cfg = AlgorithmConfig(advantage="gae", gamma=1.0, lam=1.0)
    zero_values = [np.zeros(3), np.zeros(2)]
    # V = 0, γ = λ = 1: A_t is the reward to go. a: r = [0.5, 0, 0.75] → [1.25, 0.75, 0.75]
    res = compute_advantages(scored_batch(), cfg, values=zero_values)
    np.testing.assert_allclose(res.advantages[0], [1.25, 0.75, 0.75], rtol=1e-6)
    assert res.advantages[1].tolist() == [0.0, 0.0]
    # with a penalty of 0.1 per token given too: a: r = [0.6, 0.1, 0.85]; b: r = [0.1, 0.1]
    given = [np.full(3, 0.1), np.full(2, 0.1)]
    res = compute_advantages(scored_batch(), cfg, values=zero_values, token_rewards=given)
    np.testing.assert_allclose(res.advantages[0], [1.55, 0.95, 0.85], rtol=1e-6)
    np.testing.assert_allclose(res.advantages[1], [0.2, 0.1], rtol=1e-6)


def test_scorer_token_rewards_under_an_outcome_estimator_are_refused_by_name():
    message = ('rollouts carry per-token rewards (a token scorer), but algorithm.advantage = "grpo" uses only '
               'the outcome; use one of gae, reinforce_pp, reinforce_pp_baseline')
    with pytest.raises(ValueError) as e:
        compute_advantages(scored_batch(), AlgorithmConfig(advantage="grpo"))
    assert str(e.value) == message


def test_an_unscored_live_rollout_is_refused_by_its_request():
    with pytest.raises(ValueError) as e:
        compute_advantages([rollout(2, rid="r0")], AlgorithmConfig(advantage="grpo"))
    assert str(e.value) == ("rollout 0 (request 'r0') has no reward and is not marked failed; "
                            "score it or set failed=True")

"""Each estimator against a plain loop written here, on ragged groups with loss masks."""

import numpy as np
import pytest

from tokenflow.algorithms import AdvantageInputs, AlgorithmConfig, compute_advantages, estimate
from tokenflow.algorithms.advantages import gae_sequence
from tokenflow.rollout import Rollout

RNG = np.random.default_rng(1)


def ragged_batch(with_values=False):
    # Groups of 4, 3 (a failed sample dropped), 1 (lone) and 2; lengths 1..9; some tool tokens.
    group_ids = np.array([7, 7, 7, 7, 3, 3, 3, 5, 9, 9])
    rewards = RNG.normal(size=len(group_ids))
    lengths = RNG.integers(1, 10, size=len(group_ids))
    masks = []
    for n in lengths:
        m = (RNG.random(n) > 0.3).astype(np.int8)
        m[0] = 1  # at least one model token
        masks.append(m)
    values = [RNG.normal(size=n) for n in lengths] if with_values else None
    return AdvantageInputs(rewards=rewards, group_ids=group_ids, masks=masks, values=values)


def expect_broadcast(out, per_seq, masks):
    for a, s, m in zip(out, per_seq, masks):
        np.testing.assert_allclose(a, s * m, rtol=1e-5, atol=1e-6)
        assert a.dtype == np.float32


def members(gids, i):
    return [j for j in range(len(gids)) if gids[j] == gids[i]]


def test_grpo_matches_loop():
    inp = ragged_batch()
    eps = 1e-6
    ref = []
    for i, r in enumerate(inp.rewards):
        g = [inp.rewards[j] for j in members(inp.group_ids, i)]
        if len(g) == 1:
            ref.append(0.0)
            continue
        mean = sum(g) / len(g)
        std = (sum((x - mean) ** 2 for x in g) / (len(g) - 1)) ** 0.5
        ref.append((r - mean) / (std + eps))
    out = estimate(inp, AlgorithmConfig(advantage="grpo", eps=eps)).advantages
    expect_broadcast(out, ref, inp.masks)
    assert out[7].tolist() == [0.0] * len(out[7])  # the lone sample


@pytest.mark.parametrize("cfg", [AlgorithmConfig(advantage="dr_grpo"),
                                 AlgorithmConfig(advantage="grpo", scale_std=False)])
def test_dr_grpo_drops_std(cfg):
    inp = ragged_batch()
    ref = []
    for i, r in enumerate(inp.rewards):
        g = [inp.rewards[j] for j in members(inp.group_ids, i)]
        ref.append(0.0 if len(g) == 1 else r - sum(g) / len(g))
    expect_broadcast(estimate(inp, cfg).advantages, ref, inp.masks)


def test_rloo_leave_one_out():
    inp = ragged_batch()
    ref = []
    for i, r in enumerate(inp.rewards):
        others = [inp.rewards[j] for j in members(inp.group_ids, i) if j != i]
        ref.append(r - sum(others) / len(others) if others else 0.0)
    expect_broadcast(estimate(inp, AlgorithmConfig(advantage="rloo")).advantages, ref, inp.masks)


def test_rloo_small_example():
    inp = AdvantageInputs(rewards=np.array([1.0, 0.0, 0.0]), group_ids=np.zeros(3),
                          masks=[np.ones(2), np.ones(1), np.ones(3)])
    out = estimate(inp, AlgorithmConfig(advantage="rloo")).advantages
    assert out[0].tolist() == [1.0, 1.0]
    assert out[1].tolist() == [-0.5]
    assert out[2].tolist() == [-0.5, -0.5, -0.5]


def reinforce_ref(inp, gamma, baseline, eps=1e-6):
    outcome = list(inp.rewards)
    if baseline:
        outcome = [r - np.mean([inp.rewards[j] for j in members(inp.group_ids, i)])
                   for i, r in enumerate(inp.rewards)]
    returns = []
    for i, m in enumerate(inp.masks):
        ret = np.zeros(len(m))
        g, last = 0.0, max(t for t in range(len(m)) if m[t])
        for t in reversed(range(len(m))):
            if not m[t]:
                continue
            r = (inp.token_rewards[i][t] if inp.token_rewards is not None else 0.0)
            r += outcome[i] if t == last else 0.0
            g = r + gamma * g
            ret[t] = g
        returns.append(ret)
    flat = np.concatenate([x[m > 0] for x, m in zip(returns, inp.masks)])
    return [(x - flat.mean()) / (flat.std() + eps) * m for x, m in zip(returns, inp.masks)]


@pytest.mark.parametrize("name,baseline", [("reinforce_pp", False), ("reinforce_pp_baseline", True)])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_batch_normalised(name, baseline, gamma):
    inp = ragged_batch()
    inp.token_rewards = [RNG.normal(scale=0.1, size=len(m)) for m in inp.masks]  # e.g. a KL penalty
    out = estimate(inp, AlgorithmConfig(advantage=name, gamma=gamma)).advantages
    ref = reinforce_ref(inp, gamma, baseline)
    for a, b in zip(out, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    flat = np.concatenate([a[m > 0] for a, m in zip(out, inp.masks)])
    assert abs(flat.mean()) < 1e-5 and abs(flat.std() - 1) < 1e-4


def gae_ref(rewards, values, mask, gamma, lam):
    """Backward recursion over the full sequence, stepping over tool tokens (mask 0)."""
    adv = np.zeros(len(mask))
    next_v, next_a = 0.0, 0.0
    for t in reversed(range(len(mask))):
        if not mask[t]:
            continue
        delta = rewards[t] + gamma * next_v - values[t]
        next_a = delta + gamma * lam * next_a
        adv[t] = next_a
        next_v = values[t]
    return adv


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_backward_recursion(gamma, lam):
    inp = ragged_batch(with_values=True)
    inp.token_rewards = [RNG.normal(size=len(m)) for m in inp.masks]
    res = estimate(inp, AlgorithmConfig(advantage="gae", gamma=gamma, lam=lam))
    for i, m in enumerate(inp.masks):
        r = inp.token_rewards[i] * (m > 0)
        last = max(t for t in range(len(m)) if m[t])
        r[last] += inp.rewards[i]
        ref = gae_ref(r, inp.values[i], m, gamma, lam)
        np.testing.assert_allclose(res.advantages[i], ref, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(res.returns[i], (ref + inp.values[i]) * (m > 0), rtol=1e-4, atol=1e-5)


def test_gae_lambda_one_is_return_minus_value():
    r, v = np.array([0.0, 0.0, 1.0]), np.array([0.2, 0.5, 0.7])
    np.testing.assert_allclose(gae_sequence(r, v, 1.0, 1.0), 1.0 - v)
    # λ = 0: one-step TD errors, with V after the last token = 0.
    np.testing.assert_allclose(gae_sequence(r, v, 1.0, 0.0), [0.5 - 0.2, 0.7 - 0.5, 1.0 - 0.7])


def test_whitening_option():
    inp = ragged_batch()
    out = estimate(inp, AlgorithmConfig(advantage="rloo", whiten_advantages=True)).advantages
    flat = np.concatenate([a[m > 0] for a, m in zip(out, inp.masks)])
    assert abs(flat.mean()) < 1e-5 and abs(flat.std() - 1) < 1e-4


def test_compute_advantages_drops_failed_rollouts():
    def ro(reward, g, failed=False, n=3):
        return Rollout(prompt_ids=[1], completion_ids=[2] * n, logprobs=np.zeros(n), versions=np.zeros(n),
                       reward=reward, group_id=g, failed=failed)
    rollouts = [ro(1.0, 0), ro(None, 0, failed=True), ro(0.0, 0), ro(5.0, 1), ro(None, 1, failed=True)]
    res = compute_advantages(rollouts, AlgorithmConfig(advantage="grpo"))
    # Group 0 is {1.0, 0.0}: ±(0.5 / std) with sample std 0.7071.
    np.testing.assert_allclose(res.advantages[0], [0.70710576] * 3, rtol=1e-5)
    np.testing.assert_allclose(res.advantages[2], [-0.70710576] * 3, rtol=1e-5)
    assert not res.advantages[1].any() and not res.advantages[4].any()
    assert not res.advantages[3].any()  # group 1 became a group of one


def test_compute_advantages_refuses_unscored():
    r = Rollout(prompt_ids=[1], completion_ids=[2], logprobs=[0.0], versions=[0], request_id="x")
    with pytest.raises(ValueError, match="no reward"):
        compute_advantages([r], AlgorithmConfig())

"""KL in the reward (REINFORCE++ style): each generated token's reward carries
−kl_coef·(log μ − log π_ref), and the loss has no KL term of its own."""

import numpy as np
import pytest
import torch

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.algorithms.advantages import compute_advantages
from tokenflow.trainer import Trainer, TrainerConfig
from tests.trainer.trainer_testlib import make_rollouts, on_policy, reference_logprobs, tiny_model

CFG = TrainerConfig(device="cpu", lr=1e-3)


def test_token_rewards_are_the_behaviour_to_reference_log_ratio():
    alg = AlgorithmConfig(advantage="reinforce_pp", kl_coef=0.2, kl_in_reward=True)
    tr = Trainer(tiny_model(seed=1), CFG, alg)  # the reference is a frozen copy of these weights
    rollouts = on_policy(tiny_model(seed=2), make_rollouts(seed=5))  # sampled by another policy
    seqs = tr._sequences(rollouts)
    rewards, metrics = tr.passes.kl_rewards(rollouts, seqs)
    ref_model = tiny_model(seed=1)
    kls = []
    for r, got in zip(rollouts, rewards):
        kl = (r.logprobs - reference_logprobs(ref_model, r)) * r.loss_mask
        np.testing.assert_allclose(got, -0.2 * kl, atol=1e-5)
        kls.append(kl[r.loss_mask > 0])
    assert metrics["kl/reward_kl_mean"] == pytest.approx(np.concatenate(kls).mean(), abs=1e-5)
    assert abs(metrics["kl/reward_kl_mean"]) > 1e-3  # two different policies: a real penalty
    # ... and those rewards change the advantages the step trains on.
    plain = compute_advantages(rollouts, alg).advantages
    with_kl = compute_advantages(rollouts, alg, token_rewards=rewards).advantages
    assert max(np.abs(a - b).max() for a, b in zip(plain, with_kl)) > 1e-3


def test_kl_in_reward_trains_without_a_kl_loss_term():
    alg = AlgorithmConfig(advantage="reinforce_pp_baseline", kl_coef=0.2, kl_in_reward=True)
    tr = Trainer(tiny_model(seed=1), CFG, alg)
    before = [w.clone() for _, w in tr.named_weights()]
    m = tr.train_step(on_policy(tiny_model(seed=2), make_rollouts(seed=5)))
    assert m["loss/kl"] == 0.0 and m["kl/reward_kl_mean"] != 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, (w for _, w in tr.named_weights())))


@pytest.mark.parametrize("bad,match", [
    (dict(advantage="grpo", kl_coef=0.1), "uses only the outcome"),
    (dict(advantage="reinforce_pp"), "kl_coef > 0"),
    (dict(advantage="reinforce_pp", kl_coef=0.1, behaviour_logprobs=False), "behaviour log-probs"),
])
def test_kl_in_reward_refuses_what_cannot_carry_it(bad, match):
    with pytest.raises(ValueError, match=match):
        AlgorithmConfig(kl_in_reward=True, **bad)

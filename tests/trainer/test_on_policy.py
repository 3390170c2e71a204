"""On-policy identity: behaviour log-probs from the same weights make every correction a no-op,
and a step with lr = 0 leaves every parameter bit-identical."""

import numpy as np
import pytest
import torch

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.trainer import Trainer, TrainerConfig
from tests.trainer.trainer_testlib import VOCAB, make_rollouts, on_policy, tiny_model

ALL_CORRECTIONS = dict(tis_cap=1.5, is_mask_low=0.5, is_mask_high=2.0, opsm_delta=1e-3, max_token_age=0)


def with_supports(rollouts, seed=0):
    """Give a third of the tokens a recorded top-k support containing the sampled token."""
    rng = np.random.default_rng(seed)
    for r in rollouts:
        sup = []
        for t, a in enumerate(r.completion_ids):
            if t % 3 == 0:
                sup.append(np.unique(np.concatenate([rng.choice(VOCAB, 20, replace=False), [a]])).astype(np.int32))
            else:
                sup.append(None)
        r.support = sup
    return rollouts


@pytest.mark.parametrize("algo", [
    dict(ALL_CORRECTIONS),
    dict(ALL_CORRECTIONS, objective="decoupled", clip_high=0.28),
    dict(ALL_CORRECTIONS, policy_loss="gspo", aggregation="seq_mean_token_mean"),
    dict(ALL_CORRECTIONS, policy_loss="cispo", advantage="rloo", kl_coef=0.1, entropy_coef=0.01),
])
def test_on_policy_identity(algo):
    model = tiny_model(seed=1)
    version = 5
    rollouts = with_supports(make_rollouts(seed=2, temperature=0.9, version=version))
    on_policy(model, rollouts)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(model, TrainerConfig(device="cpu", lr=0.0, micro_batch_tokens=48),
                      AlgorithmConfig(**algo), version=version)
    m = trainer.train_step(rollouts)
    for key in ("offpolicy/is_ratio_mean", "offpolicy/is_ratio_min", "offpolicy/is_ratio_max",
                "offpolicy/mismatch_ratio"):
        assert abs(m[key] - 1) < 1e-5, key
    assert m["offpolicy/mismatch_abs_logprob"] < 1e-5
    assert m["offpolicy/mismatch_tokens"] == sum(int(r.loss_mask.sum()) for r in rollouts)
    for key in ("policy/clip_frac", "offpolicy/tis_clipped_frac", "offpolicy/is_masked_frac",
                "offpolicy/opsm_dropped_frac", "offpolicy/rejected_frac", "offpolicy/token_age_max",
                "policy/approx_kl"):
        assert m[key] < 1e-9, key
    assert m["optim/grad_norm"] > 0  # gradients were real; only lr = 0 kept the weights
    assert trainer.version == version + 1
    after = model.state_dict()
    for k, v in before.items():
        assert torch.equal(v, after[k]), k


def test_stale_tokens_are_rejected_and_reported():
    model = tiny_model(seed=1)
    rollouts = on_policy(model, make_rollouts(seed=2, version=3))
    rollouts[0].versions[:] = 1  # two versions old
    trainer = Trainer(model, TrainerConfig(device="cpu", lr=0.0), AlgorithmConfig(max_token_age=1), version=3)
    m = trainer.train_step(rollouts)
    n_model = sum(int(r.loss_mask.sum()) for r in rollouts)
    assert m["offpolicy/rejected_frac"] == pytest.approx(rollouts[0].loss_mask.sum() / n_model)
    assert m["offpolicy/token_age_max"] == 2
    assert m["perf/loss_tokens"] == n_model - rollouts[0].loss_mask.sum()
    assert m["perf/sequences"] == len(rollouts) - 1


def test_off_policy_metrics_on_a_constructed_batch():
    """Stale rollouts whose engine log-probs are off by a known factor: every correction and
    metric reports exactly the tokens it should, and the on-policy mismatch ignores stale tokens."""
    model = tiny_model(seed=3)
    rollouts = on_policy(model, make_rollouts(seed=4, version=7))
    stale = rollouts[::2]
    for r in stale:
        r.versions[:] = 6
        r.logprobs = r.logprobs - np.log(3.0)  # μ three times less likely: w = 3
    algo = AlgorithmConfig(tis_cap=2.0, is_mask_high=2.5, max_token_age=1)
    m = Trainer(model, TrainerConfig(device="cpu", lr=0.0), algo, version=7).train_step(rollouts)
    n_loss = sum(int(r.loss_mask.sum()) for r in rollouts)
    n_stale = sum(int(r.loss_mask.sum()) for r in stale)
    assert m["offpolicy/is_ratio_max"] == pytest.approx(3.0, rel=1e-4)
    assert m["offpolicy/is_ratio_min"] == pytest.approx(1.0, abs=1e-4)
    assert m["offpolicy/is_ratio_mean"] == pytest.approx((3 * n_stale + n_loss - n_stale) / n_loss, rel=1e-4)
    assert m["offpolicy/tis_clipped_frac"] == pytest.approx(n_stale / n_loss)
    assert m["offpolicy/is_masked_frac"] == pytest.approx(n_stale / n_loss)
    assert m["offpolicy/rejected_frac"] == 0.0
    assert m["offpolicy/token_age_mean"] == pytest.approx(n_stale / n_loss)
    assert m["offpolicy/mismatch_tokens"] == n_loss - n_stale
    assert m["offpolicy/mismatch_abs_logprob"] < 1e-5
    # One version older than the bound allows: the stale half is rejected instead.
    m = Trainer(model, TrainerConfig(device="cpu", lr=0.0), AlgorithmConfig(max_token_age=1),
                version=8).train_step(rollouts)
    assert m["offpolicy/rejected_frac"] == pytest.approx(n_stale / n_loss)
    assert m["offpolicy/is_ratio_max"] == pytest.approx(1.0, abs=1e-4)  # only fresh tokens remain


def test_the_mismatch_leaves_out_tokens_sampled_after_an_in_flight_update():
    """A rollout whose first tokens came from version 6 and the rest from 7: its version-7 tokens
    read keys and values computed under version 6, so they are not engine-vs-trainer tokens of
    version 7. Their engine log-probs are made off by log 3 here; the mismatch must not see them,
    and must see every token of the rollouts made wholly under version 7."""
    model = tiny_model(seed=3)
    rollouts = on_policy(model, make_rollouts(seed=4, version=7))
    spanning = [i for i in range(0, len(rollouts), 2) if rollouts[i].loss_mask[len(rollouts[i].versions) // 2:].any()]
    assert spanning
    for i in spanning:
        r = rollouts[i]
        r.versions[: len(r.versions) // 2] = 6
        r.logprobs = r.logprobs - np.log(3.0)
    m = Trainer(model, TrainerConfig(device="cpu", lr=0.0), AlgorithmConfig(max_token_age=1), version=7).train_step(rollouts)
    whole = sum(int(r.loss_mask.sum()) for i, r in enumerate(rollouts) if i not in spanning)
    assert m["offpolicy/mismatch_tokens"] == whole
    assert m["offpolicy/mismatch_abs_logprob"] < 1e-5

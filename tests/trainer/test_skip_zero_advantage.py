"""Skipping sequences whose advantage is 0 everywhere leaves the gradient exactly as it was.

Each test trains the same tiny model on the same batch with ``trainer.skip_zero_advantage`` on
and off and compares the parameter gradients the optimizer receives. The batch is off-policy
(behaviour log-probs from other weights), so ratios differ from 1 and clipping is active.
"""

import pytest
import torch

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.registry import AGGREGATIONS, POLICY_LOSSES
from tokenflow.trainer import Trainer, TrainerConfig
from tests.trainer.trainer_testlib import make_rollouts, on_policy, tiny_model

FLAT = {0: 1.0, 2: 0.0}  # groups whose samples all get this reward: advantage 0 under GRPO/RLOO/Dr. GRPO


def batch(groups: int = 4, flat: dict[int, float] = FLAT, seed: int = 7):
    rollouts = on_policy(tiny_model(seed=11), make_rollouts(seed=seed, groups=groups, per_group=4))
    for r in rollouts:
        if r.group_id in flat:
            r.reward = flat[r.group_id]
    return rollouts


def gradients(rollouts, algo: AlgorithmConfig, skip: bool, **trainer_kw):
    """(parameter gradients handed to the optimizer, step metrics) of one step."""
    cfg = TrainerConfig(device="cpu", lr=1e-3, micro_batch_tokens=24, pack_row_tokens=24,
                        skip_zero_advantage=skip, **trainer_kw)
    trainer = Trainer(tiny_model(seed=2), cfg, algo)
    captured = {}
    step = trainer.stepper.optimizer_step

    def capture(*args):
        captured.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
        return step(*args)

    trainer.stepper.optimizer_step = capture
    return captured, trainer.train_step(rollouts)


def assert_same_gradients(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        # Equal up to float32 summation order (the trained tokens are packed differently):
        # within a millionth of the tensor's largest entry.
        scale = float(b[name].abs().max())
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6 * scale, msg=name)


def flat_input_tokens(rollouts) -> int:
    return sum(len(r.prompt_ids) + r.num_tokens - 1 for r in rollouts if r.group_id in FLAT)


@pytest.mark.parametrize("aggregation", AGGREGATIONS.names())
@pytest.mark.parametrize("policy_loss", ["ppo", "gspo", "cispo"])
def test_gradient_is_the_same_for_every_aggregation_and_policy_loss(aggregation, policy_loss):
    rollouts = batch()
    algo = AlgorithmConfig(aggregation=aggregation, policy_loss=policy_loss, clip_high=0.28,
                           max_completion_tokens=16, tis_cap=1.5)
    with_skip, m_skip = gradients(rollouts, algo, skip=True)
    full, m_full = gradients(rollouts, algo, skip=False)
    assert m_skip["perf/skipped_sequences"] == 8 and m_full["perf/skipped_sequences"] == 0
    assert m_skip["perf/skipped_tokens"] == flat_input_tokens(rollouts)
    assert m_skip["perf/sequences"] == 8 and m_full["perf/sequences"] == 16
    assert m_skip["perf/train_tokens"] + m_skip["perf/skipped_tokens"] == m_full["perf/train_tokens"]
    assert m_skip["perf/loss_tokens"] == m_full["perf/loss_tokens"]  # the normaliser's count
    assert_same_gradients(with_skip, full)
    assert m_skip["loss/policy"] == pytest.approx(m_full["loss/policy"], rel=1e-5, abs=1e-9)
    assert m_skip["optim/grad_norm"] == pytest.approx(m_full["optim/grad_norm"], rel=1e-5)
    assert m_full["optim/grad_norm"] > 1e-3

    # The comparison has teeth: dropping those rollouts from the batch instead (so that the
    # normaliser no longer counts them) changes the gradient in every mode.
    dropped, _ = gradients([r for r in rollouts if r.group_id not in FLAT], algo, skip=False)
    diff = max(float((dropped[n] - full[n]).abs().max()) for n in full)
    assert diff > 1e-3 * max(float(g.abs().max()) for g in full.values())


def test_decoupled_objective_scores_prox_only_for_trained_sequences():
    rollouts = batch()
    algo = AlgorithmConfig(objective="decoupled", tis_cap=2.0, clip_high=0.28)
    with_skip, m_skip = gradients(rollouts, algo, skip=True)
    full, _ = gradients(rollouts, algo, skip=False)
    assert m_skip["perf/skipped_sequences"] == 8
    assert_same_gradients(with_skip, full)


def test_a_step_with_every_sequence_skipped_still_steps_the_optimizer():
    """AdamW moves the weights on a zero gradient (momentum): the skip must give it one."""
    first, second = batch(seed=3, flat={}), batch(seed=4, flat={g: float(g % 2) for g in range(4)})
    weights = []
    for skip in (True, False):
        trainer = Trainer(tiny_model(seed=2), TrainerConfig(device="cpu", lr=1e-2, skip_zero_advantage=skip),
                          AlgorithmConfig())
        trainer.train_step(first)
        before = {n: w.clone() for n, w in trainer.named_weights()}
        m = trainer.train_step(second)
        assert m["perf/skipped_sequences"] == (16 if skip else 0)
        assert m["optim/grad_norm"] == 0.0 and m["perf/micro_batches"] == (0 if skip else m["perf/micro_batches"])
        after = dict(trainer.named_weights())
        assert any(not torch.equal(before[n], after[n]) for n in after)  # momentum moved them
        weights.append(after)
    for n in weights[0]:
        assert torch.equal(weights[0][n], weights[1][n]), n


@pytest.mark.parametrize("algo, trainer_kw", [
    (dict(kl_coef=0.1), {}),
    (dict(entropy_coef=0.01), {}),
    (dict(advantage="gae"), dict(value_head=True)),
])
def test_nothing_is_skipped_when_another_term_reads_the_sequence(algo, trainer_kw):
    cfg = AlgorithmConfig(**algo)
    assert not cfg.zero_advantage_is_inert
    _, m = gradients(batch(), cfg, skip=True, **trainer_kw)
    assert m["perf/skipped_sequences"] == 0 and m["perf/sequences"] == 16


def test_kl_in_the_reward_leaves_sequences_trainable_and_inert_only_where_advantage_is_zero():
    assert AlgorithmConfig(advantage="reinforce_pp", kl_coef=0.1, kl_in_reward=True).zero_advantage_is_inert
    assert AlgorithmConfig().zero_advantage_is_inert


def test_a_policy_loss_that_does_not_declare_it_is_never_skipped():
    def shifted(logprobs, old_logprobs, adv, clip_low, clip_high, **_):
        return -(adv + 0.1) * logprobs, torch.zeros_like(adv, dtype=torch.bool)  # not 0 where A = 0

    POLICY_LOSSES.add("shifted_for_test", shifted)
    try:
        cfg = AlgorithmConfig(policy_loss="shifted_for_test")
        assert not cfg.zero_advantage_is_inert
        _, m = gradients(batch(), cfg, skip=True)
        assert m["perf/skipped_sequences"] == 0
    finally:
        POLICY_LOSSES._entries.pop("shifted_for_test")


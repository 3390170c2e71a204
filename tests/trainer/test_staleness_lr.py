"""The staleness-aware learning rate (``trainer.staleness_lr``): a batch of old tokens takes a
shorter step, a fresh one the schedule's.

The collapse it guards against (docs/algorithms.md, "A learning rate that follows staleness"):
at K = 4 the default run reached 0.96 held-out accuracy by step 5, then five batches of tokens
about three versions old, each trained at the full lr, took it to 0.57 (replayed from the
checkpoint: 0.93 at half the lr). Here a batch is made that old by its versions alone.
"""

import pytest
import torch

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.config.trainer import TrainerConfig
from tokenflow.trainer import Trainer
from tokenflow.trainer.schedule import staleness_lr_scale
from tests.trainer.trainer_testlib import make_rollouts, on_policy, tiny_model

LR = 2e-2


def trainer(version: int = 4, **kw) -> Trainer:
    cfg = TrainerConfig(**{**dict(device="cpu", lr=LR, grad_clip=None, micro_batch_tokens=48), **kw})
    return Trainer(tiny_model(seed=2), cfg, AlgorithmConfig(), version=version)


def batch(version: int):
    """On-policy log-probs (w = 1), so only the versions make the batch stale."""
    return on_policy(tiny_model(seed=2), make_rollouts(seed=5, groups=4, per_group=4, version=version))


def moved(t: Trainer, rollouts) -> tuple[dict, dict[str, torch.Tensor]]:
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    metrics = t.train_step(rollouts)
    return metrics, {k: v - before[k] for k, v in t.model.state_dict().items()}


def test_the_factor_follows_the_mean_age_past_the_reference():
    on = TrainerConfig()
    assert [staleness_lr_scale(a, on) for a in (0.0, 0.5, 1.0)] == [1.0, 1.0, 1.0]
    assert staleness_lr_scale(3.0, on) == 0.5 and staleness_lr_scale(7.0, on) == 0.25
    assert staleness_lr_scale(3.0, TrainerConfig(staleness_lr_ref=2.0)) == 0.75
    assert staleness_lr_scale(3.0, TrainerConfig(staleness_lr=False)) == 1.0


def test_a_stale_batch_takes_the_step_of_half_the_lr():
    """Tokens three versions old (trainer version 4, tokens version 1): ā = 3, so the step is the
    one the same trainer takes at lr / 2 with the guard off (AdamW's step is linear in lr)."""
    m, guarded = moved(trainer(), batch(version=1))
    assert m["optim/staleness_lr_scale"] == 0.5 and m["optim/lr"] == pytest.approx(LR / 2)
    m_half, half = moved(trainer(lr=LR / 2, staleness_lr=False), batch(version=1))
    m_full, full = moved(trainer(staleness_lr=False), batch(version=1))
    assert m_full["optim/staleness_lr_scale"] == 1.0 and m_full["optim/lr"] == pytest.approx(LR)
    for k in guarded:
        torch.testing.assert_close(guarded[k], half[k], rtol=1e-5, atol=1e-8)
    assert sum(float(d.norm()) for d in guarded.values()) < 0.6 * sum(float(d.norm()) for d in full.values())


def test_a_fresh_batch_and_the_schedule_are_untouched():
    """Age ≤ the reference: the full lr. The factor applies to one batch only: the next batch
    runs at the schedule's lr again."""
    t = trainer(version=4)
    fresh = t.train_step(batch(version=3))  # ā = 1
    assert fresh["optim/staleness_lr_scale"] == 1.0 and fresh["optim/lr"] == pytest.approx(LR)
    stale = t.train_step(batch(version=0))  # trainer at 5: ā = 5
    assert stale["optim/staleness_lr_scale"] == pytest.approx(2 / 6) and stale["optim/lr"] == pytest.approx(LR / 3)
    assert [g["lr"] for g in t.optimizer.param_groups] == pytest.approx([LR] * len(t.optimizer.param_groups))

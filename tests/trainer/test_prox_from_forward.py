"""The decoupled objective reads π_prox off the step's own forward pass.

One ``train_step`` is one optimizer step, so every micro-batch is forwarded with the weights of
the start of the step, which is what π_prox is. The separate no-grad pass recomputed those
numbers; these tests train the same tiny model on the same off-policy batch with π_prox from the
forward and from the pass and compare the gradients, and check the pass no longer runs.
"""

import pytest

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.trainer import Trainer, TrainerConfig
from tests.trainer.test_skip_zero_advantage import assert_same_gradients, batch
from tests.trainer.trainer_testlib import tiny_model


def one_step(algo: AlgorithmConfig, *, force_pass: bool = False, **trainer_kw):
    """(gradients the optimizer got, metrics, number of no-grad π_prox passes) of one step."""
    cfg = TrainerConfig(device="cpu", lr=1e-3, micro_batch_tokens=24, pack_row_tokens=24, **trainer_kw)
    trainer = Trainer(tiny_model(seed=2), cfg, algo)
    if force_pass:  # the previous behaviour: a separate pass before the update
        trainer.__class__ = type("PassTrainer", (Trainer,), {"prox_from_forward": property(lambda self: False)})
    captured, passes = {}, []
    step, score = trainer.stepper.optimizer_step, trainer.passes.score

    def capture(*args):
        captured.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
        return step(*args)

    def counting_score(*args, **kwargs):
        passes.append(1)
        return score(*args, **kwargs)

    trainer.stepper.optimizer_step, trainer.passes.score = capture, counting_score
    metrics = trainer.train_step(batch())
    return captured, metrics, len(passes)


@pytest.mark.parametrize("tis_cap", [None, 1.5])
@pytest.mark.parametrize("skip", [True, False])
def test_prox_from_the_forward_gives_the_gradient_of_the_prox_pass(tis_cap, skip):
    algo = AlgorithmConfig(objective="decoupled", tis_cap=tis_cap, clip_high=0.28)
    fast, m_fast, fast_passes = one_step(algo, skip_zero_advantage=skip)
    slow, m_slow, slow_passes = one_step(algo, force_pass=True, skip_zero_advantage=skip)
    assert (fast_passes, slow_passes) == (0, 1)
    assert_same_gradients(fast, slow)
    assert m_fast["optim/grad_norm"] == pytest.approx(m_slow["optim/grad_norm"], rel=1e-5)
    assert m_fast["optim/grad_norm"] > 1e-3
    # The batch is off-policy (behaviour from other weights): the weights w are far from 1.
    assert m_fast["offpolicy/is_ratio_max"] > 1.5
    assert m_fast["offpolicy/is_ratio_max"] == pytest.approx(m_slow["offpolicy/is_ratio_max"], rel=1e-4)


def test_decoupled_differs_from_direct_where_direct_clips_against_mu():
    """The comparison has teeth: on this off-policy batch the direct objective clips ρ = π_θ/μ
    and its gradient differs, while the decoupled one never clips at the step's only point."""
    decoupled, m_dec, _ = one_step(AlgorithmConfig(objective="decoupled"))
    direct, m_dir, passes = one_step(AlgorithmConfig(objective="direct"))
    assert passes == 0
    assert m_dir["policy/clip_frac"] > 0.05 and m_dec["policy/clip_frac"] == 0.0
    diff = max(float((direct[n] - decoupled[n]).abs().max()) for n in direct)
    assert diff > 1e-3 * max(float(g.abs().max()) for g in decoupled.values())


def test_a_stochastic_forward_keeps_the_pass():
    pytest.importorskip("peft")
    algo = AlgorithmConfig(objective="decoupled")
    for dropout, want in ((0.0, 0), (0.1, 1)):
        cfg = dict(lora_rank=4, lora_dropout=dropout, lora_target_modules=["q_proj", "v_proj"])
        _, _, passes = one_step(algo, **cfg)
        assert passes == want, dropout

"""TIS, IS masking, OPSM and version rejection on a constructed batch, and their combination in
the micro-batch objective."""


import numpy as np
import pytest
import torch

from tokenflow.algorithms import AlgorithmConfig, GlobalCounts, TokenInputs, micro_batch_loss, token_weights
from tokenflow.algorithms.corrections import apply_corrections, version_keep
from tokenflow.algorithms.stats import Accumulator

# Two sequences of three tokens. Behaviour weights w = π/μ: 0.5, 1, 4 | 1, 2, 0.25.
W = torch.tensor([0.5, 1.0, 4.0, 1.0, 2.0, 0.25], dtype=torch.float64)
LOGP = torch.log(torch.full((6,), 0.3, dtype=torch.float64))
BEHAVIOUR = LOGP - torch.log(W)
SEQ = torch.tensor([0, 0, 0, 1, 1, 1])
MASK = torch.ones(6, dtype=torch.bool)


def corr(cfg, adv=None, prox=None):
    adv = torch.ones(6, dtype=torch.float64) if adv is None else adv
    return apply_corrections(cfg, logprobs=LOGP, behaviour=BEHAVIOUR, prox=prox, adv=adv, mask=MASK,
                             seq_index=SEQ, num_seqs=2)


def test_no_corrections_is_identity_for_direct():
    c = corr(AlgorithmConfig(objective="direct", tis_cap=None))
    assert c.weight.tolist() == [1.0] * 6 and c.keep.all()
    torch.testing.assert_close(torch.exp(c.log_w), W)


def test_tis_direct_caps_the_effective_weight():
    c = corr(AlgorithmConfig(objective="direct", tis_cap=2.0))
    # Direct: ρ already holds w, so the factor is min(1, C/w): effective weight min(w, C).
    torch.testing.assert_close(c.weight, torch.tensor([1, 1, 0.5, 1, 1, 1], dtype=torch.float64))
    torch.testing.assert_close(c.weight * W, torch.clamp(W, max=2.0))
    assert c.tis_clipped.tolist() == [False, False, True, False, False, False]


def test_tis_decoupled_weight_is_min_w_c():
    # Decoupled: w = π_prox/μ, here with π_prox = the same numbers as π_θ.
    c = corr(AlgorithmConfig(objective="decoupled", tis_cap=2.0), prox=LOGP)
    torch.testing.assert_close(c.weight, torch.clamp(W, max=2.0))
    c = corr(AlgorithmConfig(objective="decoupled", tis_cap=None), prox=LOGP)
    torch.testing.assert_close(c.weight, W)  # untruncated importance weight (TIS off)
    # The default caps at 2.
    torch.testing.assert_close(corr(AlgorithmConfig(objective="decoupled"), prox=LOGP).weight,
                               torch.clamp(W, max=2.0))
    # Without π_prox given, it is π_θ's value (one optimizer step per batch): the same weights.
    torch.testing.assert_close(corr(AlgorithmConfig(objective="decoupled", tis_cap=2.0)).weight,
                               torch.clamp(W, max=2.0))


def test_is_masking_bounds_are_inclusive():
    c = corr(AlgorithmConfig(is_mask_low=0.5, is_mask_high=2.0))
    assert c.keep.tolist() == [True, True, False, True, True, False]
    assert c.is_masked.sum() == 2


def test_opsm_drops_only_negative_divergent_sequences():
    # Mean log μ − log π: seq 0 = −mean(log w) = −log 2/3 < 0; seq 1 = −log(0.5)/3 = 0.231.
    adv = torch.tensor([-1.0] * 3 + [-1.0] * 3, dtype=torch.float64)
    c = corr(AlgorithmConfig(opsm_delta=0.2), adv=adv)
    assert c.keep.tolist() == [True] * 3 + [False] * 3
    c = corr(AlgorithmConfig(opsm_delta=0.25), adv=adv)
    assert c.keep.all()  # divergence 0.231 below δ
    c = corr(AlgorithmConfig(opsm_delta=0.2), adv=-adv)
    assert c.keep.all()  # positive advantages are never dropped


def test_version_rejection():
    versions = np.array([10, 9, 8, 7, 10])
    assert version_keep(versions, 10, 2).tolist() == [True, True, True, False, True]
    assert version_keep(versions, 10, 0).tolist() == [True, False, False, False, True]
    assert version_keep(versions, 10, None).all()


def test_corrections_combine_in_the_objective():
    """TIS + IS mask + OPSM in one loss: the result equals a loop over tokens."""
    cfg = AlgorithmConfig(policy_loss="ppo", objective="direct", clip_low=0.01, clip_high=10.0, tis_cap=2.0,
                          is_mask_high=3.0, opsm_delta=0.2)
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    logp = LOGP.clone().requires_grad_()
    weights = token_weights("token_mean", MASK, SEQ, torch.tensor([3, 3]), GlobalCounts(6, 2))
    stats = Accumulator()
    terms = micro_batch_loss(cfg, TokenInputs(logprobs=logp, behaviour=BEHAVIOUR, advantages=adv, mask=MASK,
                                              weights=weights.double(), seq_index=SEQ, num_seqs=2), stats)
    # Seq 1 (negative advantage, divergence 0.231 > 0.2) is dropped by OPSM; token 2 (w = 4) is
    # IS-masked; tokens 0, 1: ratio w, PPO clip inactive (ε_high = 10), loss −w·1, TIS factor 1.
    expected = (-0.5 - 1.0) / 6
    assert terms.policy.item() == pytest.approx(expected, rel=1e-6)
    assert stats.get("sum/is_masked") == 1 and stats.get("sum/opsm_dropped") == 3
    assert stats.get("sum/tis_clipped") == 1  # token 2 exceeds the cap even though it is masked
    assert stats.max("max/w") == pytest.approx(4.0) and stats.min("min/w") == pytest.approx(0.25)
    terms.total.backward()
    assert logp.grad[2:].abs().max() == 0


def test_direct_ratio_is_against_behaviour_and_decoupled_against_prox():
    adv = torch.ones(6, dtype=torch.float64)
    weights = token_weights("token_mean", MASK, SEQ, torch.tensor([3, 3]), GlobalCounts(6, 2)).double()
    common = dict(behaviour=BEHAVIOUR, advantages=adv, mask=MASK, weights=weights, seq_index=SEQ, num_seqs=2)
    big = AlgorithmConfig(clip_low=0.99, clip_high=100.0, objective="direct", tis_cap=None)
    direct = micro_batch_loss(big, TokenInputs(logprobs=LOGP, **common))
    assert direct.policy.item() == pytest.approx(-W.mean().item())  # −mean(ρ·A), ρ = w
    # Decoupled with π_prox = π_θ: ρ = 1, weight w → the same value, but through w, not ρ.
    dec_cfg = AlgorithmConfig(clip_low=0.99, clip_high=100.0, objective="decoupled", tis_cap=None)
    logp = LOGP.clone().requires_grad_()
    dec = micro_batch_loss(dec_cfg, TokenInputs(logprobs=logp, prox=LOGP, **common))
    assert dec.policy.item() == pytest.approx(-W.mean().item())
    dec.policy.backward()
    torch.testing.assert_close(logp.grad, -W / 6)
    # π_prox left out is π_θ's value: the same loss and gradient.
    logp2 = LOGP.clone().requires_grad_()
    dec2 = micro_batch_loss(dec_cfg, TokenInputs(logprobs=logp2, **common))
    assert dec2.policy.item() == pytest.approx(dec.policy.item())
    dec2.policy.backward()
    torch.testing.assert_close(logp2.grad, logp.grad)


def test_under_staleness_direct_clips_what_decoupled_trains():
    """The reason decoupled is the default: a token whose probability rose while its rollout
    waited (w = 4 > 1 + ε) with a positive advantage gets no gradient from the direct
    objective, whose clip is anchored at μ, but the weighted gradient from the decoupled one."""
    adv = torch.ones(6, dtype=torch.float64)
    weights = token_weights("token_mean", MASK, SEQ, torch.tensor([3, 3]), GlobalCounts(6, 2)).double()
    grads = {}
    for objective in ("direct", "decoupled"):
        logp = LOGP.clone().requires_grad_()
        micro_batch_loss(AlgorithmConfig(objective=objective, tis_cap=None), TokenInputs(
            logprobs=logp, behaviour=BEHAVIOUR, advantages=adv, mask=MASK, weights=weights, seq_index=SEQ,
            num_seqs=2)).policy.backward()
        grads[objective] = logp.grad
    # w = 0.5, 1, 4 | 1, 2, 0.25; ε = 0.2: direct clips w = 4 and w = 2 (A > 0).
    torch.testing.assert_close(grads["direct"], -torch.tensor([0.5, 1, 0, 1, 0, 0.25], dtype=torch.float64) / 6)
    torch.testing.assert_close(grads["decoupled"], -W / 6)

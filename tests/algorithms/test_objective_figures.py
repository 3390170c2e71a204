"""`micro_batch_loss` on three tokens worked through by hand: every loss term and every statistic
it records, and the refusals when an input a term needs is missing."""

import math

import pytest
import torch

from tokenflow.algorithms import AlgorithmConfig, TokenInputs, micro_batch_loss
from tokenflow.algorithms.stats import Accumulator

L = math.log
CFG = AlgorithmConfig(objective="direct", policy_loss="ppo", clip_low=0.2, clip_high=0.2, tis_cap=2.0,
                      kl_coef=0.5, kl_estimator="k1", entropy_coef=0.1, value_coef=0.5, advantage="gae")


def inputs(mask=(True, True, False)) -> TokenInputs:
    # π = 0.5, 0.25, 0.5 and μ = 0.5, 0.0625, 0.5: w = ρ = 1, 4, 1; the third token is not a loss token
    d = torch.float64
    return TokenInputs(
        logprobs=torch.tensor([L(0.5), L(0.25), L(0.5)], dtype=d), behaviour=torch.tensor([L(0.5), L(0.0625), L(0.5)], dtype=d),
        advantages=torch.ones(3, dtype=d), mask=torch.tensor(mask), weights=torch.tensor([0.5, 0.5, 0.0], dtype=d),
        seq_index=torch.tensor([0, 0, 1]), num_seqs=2, entropy=torch.tensor([1.0, 3.0, 9.0], dtype=d),
        ref_logprobs=torch.tensor([L(0.25), L(0.25), 0.0], dtype=d), values=torch.tensor([0.5, 1.0, 7.0], dtype=d),
        old_values=torch.tensor([0.5, 1.0, 7.0], dtype=d), returns=torch.tensor([1.5, 0.0, 0.0], dtype=d))


def test_every_term_and_statistic_of_a_hand_worked_micro_batch():
    stats = Accumulator()
    terms = micro_batch_loss(CFG, inputs(), stats)
    # policy: PPO −min(ρA, clip(ρ)A) = −1, −1.2; TIS factor min(1, 2/w) = 1, 0.5; weights ½ each
    policy = -(1 * 1 * 0.5) - (1.2 * 0.5 * 0.5)
    kl = 0.5 * (0.5 * L(2) + 0.5 * 0.0)  # k1 = log π − log π_ref = log 2, 0
    entropy = -0.1 * (0.5 * 1.0 + 0.5 * 3.0)
    value = 0.5 * (0.5 * 0.5 * 1.0 + 0.5 * 0.5 * 1.0)  # 0.5·(V − R)² = 0.5, 0.5
    got = {k: getattr(terms, k).item() for k in ("policy", "kl", "entropy_bonus", "value", "total")}
    assert got == pytest.approx({"policy": policy, "kl": kl, "entropy_bonus": entropy, "value": value,
                                 "total": policy + kl + entropy + value}, rel=1e-12)
    figures = {"n/tokens": 2, "sum/approx_kl": 3 - L(4),  # (ρ − 1) − log ρ at ρ = 1, 4
               "sum/clipped": 1, "sum/w": 5, "sum/tis_clipped": 1, "sum/is_masked": 0, "sum/opsm_dropped": 0,
               "sum/entropy": 4, "sum/ref_kl": L(2), "sum/value_err": 2,
               "loss/total": got["total"], "loss/policy": policy, "loss/kl": kl, "loss/entropy_bonus": entropy,
               "loss/value": value}
    assert {k: stats.get(k) for k in figures} == pytest.approx(figures, rel=1e-12)
    assert (stats.min("min/w"), stats.max("max/w"), stats.max("max/used_w")) == pytest.approx((1.0, 4.0, 2.0))


def test_a_micro_batch_without_loss_tokens_records_nothing():
    stats = Accumulator()
    micro_batch_loss(CFG, inputs(mask=(False, False, False)), stats)
    assert "n/tokens" not in stats and "loss/total" not in stats


def test_terms_without_their_inputs_are_left_out_or_refused():
    stats = Accumulator()
    bare = inputs()
    bare.entropy = bare.values = bare.returns = None
    terms = micro_batch_loss(CFG, bare, stats)
    assert (terms.entropy_bonus.item(), terms.value.item()) == (0.0, 0.0)
    assert "sum/entropy" not in stats and "sum/value_err" not in stats
    bare.ref_logprobs = None
    with pytest.raises(ValueError, match=r"^algorithm.kl_coef > 0 needs reference log-probs$"):
        micro_batch_loss(CFG, bare)
    no_prox = AlgorithmConfig(objective="decoupled", behaviour_logprobs=False)
    with pytest.raises(ValueError, match=r"^objective 'decoupled' needs π_prox log-probs \(a prox pass\)$"):
        micro_batch_loss(no_prox, inputs())


def test_without_behaviour_log_probs_prox_stands_in_for_the_engines():
    # behaviour_logprobs off: π_prox is both the ratio's denominator and μ, so every w is 1
    t = inputs()
    t.prox = t.logprobs.detach().clone()
    cfg = AlgorithmConfig(objective="direct", behaviour_logprobs=False, tis_cap=None)
    stats = Accumulator()
    micro_batch_loss(cfg, t, stats)
    assert (stats.get("sum/w"), stats.max("max/w"), stats.get("sum/approx_kl")) == (2.0, 1.0, 0.0)


def test_values_without_returns_have_no_value_term_and_value_clipping_uses_the_old_values():
    stats = Accumulator()
    t = inputs()
    t.returns = None
    assert micro_batch_loss(CFG, t, stats).value.item() == 0.0 and "sum/value_err" not in stats
    # V = 0.5, 1 from V_old = 1.5, 1 with returns 1.5, 0 and a clip of 0.25: the first token's clipped
    # prediction 1.25 errs by 0.25 (< 1, the plain error); the second's is V itself: errors 1, 1
    t = inputs()
    t.old_values = torch.tensor([1.5, 1.0, 7.0], dtype=torch.float64)
    clipped = AlgorithmConfig(**{**CFG.model_dump(), "value_clip": 0.25})
    value = micro_batch_loss(clipped, t).value.item()
    assert value == pytest.approx(0.5 * (0.5 * 0.5 * 1.0 + 0.5 * 0.5 * 1.0), rel=1e-12)
    t.old_values = torch.tensor([-1.0, 1.0, 7.0], dtype=torch.float64)  # V moved +1.5: clipped to −0.75
    value = micro_batch_loss(clipped, t).value.item()
    assert value == pytest.approx(0.5 * (0.5 * 0.5 * (2.25 ** 2) + 0.5 * 0.5 * 1.0), rel=1e-12)

"""Policy losses, KL estimators and value loss on small hand-computed examples."""

import math

import pytest
import torch

from tokenflow.algorithms.kl import token_kl
from tokenflow.algorithms.losses import cispo, gspo, ppo_clip, value_loss


def lp(*probs):
    return torch.log(torch.tensor(probs, dtype=torch.float64))


def test_ppo_hand_example():
    # ratios 1.5, 0.5, 1.1, 0.9 with advantages +1, +1, -2, -2; ε = 0.2.
    old = lp(0.2, 0.4, 0.5, 0.5)
    new = lp(0.3, 0.2, 0.55, 0.45).requires_grad_()
    adv = torch.tensor([1.0, 1.0, -2.0, -2.0], dtype=torch.float64)
    loss, clipped = ppo_clip(new, old, adv, 0.2, 0.2)
    # min(1.5·1, 1.2·1) = 1.2; min(0.5, 0.8) = 0.5; min(-2.2, -2.2) = -2.2; min(-1.8, -1.8) = -1.8
    torch.testing.assert_close(loss, torch.tensor([-1.2, -0.5, 2.2, 1.8], dtype=torch.float64))
    assert clipped.tolist() == [True, False, False, False]
    loss.sum().backward()
    # Gradient of −ρA w.r.t. log π is −ρA where unclipped, 0 where the clip binds.
    torch.testing.assert_close(new.grad, torch.tensor([0.0, -0.5, 2.2, 1.8], dtype=torch.float64))


@pytest.mark.parametrize("side", ["high", "low"])
def test_clip_higher_asymmetry_at_both_boundaries(side):
    lo, hi = 0.2, 0.28
    # Ratios just inside and just outside each boundary.
    if side == "high":
        ratios, adv = [1.27, 1.29, 1.21], 1.0  # 1.21 would be clipped by a symmetric 0.2
        expect_clipped = [False, True, False]
        expect_loss = [-1.27, -1.28, -1.21]
    else:
        ratios, adv = [0.81, 0.79, 0.75], -1.0  # the low side still clips at 0.8
        expect_clipped = [False, True, True]
        expect_loss = [0.81, 0.8, 0.8]
    old = torch.zeros(3, dtype=torch.float64)
    new = torch.log(torch.tensor(ratios, dtype=torch.float64)).requires_grad_()
    a = torch.full((3,), adv, dtype=torch.float64)
    loss, clipped = ppo_clip(new, old, a, lo, hi)
    torch.testing.assert_close(loss, torch.tensor(expect_loss, dtype=torch.float64))
    assert clipped.tolist() == expect_clipped
    loss.sum().backward()
    assert [g != 0 for g in new.grad.tolist()] == [not c for c in expect_clipped]


def test_ppo_clip_does_not_bind_against_the_advantage():
    # A > 0 with ρ below 1 − ε, or A < 0 with ρ above 1 + ε: the unclipped term is the min.
    old = torch.zeros(2, dtype=torch.float64)
    new = torch.log(torch.tensor([0.5, 1.5], dtype=torch.float64)).requires_grad_()
    loss, clipped = ppo_clip(new, old, torch.tensor([1.0, -1.0], dtype=torch.float64), 0.2, 0.28)
    torch.testing.assert_close(loss, torch.tensor([-0.5, 1.5], dtype=torch.float64))
    assert not clipped.any()


def test_gspo_sequence_ratio():
    # Sequence 0: token ratios 1.2 and 1/1.2 → geometric mean 1. Sequence 1: ratios 2 and 2 (plus a
    # masked token with ratio 100 that must not count) → s = 2, clipped at 1.2 with A > 0.
    old = torch.zeros(5, dtype=torch.float64)
    new = torch.log(torch.tensor([1.2, 1 / 1.2, 2.0, 2.0, 100.0], dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([0.5, 0.5, 1.0, 1.0, 1.0], dtype=torch.float64)
    mask = torch.tensor([True, True, True, True, False])
    seq = torch.tensor([0, 0, 1, 1, 1])
    loss, clipped = gspo(new, old, adv, 0.2, 0.2, mask=mask, seq_index=seq, num_seqs=2)
    torch.testing.assert_close(loss[:4], torch.tensor([-0.5, -0.5, -1.2, -1.2], dtype=torch.float64))
    assert clipped[:4].tolist() == [False, False, True, True]
    (loss[:4].sum()).backward()
    # Token gradient = −s_i·A: every token of sequence 0 gets −0.5, clipped sequence 1 gets 0.
    torch.testing.assert_close(new.grad[:4], torch.tensor([-0.5, -0.5, 0.0, 0.0], dtype=torch.float64))


def test_cispo_stop_gradient_weight():
    old = torch.zeros(3, dtype=torch.float64)
    ratios = torch.tensor([2.0, 1.1, 0.5], dtype=torch.float64)
    new = torch.log(ratios * 0.25).requires_grad_()  # log π_θ, used inside the loss
    old = old + math.log(0.25)
    adv = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64)
    loss, clipped = cispo(new, old, adv, 0.2, 0.28)
    w = torch.tensor([1.28, 1.1, 0.8], dtype=torch.float64)
    torch.testing.assert_close(loss, -w * adv * new.detach())
    assert clipped.tolist() == [True, False, True]
    loss.sum().backward()
    # The weight is detached: d/d log π of −w·A·log π is −w·A, and clipped tokens keep a gradient.
    torch.testing.assert_close(new.grad, -w * adv)
    assert (new.grad != 0).all()


def test_kl_estimators():
    logp = torch.log(torch.tensor([0.5, 0.1], dtype=torch.float64))
    ref = torch.log(torch.tensor([0.25, 0.2], dtype=torch.float64))
    torch.testing.assert_close(token_kl(logp, ref, "k1"), torch.tensor([math.log(2), math.log(0.5)],
                                                                       dtype=torch.float64))
    r = torch.tensor([0.5, 2.0], dtype=torch.float64)  # π_ref / π
    torch.testing.assert_close(token_kl(logp, ref, "k3"), r - torch.log(r) - 1)
    assert (token_kl(logp, ref, "k3") >= 0).all()
    assert token_kl(logp, logp, "k3").abs().max() == 0


def test_value_loss_and_clipping():
    v = torch.tensor([1.0, 0.0], dtype=torch.float64)
    old = torch.tensor([0.0, 0.0], dtype=torch.float64)
    ret = torch.tensor([0.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(value_loss(v, old, ret), torch.tensor([0.5, 0.5], dtype=torch.float64))
    # Clipped prediction for token 0 is 0 + clip(1, ±0.1) = 0.1 → error 0.01 < 1: max keeps 1.
    # Token 1 unchanged (V = V_old). With returns = 2 for token 0, clipped error (1.9²) wins.
    ret2 = torch.tensor([2.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(value_loss(v, old, ret2, clip=0.1),
                               torch.tensor([0.5 * 1.9 ** 2, 0.5], dtype=torch.float64))

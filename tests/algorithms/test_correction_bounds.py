"""Corrections at their bounds: the log-weight clamp at ±20 (both sides) and TIS at w equal to
the cap, where nothing is clipped."""

import torch

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.algorithms.corrections import apply_corrections


def corrections(cfg, logprobs, behaviour):
    n = len(logprobs)
    return apply_corrections(cfg, logprobs=logprobs, behaviour=behaviour, prox=None, adv=torch.ones(n),
                             mask=torch.ones(n, dtype=torch.bool), seq_index=torch.zeros(n, dtype=torch.long),
                             num_seqs=1)


def test_log_weights_are_clamped_to_plus_and_minus_twenty():
    # log π − log μ = +30, −30 and 5: the first two clamped, the third as it is
    c = corrections(AlgorithmConfig(objective="direct", tis_cap=None),
                    torch.tensor([0.0, -30.0, -1.0]), torch.tensor([-30.0, 0.0, -6.0]))
    assert c.log_w.tolist() == [20.0, -20.0, 5.0]


def test_tis_clips_only_weights_above_the_cap():
    # π = μ: w = exp(0) = 1 exactly, at a cap of 1 (kept, factor 1); w = e above it (clipped)
    c = corrections(AlgorithmConfig(objective="direct", tis_cap=1.0),
                    torch.tensor([-2.0, -1.0]), torch.tensor([-2.0, -2.0]))
    assert c.tis_clipped.tolist() == [False, True]
    assert c.weight[0].item() == 1.0


def test_the_weight_the_loss_uses_is_capped_only_with_a_cap():
    lp, mu = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -2.0])  # w = e, 1
    capped = corrections(AlgorithmConfig(objective="direct", tis_cap=1.0), lp, mu)
    assert capped.used_w.tolist() == [1.0, 1.0]
    for off in (0.0, None):  # 0 is off too
        c = corrections(AlgorithmConfig(objective="direct", tis_cap=off), lp, mu)
        torch.testing.assert_close(c.used_w, torch.exp(torch.tensor([1.0, 0.0])))
        assert c.tis_clipped.tolist() == [False, False]


def test_is_masking_keeps_weights_on_its_bounds():
    # w = 1 exactly (π = μ), e and 1/e: on the bound [1, 2] or [0.5, 1] the 1 is kept
    lp, mu = torch.tensor([-2.0, -1.0, -3.0]), torch.tensor([-2.0, -2.0, -2.0])
    low = corrections(AlgorithmConfig(objective="direct", tis_cap=None, is_mask_low=1.0, is_mask_high=2.0), lp, mu)
    assert low.keep.tolist() == [True, False, False] and low.is_masked.tolist() == [False, True, True]
    high = corrections(AlgorithmConfig(objective="direct", tis_cap=None, is_mask_low=0.5, is_mask_high=1.0), lp, mu)
    assert high.keep.tolist() == [True, False, False]


def test_opsm_drops_only_negative_advantage_sequences_past_delta():
    # four one-token sequences, δ = 0.5; log μ − log π = 0.5 (on δ: kept), 1, 1, 1
    lp = torch.tensor([-1.5, -2.0, -2.0, -2.0])
    mu = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    adv = torch.tensor([-1.0, 0.0, 0.5, -1.0])  # the second and third are not negative: kept
    c = apply_corrections(AlgorithmConfig(objective="direct", tis_cap=None, opsm_delta=0.5), logprobs=lp,
                          behaviour=mu, prox=None, adv=adv, mask=torch.ones(4, dtype=torch.bool),
                          seq_index=torch.arange(4), num_seqs=4)
    assert c.keep.tolist() == [True, True, True, False] and c.opsm_dropped.tolist() == [False, False, False, True]

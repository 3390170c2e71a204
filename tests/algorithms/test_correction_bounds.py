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

"""Each aggregation mode's normaliser, and exactness of accumulation over micro-batches."""

import pytest
import torch

from tokenflow.algorithms import GlobalCounts, aggregate, token_weights

# Three sequences with 2, 3 and 1 loss tokens; a 4th token in sequence 1 is masked out.
LOSS = torch.tensor([1.0, 3.0, 2.0, 4.0, 6.0, 99.0, 5.0])
MASK = torch.tensor([True, True, True, True, True, False, True])
SEQ = torch.tensor([0, 0, 1, 1, 1, 1, 2])
T = torch.tensor([2, 3, 1])
COUNTS = GlobalCounts(num_tokens=6, num_sequences=3)


@pytest.mark.parametrize("mode,expected", [
    ("token_mean", (1 + 3 + 2 + 4 + 6 + 5) / 6),
    ("seq_mean_token_mean", ((1 + 3) / 2 + (2 + 4 + 6) / 3 + 5 / 1) / 3),
    ("seq_mean_token_sum", ((1 + 3) + (2 + 4 + 6) + 5) / 3),
    ("dr_grpo_constant", (1 + 3 + 2 + 4 + 6 + 5) / (10 * 3)),
])
def test_normalisers(mode, expected):
    w = token_weights(mode, MASK, SEQ, T, COUNTS, max_completion_tokens=10)
    assert aggregate(LOSS, w).item() == pytest.approx(expected, rel=1e-6)
    assert w[5] == 0  # the masked token


def test_masked_nan_does_not_leak():
    loss = LOSS.clone()
    loss[5] = float("nan")
    w = token_weights("token_mean", MASK, SEQ, T, COUNTS)
    assert aggregate(loss, w).item() == pytest.approx(21 / 6)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "dr_grpo_constant"])
def test_micro_batches_sum_to_the_full_batch(mode):
    full = aggregate(LOSS, token_weights(mode, MASK, SEQ, T, COUNTS, 10))
    # Split: sequences {0, 2} in one micro-batch, {1} in another; counts stay global.
    a = [0, 1, 6]
    b = [2, 3, 4, 5]
    part_a = aggregate(LOSS[a], token_weights(mode, MASK[a], torch.tensor([0, 0, 1]), torch.tensor([2, 1]),
                                              COUNTS, 10))
    part_b = aggregate(LOSS[b], token_weights(mode, MASK[b], torch.tensor([0, 0, 0, 0]), torch.tensor([3]),
                                              COUNTS, 10))
    assert (part_a + part_b).item() == pytest.approx(full.item(), rel=1e-6)


def test_dr_grpo_constant_needs_length():
    with pytest.raises(ValueError, match="max_completion_tokens"):
        token_weights("dr_grpo_constant", MASK, SEQ, T, COUNTS)

"""Aggregation at one sequence and one token (where the guards against a zero count must not
change the count), step counts that add up, per-sequence means, and dr_grpo_constant's refusal."""

import pytest
import torch

from tokenflow.algorithms import GlobalCounts, token_weights
from tokenflow.algorithms.aggregation import segment_mean, segment_sum

ONE = (torch.tensor([True]), torch.tensor([0]), torch.tensor([1]), GlobalCounts(num_tokens=1, num_sequences=1))


@pytest.mark.parametrize("mode,weight", [("token_mean", 1.0), ("seq_mean_token_mean", 1.0),
                                         ("seq_mean_token_sum", 1.0), ("dr_grpo_constant", 0.25)])
def test_one_loss_token_in_the_step_has_the_whole_weight(mode, weight):
    assert token_weights(mode, *ONE, max_completion_tokens=4).tolist() == [weight]


def test_step_counts_add_up_field_by_field():
    assert GlobalCounts(3, 1) + GlobalCounts(4, 2) == GlobalCounts(num_tokens=7, num_sequences=3)


def test_dr_grpo_constant_without_a_length_says_what_it_needs():
    with pytest.raises(ValueError) as e:
        token_weights("dr_grpo_constant", *ONE)
    assert str(e.value) == 'aggregation "dr_grpo_constant" needs max_completion_tokens'


def test_segment_means_over_masked_tokens():
    x = torch.tensor([2.0, 4.0, 7.0, 9.0, 5.0])
    mask = torch.tensor([1, 1, 1, 0, 0])
    seq = torch.tensor([0, 0, 1, 1, 2])
    # sequence 0: (2 + 4) / 2; sequence 1: 7 alone (the 9 is masked); sequence 2: no token → 0
    assert segment_mean(x, mask, seq, 3).tolist() == [3.0, 7.0, 0.0]
    assert segment_sum(x, seq, 3).tolist() == [6.0, 16.0, 5.0]

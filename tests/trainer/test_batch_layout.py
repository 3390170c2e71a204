"""The trainer's batch layout written out by hand: three small rollouts packed into two rows,
every flat tensor of the micro-batch, supports, routing, stacking rows into micro-batches, and
what `to_train_sequence` does with an empty prompt and with undefined log-probs."""

import numpy as np
import pytest
import torch

from tokenflow.rollout import Rollout
from tokenflow.trainer.batch import collate, collate_rows, micro_batches, pack, stack_rows, to_train_sequence


def seqs(routing=False):
    # a: prompt [1, 2], completion [3, 4] (reads [1, 2, 3]); b: [5] → [6, 7, 8] (reads [5, 6, 7]);
    # c: [9] → [10] (reads [9]). b's second token is 2 versions old.
    a = Rollout([1, 2], [3, 4], [-0.5, -0.25], [3, 3], temperature=0.5,
                support=[None, np.array([4, 7], dtype=np.int32)], support_logmass=[0.0, -0.125],
                routed_experts=np.arange(3 * 2 * 1).reshape(3, 2, 1) + 1 if routing else None)
    b = Rollout([5], [6, 7, 8], [-1.0, -2.0, -3.0], [3, 1, 3], loss_mask=[1, 1, 0],
                support=[np.array([6, 9], dtype=np.int32), None, None])
    c = Rollout([9], [10], [-4.0], [2], support=[np.array([10, 11, 12], dtype=np.int32)],
                routed_experts=np.array([[[8], [9]]]) if routing else None)
    return [to_train_sequence(i, r, 3, keep_sampling_mask=True, max_token_age=1) for i, r in enumerate((a, b, c))]


def test_two_rows_of_packed_sequences_flat_and_padded():
    a, b, c = seqs()
    mb = collate_rows([[a, c], [b]])
    assert mb.input_ids.tolist() == [[1, 2, 3, 9], [5, 6, 7, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 0], [0, 1, 2, 0]]  # padding restarts at 0 too
    # a's targets are predicted at row 0, columns 1, 2; c's at 3; b's at row 1, columns 0..2 (4 + 0..2)
    assert mb.target_pos.tolist() == [1, 2, 3, 4, 5, 6]
    assert mb.targets.tolist() == [3, 4, 10, 6, 7, 8]
    assert mb.seq_index.tolist() == [0, 0, 1, 2, 2, 2]
    assert mb.temperature.tolist() == [0.5, 0.5, 1.0, 1.0, 1.0, 1.0]
    # a's first token has no support: its full log-prob (−0.5 + 0); the second its truncated −0.25
    assert mb.behaviour.tolist() == [-0.5, -0.25, -4.0, -1.0, -2.0, -3.0]
    # b: the age-2 token rejected (max age 1), the environment token not a loss token
    assert mb.mask.tolist() == [True, True, True, True, False, False]
    assert mb.versions.tolist() == [3, 3, 2, 3, 1, 3]
    assert (mb.num_rows, mb.num_seqs, mb.num_tokens) == (2, 3, 7)
    assert [s.index for s in mb.seqs] == [0, 2, 1]
    per_seq = [np.array([0.1, 0.2]), np.array([1.0, 2.0, 3.0]), np.array([9.0])]
    assert mb.per_token(per_seq).tolist() == pytest.approx([0.1, 0.2, 9.0, 1.0, 2.0, 3.0])
    assert mb.per_token(per_seq).dtype == torch.float32 and mb.per_token(per_seq, torch.float64).dtype == torch.float64
    # a's second target carries a support (flat target 1, members 4 and 7), and c's (flat target 2)
    # and b's first (flat target 3)
    assert mb.support_rows.tolist() == [1, 2, 3]
    assert [p.tolist() for p in mb.support_pairs] == [[1, 1, 2, 2, 2, 3, 3], [4, 7, 10, 11, 12, 6, 9]]
    assert [p.dtype for p in mb.support_pairs] == [torch.int64, torch.int64]  # the supports are int32
    assert (mb.input_ids.dtype, mb.position_ids.dtype, mb.target_pos.dtype, mb.targets.dtype, mb.seq_index.dtype,
            mb.versions.dtype) == (torch.int64,) * 6
    assert (mb.temperature.dtype, mb.behaviour.dtype, mb.mask.dtype) == (torch.float32, torch.float32, torch.bool)
    assert mb.routing is None and mb.routing_has is None
    assert (b.num_loss_tokens, a.num_loss_tokens) == (1, 2)


def test_routing_is_laid_out_like_the_rows():
    a, b, c = seqs(routing=True)
    mb = collate_rows([[a, c], [b]])
    # a's three input positions and c's one carry their experts; b and the padding have none
    assert mb.routing_has.tolist() == [True, True, True, True, False, False, False, False]
    assert mb.routing.shape == (8, 2, 1) and mb.routing.dtype == torch.int64 and mb.routing_has.dtype == torch.bool
    assert mb.routing[:4, :, 0].tolist() == [[1, 2], [3, 4], [5, 6], [8, 9]] and mb.routing[4:].abs().sum() == 0
    # a, c, a in one row: the second a starts at 3 + 1
    row = collate([a, c, a])
    assert row.routing[:, :, 0].tolist() == [[1, 2], [3, 4], [5, 6], [8, 9], [1, 2], [3, 4], [5, 6]]


def test_rows_stack_widest_first_within_the_padded_budget():
    # widths 3, 5, 4, 2: 5 then 4 (2 × 5 = 10 fits), then 3 starts a group, 2 joins it (2 × 3 = 6)
    assert stack_rows([3, 5, 4, 2], budget=10) == [[1, 2], [0, 3]]
    assert stack_rows([3, 5, 4, 2], budget=10, max_rows=1) == [[1], [2], [0], [3]]
    assert stack_rows([2, 2, 2], budget=4) == [[0, 1], [2]]  # equal widths in index order
    assert stack_rows([2, 2, 2], budget=6, max_rows=2) == [[0, 1], [2]]


def test_pack_fills_the_first_row_with_room():
    # 6 first, then 4 into its free 4 (exactly full), the other 4 opens a row, 3 joins it
    assert pack([4, 6, 4, 3], 10) == [[0, 1], [2, 3]]
    assert pack([12, 3], 10) == [[0], [1]]  # a row over budget takes nothing more


def test_micro_batches_pack_rows_of_row_tokens_then_stack_them():
    s = seqs()  # input lengths 3, 3, 1
    # rows of 4: [a, c] and [b] (widths 4, 3); stacked, 2 × 4 = 8 fits the budget of 8
    one = micro_batches(s, 8, row_tokens=4)
    assert len(one) == 1 and one[0].input_ids.tolist() == [[1, 2, 3, 9], [5, 6, 7, 0]]
    two = micro_batches(s, 8, row_tokens=4, max_rows=1)
    assert [m.input_ids.tolist() for m in two] == [[[1, 2, 3, 9]], [[5, 6, 7]]]
    # no row_tokens: rows up to the budget, so all three in one row
    assert micro_batches(s, 8)[0].input_ids.tolist() == [[1, 2, 3, 5, 6, 7, 9]]
    assert [m.input_ids.tolist() for m in micro_batches(s, 8, packed=False)] == [[[1, 2, 3], [5, 6, 7]], [[9]]]


def test_an_empty_prompt_is_refused_by_its_index():
    with pytest.raises(ValueError) as e:
        to_train_sequence(4, Rollout([], [3], [0.0], [0]), 0, keep_sampling_mask=False, max_token_age=None)
    assert str(e.value) == "rollout 4 has an empty prompt; the first completion token needs at least one token before it"


def test_undefined_log_probs_become_zero_only_where_the_token_is_not_kept():
    r = Rollout([1], [2, 3, 4], [np.nan, np.nan, np.nan], [0, 0, 5], loss_mask=[1, 0, 1])
    s = to_train_sequence(0, r, 5, keep_sampling_mask=False, max_token_age=2)
    # kept: the last (age 0) only; the first is too old (age 5), the second an environment token
    assert s.keep.tolist() == [False, False, True]
    assert s.behaviour[:2].tolist() == [0.0, 0.0] and np.isnan(s.behaviour[2])
    assert s.behaviour.dtype == np.float32 and s.loss_mask.dtype == bool
    assert s.input_ids.tolist() == [1, 2, 3] and s.prompt_len == 1 and type(s.temperature) is float


def test_every_tensor_goes_to_the_device_asked_for():
    # the meta device: placement is checked without a GPU
    a, b, c = seqs(routing=True)
    for mb in (collate_rows([[a, c], [b]], device="meta"), collate([a, b, c], device="meta"),
               micro_batches([a, b, c], 8, device="meta")[0]):
        tensors = [v for v in vars(mb).values() if isinstance(v, torch.Tensor)] + list(mb.support_pairs)
        assert len(tensors) == 14 and {t.device.type for t in tensors} == {"meta"}
        assert mb.per_token([np.ones(2), np.ones(3), np.ones(1)]).device.type == "meta"

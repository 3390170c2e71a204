"""Packing, temperature and the Keep Sampling Mask give exactly the per-sequence log-probs."""

import numpy as np
import pytest
import torch

from tokenflow.algorithms import AlgorithmConfig
from tokenflow.rollout import Rollout
from tokenflow.trainer import Trainer, TrainerConfig
from tokenflow.trainer.batch import collate, micro_batches, pack, to_train_sequence
from tests.trainer.trainer_testlib import VOCAB, make_rollouts, reference_logprobs, tiny_model


def test_pack_first_fit_respects_budget():
    lengths = [5, 9, 3, 12, 4, 4, 1]
    rows = pack(lengths, 10)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    for r in rows:
        assert sum(lengths[i] for i in r) <= 10 or len(r) == 1
    assert [3] in rows  # longer than the budget: alone
    # First-fit decreasing: 12 | 9+1 | 5+4 | 4+3.
    assert sorted(map(sorted, rows)) == [[0, 4], [1, 6], [2, 5], [3]]
    assert pack(lengths, 10, packed=False) == [[i] for i in range(len(lengths))]


def test_collate_positions_restart_and_targets_line_up():
    rs = make_rollouts(groups=1, per_group=3)
    seqs = [to_train_sequence(i, r, 0, keep_sampling_mask=True, max_token_age=None) for i, r in enumerate(rs)]
    mb = collate(seqs)
    ids, pos = mb.input_ids[0].numpy(), mb.position_ids[0].numpy()
    assert (pos == 0).sum() == 3 and len(ids) == sum(r.num_tokens + len(r.prompt_ids) - 1 for r in rs)
    # The token at target_pos + 1 is the target itself (except after each sequence's end).
    for k, s in enumerate(seqs):
        tp = mb.target_pos[mb.seq_index == k].numpy()
        assert (ids[tp[1:]] == s.targets[:-1]).all()
        assert pos[tp[0]] == s.prompt_len - 1


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_packed_logprobs_equal_unpacked(temperature):
    model = tiny_model()
    rs = make_rollouts(seed=3, temperature=temperature)
    expected = [reference_logprobs(model, r) for r in rs]
    packed = Trainer(model, TrainerConfig(device="cpu", micro_batch_tokens=64), AlgorithmConfig())
    alone = Trainer(model, TrainerConfig(device="cpu", pack_sequences=False), AlgorithmConfig())
    got_packed, got_alone = packed.logprobs(rs), alone.logprobs(rs)
    assert len(micro_batches(packed._sequences(rs), 64)) < len(rs) / 2  # really packed
    for e, a, b in zip(expected, got_packed, got_alone):
        np.testing.assert_allclose(a, e, atol=1e-5)
        np.testing.assert_allclose(b, e, atol=1e-5)


def test_greedy_temperature_is_one():
    model = tiny_model()
    rs = make_rollouts(seed=4, temperature=0.0)
    rs1 = make_rollouts(seed=4, temperature=1.0)
    tr = Trainer(model, TrainerConfig(device="cpu"), AlgorithmConfig())
    for a, b in zip(tr.logprobs(rs), tr.logprobs(rs1)):
        np.testing.assert_array_equal(a, b)


def test_keep_sampling_mask_renormalises_over_the_support():
    model = tiny_model()
    rng = np.random.default_rng(5)
    c = 6
    completion = rng.integers(0, VOCAB, c)
    support = []
    for t in range(c):
        if t % 2:
            support.append(None)
        else:
            s = np.unique(np.concatenate([rng.choice(VOCAB, 10, replace=False), [completion[t]]]))
            support.append(np.sort(s).astype(np.int32))
    r = Rollout(prompt_ids=[3, 4, 5], completion_ids=completion, logprobs=np.zeros(c), versions=np.zeros(c),
                support=support, temperature=0.8)
    full = reference_logprobs(model, r)
    # Expected: log p(a) − log Σ_{s∈S} p(s), with p the full tempered softmax.
    ids = torch.tensor(np.concatenate([r.prompt_ids, completion]))[None]
    with torch.no_grad():
        logp_all = torch.log_softmax(model(input_ids=ids).logits[0, 2:2 + c].double() / 0.8, -1)
    expected = full.astype(np.float64).copy()
    for t, s in enumerate(support):
        if s is not None:
            expected[t] -= torch.logsumexp(logp_all[t, torch.as_tensor(s, dtype=torch.long)], 0).item()
    on = Trainer(model, TrainerConfig(device="cpu"), AlgorithmConfig(keep_sampling_mask=True)).logprobs([r])[0]
    off = Trainer(model, TrainerConfig(device="cpu"), AlgorithmConfig(keep_sampling_mask=False)).logprobs([r])[0]
    np.testing.assert_allclose(on, expected, atol=1e-5)
    np.testing.assert_allclose(off, full, atol=1e-5)
    assert (on[::2] > off[::2] + 1e-3).all()  # truncation raised every masked token's log-prob
    np.testing.assert_array_equal(on[1::2], off[1::2])


def test_token_outside_its_support_is_refused():
    r = Rollout(prompt_ids=[1], completion_ids=[7, 8], logprobs=[0, 0], versions=[0, 0],
                support=[np.array([1, 2]), None])
    with pytest.raises(ValueError, match="not in its recorded sampling support"):
        to_train_sequence(0, r, 0, keep_sampling_mask=True, max_token_age=None)


def test_behaviour_logprob_choice_follows_the_mask():
    # With a support recorded the truncated log-prob is compared; without, the full one.
    r = Rollout(prompt_ids=[1], completion_ids=[7, 8], logprobs=[-1.0, -2.0], versions=[0, 0],
                support_logmass=[-0.5, 0.0], support=[np.array([7, 9]), None])
    on = to_train_sequence(0, r, 0, keep_sampling_mask=True, max_token_age=None)
    off = to_train_sequence(0, r, 0, keep_sampling_mask=False, max_token_age=None)
    assert on.behaviour.tolist() == [-1.0, -2.0]
    assert off.behaviour.tolist() == [-1.5, -2.0]

"""``trainer.share_prompts``: a group's samples in one row that holds their prompt once give each
sample's own log-probs and the same gradients, in fewer forwarded tokens; models whose attention
cannot take the mask train unshared, and the trainer says so."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from tests.trainer.test_skip_zero_advantage import assert_same_gradients
from tests.trainer.trainer_testlib import make_rollouts, on_policy, reference_logprobs, tiny_model
from tokenflow.algorithms import AlgorithmConfig
from tokenflow.trainer import Trainer, TrainerConfig
from tokenflow.trainer.batch import micro_batches, prompt_units, to_train_sequence
from tokenflow.trainer.shared_prompts import unit_width


def _seqs(rollouts):
    return [to_train_sequence(i, r, 0, keep_sampling_mask=True, max_token_age=None) for i, r in enumerate(rollouts)]


def _model(impl: str, seed: int = 0):
    model = tiny_model(seed)
    model.config._attn_implementation = impl
    return model


def test_units_hold_each_prompt_once_within_the_row_budget():
    rollouts = make_rollouts(seed=1, groups=3, per_group=6, same_prompt=True, max_prompt=6)
    rollouts += make_rollouts(seed=2, groups=2, per_group=1)  # prompts of their own
    seqs = _seqs(rollouts)
    budget = 30
    units = prompt_units(seqs, budget)
    assert sorted(i for u in units for i in u) == list(range(len(seqs)))
    for u in units:
        members = [seqs[i] for i in u]
        assert len({s.input_ids[:s.prompt_len].tobytes() for s in members}) == 1
        assert unit_width(members) <= budget or len(u) == 1
    # every group of six shares: fewer units than sequences, each group's units cover it
    assert len(units) < len(seqs) - 4
    assert all(len(u) == 1 for u in units if seqs[u[0]].index >= 18)
    # a sequence with a routing record (Keep Routing) is never shared
    seqs[0].routing = np.zeros((len(seqs[0].input_ids), 1, 1), dtype=np.int64)
    assert [0] in prompt_units(seqs, budget)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "a unit per row"])
def test_shared_rows_give_each_samples_own_logprobs(impl, packed):
    model = _model(impl)
    rollouts = make_rollouts(seed=3, groups=3, per_group=5, same_prompt=True, temperature=0.8)
    expected = [reference_logprobs(model, r) for r in rollouts]
    trainer = Trainer(model, TrainerConfig(device="cpu", micro_batch_tokens=64, pack_sequences=packed),
                      AlgorithmConfig())
    mbs = trainer.batcher(trainer._sequences(rollouts))
    assert any(mb.attention_mask is not None for mb in mbs)
    assert sum(mb.num_tokens for mb in mbs) + sum(mb.shared_tokens for mb in mbs) == \
        sum(len(r.prompt_ids) + r.num_tokens - 1 for r in rollouts)
    assert sum(mb.shared_tokens for mb in mbs) > 0
    for e, got in zip(expected, trainer.logprobs(rollouts)):
        np.testing.assert_allclose(got, e, atol=1e-5)  # float32 rounding, as in test_packing


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_shared_rows_give_the_same_gradients(impl):
    rollouts = on_policy(tiny_model(seed=11), make_rollouts(seed=7, groups=4, per_group=4, same_prompt=True))
    grads, metrics = {}, {}
    for share in (True, False):
        trainer = Trainer(_model(impl, seed=2), TrainerConfig(device="cpu", lr=1e-3, micro_batch_tokens=48,
                                                               share_prompts=share), AlgorithmConfig())
        step = trainer.stepper.optimizer_step

        def capture(*args, _t=trainer, _share=share):
            grads[_share] = {n: p.grad.clone() for n, p in _t.model.named_parameters() if p.grad is not None}
            return step(*args)

        trainer.stepper.optimizer_step = capture
        metrics[share] = trainer.train_step(rollouts)
    assert metrics[True]["perf/shared_prompt_tokens"] > 0 and metrics[False]["perf/shared_prompt_tokens"] == 0
    assert metrics[True]["perf/train_tokens"] < metrics[False]["perf/train_tokens"]
    assert_same_gradients(grads[True], grads[False])


def test_under_bfloat16_autocast_shared_rows_round_like_separate_ones():
    """Both paths compute the same sums with bfloat16 roundings of the products, in other
    shapes: each is within that rounding of the float64 log-probs, so the shared path's error is
    bounded by twice the separate rows' (measured: equal, 9.8e-4 on this batch and 1.1-1.4e-3 on
    three others; a mask that let samples see each other gives errors of whole nats)."""
    model = _model("eager")
    rollouts = make_rollouts(seed=4, groups=3, per_group=6, same_prompt=True)
    truth = [reference_logprobs(model.double(), r) for r in rollouts]
    model.float()
    errs = {}
    for share in (True, False):
        trainer = Trainer(model, TrainerConfig(device="cpu", dtype="bfloat16", micro_batch_tokens=64,
                                               share_prompts=share), AlgorithmConfig())
        errs[share] = max(np.abs(g - t).max() for g, t in zip(trainer.logprobs(rollouts), truth))
    assert 0 < errs[True] <= 2 * errs[False], errs


def test_a_model_whose_attention_cannot_take_the_mask_trains_unshared(caplog):
    model = tiny_model(seed=2)
    model.config.sliding_window = 4  # as a Mistral-style config declares it
    with caplog.at_level(logging.INFO, logger="tokenflow.trainer.trainer"):
        trainer = Trainer(model, TrainerConfig(device="cpu", micro_batch_tokens=64), AlgorithmConfig())
    assert "trainer.share_prompts: off (the model uses sliding-window attention)" in caplog.text
    rollouts = on_policy(model, make_rollouts(seed=5, groups=2, per_group=4, same_prompt=True))
    m = trainer.train_step(rollouts)
    assert m["perf/shared_prompt_tokens"] == 0 and m["offpolicy/mismatch_abs_logprob"] < 1e-5


def test_shared_rows_keep_targets_at_their_positions():
    """The first target of every sample is predicted at the shared prompt's last token; each
    later target at the position of the token before it in its own tail."""
    rollouts = make_rollouts(seed=6, groups=1, per_group=3, same_prompt=True, max_completion=6)
    seqs = _seqs(rollouts)
    (mb,) = micro_batches(seqs, 256, share_prompts=True)
    ids, pos = mb.input_ids[0], mb.position_ids[0]
    prompt = seqs[0].prompt_len
    for k, s in enumerate(seqs):
        where = mb.target_pos[mb.seq_index == k]
        assert where[0] == prompt - 1 and pos[where[0]] == prompt - 1
        assert (ids[where[1:]] == torch.from_numpy(s.targets[:-1])).all()
        assert (pos[where] == torch.arange(len(s.targets)) + prompt - 1).all()

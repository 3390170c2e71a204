"""Prompt log-probs (``SamplingParams.prompt_logprobs``) against transformers, inside a batch of
requests that do not ask for them, and what they cost a parked continuation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.engine.engine_testlib import FAMILIES, hf_logits, hf_model, make_engine
from tokenflow import rollout_files
from tokenflow.engine import InvalidRequest, SamplingParams

LOGIT_BOUND = 1e-4
"""The engine's logits against transformers' on these tiny float32 models (`test_parity`)."""
LP_BOUND = 2 * LOGIT_BOUND
"""A log-softmax moves at most twice its inputs' largest error: |Δ(z_i − logsumexp z)| ≤
|Δz_i| + max |Δz|."""


def _reference(hf, prompt: list[int]) -> torch.Tensor:
    """transformers' log-probs at prompt positions 1.., [P - 1, V] (float64)."""
    return torch.log_softmax(hf_logits(hf, prompt[:1], prompt[1:]).double(), -1)


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_logprobs_match_transformers(family):
    hf = hf_model(family, seed=5)
    engine = make_engine(hf, max_num_seqs=4)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (9, 4, 23, 2)]
    params = [SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, prompt_logprobs=0),
              SamplingParams(temperature=1.0, max_tokens=5, ignore_eos=True, seed=1),  # not asked
              SamplingParams(temperature=0.8, n=2, max_tokens=4, ignore_eos=True, seed=2, prompt_logprobs=5),
              SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, prompt_logprobs=3)]
    results = engine.generate(prompts, params)
    assert results[1][0].prompt_logprobs is None and results[1][0].prompt_top_ids is None
    for prompt, sp, group in zip(prompts, params, results):
        if sp.prompt_logprobs is None:
            continue
        ref = _reference(hf, prompt)
        want = ref.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0].numpy()
        for r in group:
            lp = r.prompt_logprobs
            assert lp.shape == (len(prompt),) and np.isnan(lp[0])
            assert np.abs(lp[1:] - want).max() <= LP_BOUND
            np.testing.assert_array_equal(lp, group[0].prompt_logprobs)  # the n samples share one prefill
            if not sp.prompt_logprobs:
                assert r.prompt_top_ids is None
                continue
            k = sp.prompt_logprobs
            assert r.prompt_top_ids.shape == (len(prompt), k) and (r.prompt_top_ids[0] == -1).all()
            values, ids = ref.topk(k + 1, -1)
            assert np.abs(r.prompt_top_logprobs[1:] - values[:, :k].numpy()).max() <= LP_BOUND
            # The ranking is transformers' wherever neighbours are further apart than both errors.
            sure = (values[:, :k] - values[:, 1:k + 1]).min(-1).values > 2 * LP_BOUND
            assert (r.prompt_top_ids[1:][sure.numpy()] == ids[:, :k][sure].numpy()).all()
    # and they travel with the rollout as data
    back = rollout_files.decode(rollout_files.encode([results[2][1]]))[0]
    np.testing.assert_array_equal(back.prompt_top_ids, results[2][1].prompt_top_ids)
    np.testing.assert_array_equal(back.prompt_logprobs, results[2][1].prompt_logprobs)


def test_a_parked_continuation_that_asks_prefills_its_prompt_again():
    hf = hf_model("llama", seed=6)
    engine = make_engine(hf)
    first = SamplingParams(temperature=1.0, max_tokens=4, seed=3, ignore_eos=True, park_kv=True)
    prompt = list(range(10, 22))
    engine.add_request(prompt, first, request_id="ep")
    (r,) = list(engine.stream())
    r = r.append_environment([5, 6])
    params = dataclasses.replace(first, max_tokens=r.num_tokens + 3, prompt_logprobs=2)
    engine.add_request(prompt, params, resume=r)
    (out,) = list(engine.stream())
    assert engine.stats.parked_hits == 0  # the parked rows have no logits: not used
    want = _reference(hf, prompt).gather(1, torch.tensor(prompt[1:])[:, None])[:, 0].numpy()
    assert np.abs(out.prompt_logprobs[1:] - want).max() <= LP_BOUND
    assert out.prompt_top_ids.shape == (len(prompt), 2)


def test_prompt_logprobs_are_validated():
    engine = make_engine(hf_model("llama"))
    with pytest.raises(InvalidRequest, match="prompt_logprobs"):
        engine.add_request([1, 2, 3], SamplingParams(prompt_logprobs=-1))
    with pytest.raises(InvalidRequest, match="prompt_logprobs"):
        engine.add_request([1, 2, 3], SamplingParams(prompt_logprobs=engine.vocab_size + 1))

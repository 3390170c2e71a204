"""The vLLM backend on smollm2-135m-instruct, against transformers (float32): per-token log-probs
within the derived float32 bound and greedy tokens that are transformers' argmax, through the chat
template; then one weight update, after which the tokens carry the new version and follow the new
weights. Runs in the vLLM environment (.ci/run); skipped where vLLM is not installed."""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest
import torch

from tests.real_model.real_testlib import QUESTIONS, chat_ids, float32_bounds, hf_logprobs

pytestmark = [pytest.mark.real_model, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vLLM is not installed here; .ci/run runs this file in its vLLM environment")]


@pytest.fixture(scope="module")
def vllm_engine(smollm2):
    from tokenflow.engine import EngineConfig
    from tokenflow.engine.factory import make_engine

    engine = make_engine(smollm2, EngineConfig(backend="vllm", device="cpu", dtype="float32", max_num_seqs=16,
                                               seed=0))
    yield engine
    engine.close()


def _check(hf, prompt, r, what: str) -> dict:
    """Log-probs within the float32 bounds; each greedy token is transformers' argmax wherever
    transformers' top two logits are further apart than the two implementations can differ (a
    near-tie may go either way: counted, not failed)."""
    ref_logits, ref_lp = hf_logprobs(hf, prompt, r.completion_ids)
    max_bound, rms_bound = float32_bounds(hf, ref_logits)
    diff = np.abs(np.asarray(r.logprobs) - ref_lp.numpy())
    assert diff.max() <= max_bound, (what, diff.max(), max_bound)
    assert np.sqrt((diff ** 2).mean()) <= rms_bound, (what, np.sqrt((diff ** 2).mean()), rms_bound)
    top2 = ref_logits.topk(2, -1).values
    clear = (top2[:, 0] - top2[:, 1]) > max_bound  # logits differ by at most max_bound / 2 each way
    ids = torch.as_tensor(np.asarray(r.completion_ids))
    argmax = ref_logits.argmax(-1)
    assert (ids[clear] == argmax[clear]).all(), what
    return {"lp": float(diff.max()), "rms": float(np.sqrt((diff ** 2).mean())), "bound": max_bound,
            "ties": int((~clear).sum()), "same": bool((ids == argmax).all())}


def test_vllm_greedy_logprobs_match_transformers(vllm_engine, hf_smollm2, tokenizer):
    from tokenflow.engine import SamplingParams

    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS]
    groups = vllm_engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
    reports = []
    for prompt, (r,) in zip(prompts, groups):
        assert r.num_tokens == 64 and set(np.asarray(r.versions).tolist()) == {0}
        reports.append(_check(hf_smollm2, prompt, r, "greedy"))
    assert tokenizer.decode(groups[0][0].completion_ids).startswith("17 + 25 = 32")
    print(f"vLLM, 8 prompts x 64 greedy tokens: max |Δ logprob| {max(x['lp'] for x in reports):.2e} "
          f"(RMS {max(x['rms'] for x in reports):.2e}); bound {reports[0]['bound']:.2e}; "
          f"near-ties {sum(x['ties'] for x in reports)}; all argmax: {all(x['same'] for x in reports)}")


def test_vllm_weight_update_tags_and_follows_the_new_weights(vllm_engine, hf_smollm2, tokenizer):
    from tokenflow.engine import SamplingParams

    gen = torch.Generator().manual_seed(0)
    perturbed = copy.deepcopy(hf_smollm2)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.mul_(1 + 0.05 * torch.randn(p.shape, generator=gen))
    report = vllm_engine.update_weights(perturbed.state_dict(), version=1)
    assert report["applied"] and vllm_engine.version == 1
    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS[:3]]
    groups = vllm_engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    for prompt, (r,) in zip(prompts, groups):
        assert set(np.asarray(r.versions).tolist()) == {1}
        _check(perturbed, prompt, r, "after the update")
    # and not the old model: its log-probs of the same tokens are far outside the bound
    ref_logits, old_lp = hf_logprobs(hf_smollm2, prompts[0], groups[0][0].completion_ids)
    assert np.abs(np.asarray(groups[0][0].logprobs) - old_lp.numpy()).max() > float32_bounds(hf_smollm2, ref_logits)[0]

"""Prompt log-probs of the built-in engine against transformers on smollm2-135m-instruct, within
the derived float32 bound of `real_testlib.float32_bounds`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.real_model.real_testlib import QUESTIONS, chat_ids, float32_bounds, hf_logprobs
from tokenflow.engine import SamplingParams

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


def test_prompt_logprobs_match_transformers(engine, hf_smollm2, tokenizer):
    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS[:4]]
    prompts.append(tokenizer("The capital of France is Paris. The capital of Italy is Rome.")["input_ids"])
    groups = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3))
    worst, rms = 0.0, 0.0
    for prompt, (r,) in zip(prompts, groups):
        ref_logits, ref_lp = hf_logprobs(hf_smollm2, prompt[:1], prompt[1:])
        max_bound, rms_bound = float32_bounds(hf_smollm2, ref_logits)
        diff = np.abs(r.prompt_logprobs[1:] - ref_lp.numpy())
        assert np.isnan(r.prompt_logprobs[0])
        assert diff.max() <= max_bound and np.sqrt((diff ** 2).mean()) <= rms_bound, (diff.max(), max_bound)
        values, ids = torch.log_softmax(ref_logits.double(), -1).topk(4, -1)
        assert np.abs(r.prompt_top_logprobs[1:] - values[:, :3].numpy()).max() <= max_bound
        sure = (values[:, :3] - values[:, 1:]).min(-1).values > 2 * max_bound
        assert (r.prompt_top_ids[1:][sure.numpy()] == ids[:, :3][sure].numpy()).all()
        worst, rms = max(worst, float(diff.max())), max(rms, float(np.sqrt((diff ** 2).mean())))
    print(f"prompt log-probs, {sum(len(p) - 1 for p in prompts)} tokens: max |Δ| {worst:.2e} "
          f"(RMS {rms:.2e}); bound {max_bound:.2e}")

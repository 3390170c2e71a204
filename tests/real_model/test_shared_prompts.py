"""``trainer.share_prompts`` on SmolLM2: a group of sampled chat completions in rows that hold
their prompt once gets transformers' per-sequence log-probs within the derived float32 bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.real_model.real_testlib import QUESTIONS, chat_ids, float32_bounds, hf_logprobs
from tokenflow.rollout import Rollout
from tokenflow.trainer.batch import micro_batches, to_train_sequence
from tokenflow.trainer.model.runner import CausalLMRunner

pytestmark = pytest.mark.real_model


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_shared_rows_score_a_sampled_group_as_transformers(hf_smollm2, tokenizer, impl, monkeypatch):
    monkeypatch.setattr(hf_smollm2.config, "_attn_implementation", impl)
    torch.manual_seed(0)
    rollouts = []
    for g, q in enumerate(QUESTIONS[:2]):
        prompt = chat_ids(tokenizer, q)
        with torch.no_grad():
            out = hf_smollm2.generate(torch.tensor([prompt] * 4), attention_mask=torch.ones(4, len(prompt), dtype=torch.long),
                                      max_new_tokens=20, do_sample=True, temperature=1.0, top_k=0,
                                      pad_token_id=tokenizer.pad_token_id)
        for k in range(4):
            completion = np.array([t for t in out[k, len(prompt):].tolist() if t != tokenizer.pad_token_id][:20] or [0])
            rollouts.append(Rollout(prompt_ids=np.array(prompt), completion_ids=completion,
                                    logprobs=np.zeros(len(completion)), versions=np.zeros(len(completion)),
                                    group_id=g, sample_index=k))
    seqs = [to_train_sequence(i, r, 0, keep_sampling_mask=True, max_token_age=None) for i, r in enumerate(rollouts)]
    runner = CausalLMRunner(hf_smollm2, torch.device("cpu"), "float32")
    assert runner.sharing_blocker is None
    mbs = micro_batches(seqs, 4096, share_prompts=True)
    assert sum(mb.shared_tokens for mb in mbs) == sum(3 * len(r.prompt_ids) for r in rollouts[::4])
    got: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for mb in mbs:
            logp, _, _ = runner.logprobs(mb, None, chunk=4096, with_entropy=False)
            for k, s in enumerate(mb.seqs):
                got[s.index] = logp[mb.seq_index == k].double()
    worst = 0.0
    for i, r in enumerate(rollouts):
        logits, lp = hf_logprobs(hf_smollm2, r.prompt_ids.tolist(), r.completion_ids.tolist())
        bound, rms_bound = float32_bounds(hf_smollm2, logits)
        diff = (got[i] - lp).abs()
        assert diff.max().item() <= bound and diff.square().mean().sqrt().item() <= rms_bound, (i, diff.max().item())
        worst = max(worst, diff.max().item())
    print(f"shared rows vs per-sequence log-probs ({impl}): max {worst:.2e}; bound {bound:.2e}")

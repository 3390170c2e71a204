"""``trainer.compile_layers`` on SmolLM2: the compiled decoder layers' log-probs of real chat
completions are transformers' eager ones within the derived float32 bound."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.real_model.real_testlib import QUESTIONS, chat_ids, float32_bounds, hf_logprobs
from tokenflow.trainer.model.compiled import compile_layers

pytestmark = pytest.mark.real_model


def test_compiled_layers_score_real_completions_as_transformers(hf_smollm2, tokenizer):
    torch._dynamo.reset()
    compiled = copy.deepcopy(hf_smollm2)
    assert compile_layers(compiled, torch.device("cpu")) == hf_smollm2.config.num_hidden_layers
    worst = rms_worst = 0.0
    for q in QUESTIONS[:4]:
        prompt = chat_ids(tokenizer, q)
        with torch.no_grad():
            out = hf_smollm2.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                      max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        completion = out[0, len(prompt):].tolist()
        logits, lp = hf_logprobs(hf_smollm2, prompt, completion)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        _, lp_compiled = hf_logprobs(compiled, prompt, completion)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= max(graphs, 1)  # compiled ran
        bound, rms_bound = float32_bounds(hf_smollm2, logits)
        diff = (lp_compiled - lp).abs()
        assert diff.max().item() <= bound and diff.square().mean().sqrt().item() <= rms_bound
        worst, rms_worst = max(worst, diff.max().item()), max(rms_worst, diff.square().mean().sqrt().item())
    print(f"compiled vs eager log-probs: max {worst:.2e} (RMS {rms_worst:.2e}); bound {bound:.2e}")
    torch._dynamo.reset()

"""Tiny local models and rollout batches for trainer tests (nothing is downloaded)."""

import numpy as np
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from tokenflow.rollout import Rollout

VOCAB = 97


def tiny_model(seed: int = 0, tie: bool = False):
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128,
                      tie_word_embeddings=tie)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")


@torch.no_grad()
def reference_logprobs(model, r: Rollout, support=None) -> np.ndarray:
    """Per-token log-probs of one rollout, unpacked, straight from the model's logits."""
    ids = torch.tensor(np.concatenate([r.prompt_ids, r.completion_ids]))[None]
    logits = model(input_ids=ids, use_cache=False).logits[0].double()
    p = len(r.prompt_ids)
    z = logits[p - 1:p - 1 + r.num_tokens] / (r.temperature if r.temperature > 0 else 1.0)
    if support is not None:
        for t, s in enumerate(support):
            if s is not None:
                keep = torch.zeros(z.shape[-1], dtype=torch.bool)
                keep[torch.as_tensor(s)] = True
                z[t] = z[t].masked_fill(~keep, float("-inf"))
    lp = torch.log_softmax(z, -1)
    return lp.gather(-1, torch.as_tensor(r.completion_ids, dtype=torch.long)[:, None])[:, 0].float().numpy()


def make_rollouts(seed: int = 0, groups: int = 3, per_group: int = 4, max_prompt: int = 8,
                  max_completion: int = 12, temperature: float = 1.0, version: int = 0,
                  same_prompt: bool = False) -> list[Rollout]:
    """Random rollouts; ``same_prompt``: a group's samples share their prompt, as in GRPO."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        shared = rng.integers(0, VOCAB, int(rng.integers(1, max_prompt))) if same_prompt else None
        for k in range(per_group):
            p, c = int(rng.integers(1, max_prompt)), int(rng.integers(1, max_completion))
            mask = (rng.random(c) > 0.2).astype(np.int8)
            mask[0] = 1
            prompt = shared if shared is not None else rng.integers(0, VOCAB, p)
            out.append(Rollout(prompt_ids=prompt, completion_ids=rng.integers(0, VOCAB, c),
                               logprobs=np.zeros(c), versions=np.full(c, version), loss_mask=mask,
                               group_id=g, sample_index=k, reward=float(rng.integers(0, 2) + 0.1 * k),
                               temperature=temperature))
    return out


def on_policy(model, rollouts: list[Rollout]) -> list[Rollout]:
    """Fill behaviour log-probs from the given weights (the engine's view on the same version)."""
    for r in rollouts:
        r.logprobs = reference_logprobs(model, r, r.support)
    return rollouts

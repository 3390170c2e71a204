"""Tiny random mixture-of-experts models of each supported family, built locally."""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModelForCausalLM, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

from tests.engine.engine_testlib import randomize

VOCAB = 128
_COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
           "tie_word_embeddings": False}

MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral")


# vLLM's CPU attention needs heads of at least 32 (the configs below use 16 and 24).
VLLM_HEADS = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}


def moe_config(family: str, **overrides):
    """A small config per family, each exercising what sets it apart."""
    cfg = _family_config(family)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def _family_config(family: str):
    if family == "qwen3_moe":  # q/k norm; a dense layer in the middle (mlp_only_layers); no top-k renorm
        return Qwen3MoeConfig(**_COMMON, num_hidden_layers=3, head_dim=24, intermediate_size=96,
                              moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                              norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1])
    if family == "qwen2_moe":  # shared expert with sigmoid gate; every 2nd layer sparse; renormalised
        return Qwen2MoeConfig(**_COMMON, num_hidden_layers=4, intermediate_size=96, moe_intermediate_size=32,
                              shared_expert_intermediate_size=48, num_experts=6, num_experts_per_tok=3,
                              norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[])
    if family == "mixtral":  # every layer sparse, always renormalised, windowed attention
        return MixtralConfig(**_COMMON, num_hidden_layers=2, intermediate_size=32, num_local_experts=4,
                             num_experts_per_tok=2, sliding_window=8)
    raise KeyError(family)


def moe_hf_model(family: str, seed: int = 0, overrides: dict | None = None, **kwargs):
    """transformers' model with every weight re-drawn, routers included (transformers zero-inits
    some routers, which would make every top-k a tie)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(moe_config(family, **(overrides or {})), **kwargs).eval()
    return randomize(model, seed)


@torch.no_grad()
def router_scores(hf, ids: list[int]) -> np.ndarray:
    """transformers' router probabilities (float32 softmax) per position and sparse layer,
    [len(ids), layers, experts]."""
    out = hf(torch.tensor([ids]), output_router_logits=True)
    return np.stack([torch.softmax(r.float(), -1).numpy() for r in out.router_logits], axis=1)


def hf_routing(hf, ids: list[int]) -> np.ndarray:
    """transformers' own top-k experts per position and sparse layer, [len(ids), layers, k]."""
    scores = torch.from_numpy(router_scores(hf, ids))
    return torch.topk(scores, hf.config.num_experts_per_tok, -1).indices.numpy()


def experts_used(trainer, rollout) -> np.ndarray:
    """The expert ids the trainer's sparse blocks actually computed for each input token of
    ``rollout`` (whatever routed them: its own routers or a replayed record)."""
    seen: list[torch.Tensor] = []
    blocks = [m.experts for m in trainer.model.modules() if hasattr(m, "experts") and hasattr(m, "gate")]
    handles = [b.register_forward_pre_hook(lambda _m, args: seen.append(args[1].clone())) for b in blocks]
    try:
        trainer.logprobs([rollout])
    finally:
        for h in handles:
            h.remove()
    return torch.stack(seen, dim=1).numpy()

"""Shared helpers of the engine tests: tiny random models of each family, built locally."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from tokenflow.engine import Engine, EngineConfig

VOCAB = 128
_COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
           "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def family_config(family: str):
    """A small config per family, each exercising what sets it apart."""
    if family == "llama":  # scaled RoPE (llama3), biases on attention, untied head
        return LlamaConfig(**_COMMON, attention_bias=True, tie_word_embeddings=False,
                           rope_parameters={"rope_type": "llama3", "rope_theta": 50000.0, "factor": 4.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 32})
    if family == "qwen2":  # q/k/v biases, tied embeddings; layer 0 full, layer 1 windowed (8)
        return Qwen2Config(**_COMMON, tie_word_embeddings=True, use_sliding_window=True, sliding_window=8,
                           max_window_layers=1, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    if family == "qwen3":  # q/k norm, head_dim != hidden / heads
        return Qwen3Config(**_COMMON, head_dim=24, tie_word_embeddings=False)
    if family == "mistral":  # every layer windowed (8, far shorter than the contexts used), no GQA
        cfg = {**_COMMON, "num_key_value_heads": 4}
        return MistralConfig(**cfg, sliding_window=8, tie_word_embeddings=False)
    raise KeyError(family)


FAMILIES = ("llama", "qwen2", "qwen3", "mistral")

U32 = 2.0**-24  # float32's unit roundoff


def float32_product_bound(x: torch.Tensor, weight: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """How far two float32 computations of ``x @ weight.T (+ bias)`` may differ, elementwise, when
    they sum in different orders: 2·γ_k·Σ|w·x| for a length-k dot product (γ_k = k·u / (1 − k·u)),
    plus one rounding of the bias sum on each side (``want`` is either result)."""
    k = x.shape[-1]
    gamma = k * U32 / (1 - k * U32)
    return 2 * gamma * (x.abs() @ weight.abs().T) + 2 * U32 * want.abs()


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int, std: float = 0.3) -> torch.nn.Module:
    """Weights large enough that logits are peaked (transformers' init gives near-uniform ones)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen)
        if "norm" in name:
            p.copy_(1 + 0.2 * noise)
        elif name.endswith("bias"):
            p.copy_(0.2 * noise)
        else:
            p.copy_(std * noise)
    return model


def hf_model(family: str, seed: int = 0):
    torch.manual_seed(seed)
    return randomize(AutoModelForCausalLM.from_config(family_config(family)).eval(), seed)


def make_engine(hf, **config) -> Engine:
    config.setdefault("device", "cpu")
    config.setdefault("threads", None)
    return Engine.from_config(hf.config, hf.state_dict(), EngineConfig(**config))


@torch.no_grad()
def hf_logits(hf, prompt, completion) -> torch.Tensor:
    """transformers' logits at the positions that produced each completion token, [T, V]."""
    ids = torch.tensor([list(prompt) + list(completion)])
    logits = hf(ids).logits[0].float()
    start = len(prompt) - 1
    return logits[start:start + len(completion)]


class LogitsRecorder:
    """Engine logits hook: the logits each sample's tokens were drawn from, in order."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], list[torch.Tensor]] = {}
        self.kinds: list[tuple[str, int]] = []

    def __call__(self, kind, seqs, logits) -> None:
        self.kinds.append((kind, len(seqs)))
        for i, seq in enumerate(seqs):
            self.rows.setdefault((seq.request_id, seq.sample_index), []).append(logits[i].clone())

    def of(self, rollout) -> torch.Tensor:
        return torch.stack(self.rows[(rollout.request_id, rollout.sample_index)])

"""Qwen3: Llama with RMSNorm on each query and key head (q_norm/k_norm) and explicit head_dim."""

from __future__ import annotations

import torch

from tokenflow.engine.builtin.models.llama import (
    ArchFlags,
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    LlamaRMSNorm,
    head_dim_of,
    layer_types_window,
)
from tokenflow.engine.builtin.models.rope import apply_rope


class Qwen3Attention(LlamaAttention):
    def __init__(self, config, flags: ArchFlags) -> None:
        super().__init__(config, flags)
        self.q_norm = LlamaRMSNorm(head_dim_of(config), config.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(head_dim_of(config), config.rms_norm_eps)

    def rotate_qk(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = qk[:, :, : self.num_heads], qk[:, :, self.num_heads:]
        return apply_rope(self.q_norm(q), cos, sin), apply_rope(self.k_norm(k), cos, sin)


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3Model(LlamaModel):
    layer_cls = Qwen3DecoderLayer


class Qwen3ForCausalLM(LlamaForCausalLM):
    model_cls = Qwen3Model

    @classmethod
    def arch_flags(cls, config) -> ArchFlags:
        bias = bool(getattr(config, "attention_bias", False))
        return ArchFlags(qkv_bias=bias, o_bias=bias, mlp_bias=False)

    @classmethod
    def sliding_window(cls, config) -> int | None:
        return layer_types_window(config)

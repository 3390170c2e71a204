"""Qwen2: Llama with biases on the q/k/v projections (none on o_proj)."""

from __future__ import annotations

from tokenflow.engine.builtin.models.llama import (
    ArchFlags,
    LlamaForCausalLM,
    layer_types_window,
)


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def arch_flags(cls, config) -> ArchFlags:
        return ArchFlags(qkv_bias=True, o_bias=False, mlp_bias=False)

    @classmethod
    def sliding_window(cls, config) -> int | None:
        return layer_types_window(config)

"""Mistral: Llama's layout; its attention may be windowed (``sliding_window``)."""

from __future__ import annotations

from tokenflow.engine.builtin.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    @classmethod
    def sliding_window(cls, config) -> int | None:
        return getattr(config, "sliding_window", None)

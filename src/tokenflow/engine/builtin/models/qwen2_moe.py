"""Qwen2-MoE: Qwen2's attention (q/k/v biases) with sparse layers that add a shared expert,
scaled per token by a sigmoid gate (``shared_expert_intermediate_size``)."""

from __future__ import annotations

from tokenflow.engine.builtin.models.llama import LlamaDecoderLayer, LlamaModel
from tokenflow.engine.builtin.models.moe import MoeMixin, sparse_layer_mlp
from tokenflow.engine.builtin.models.qwen2 import Qwen2ForCausalLM
from tokenflow.engine.builtin.models.qwen3_moe import qwen_moe_spec


class Qwen2MoeModel(LlamaModel):
    layer_cls = sparse_layer_mlp(LlamaDecoderLayer, qwen_moe_spec)


class Qwen2MoeForCausalLM(MoeMixin, Qwen2ForCausalLM):
    model_cls = Qwen2MoeModel

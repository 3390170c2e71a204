"""Qwen3-MoE: Qwen3's attention with sparse layers (``num_experts``, ``num_experts_per_tok``,
``moe_intermediate_size``, ``norm_topk_prob``, ``decoder_sparse_step``, ``mlp_only_layers``)."""

from __future__ import annotations

from tokenflow.engine.builtin.models.moe import MoeMixin, MoeSpec, sparse_layer_mlp
from tokenflow.engine.builtin.models.qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM, Qwen3Model


def qwen_moe_spec(config) -> MoeSpec:
    return MoeSpec(num_experts=config.num_experts, top_k=config.num_experts_per_tok,
                   expert_size=config.moe_intermediate_size, normalise=bool(config.norm_topk_prob),
                   shared_expert_size=getattr(config, "shared_expert_intermediate_size", 0) or 0)


class Qwen3MoeModel(Qwen3Model):
    layer_cls = sparse_layer_mlp(Qwen3DecoderLayer, qwen_moe_spec)


class Qwen3MoeForCausalLM(MoeMixin, Qwen3ForCausalLM):
    model_cls = Qwen3MoeModel

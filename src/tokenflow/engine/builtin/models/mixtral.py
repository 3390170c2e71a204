"""Mixtral: Mistral's attention (optionally windowed) with every layer sparse; the top-k
weights are always renormalised (``num_local_experts``, ``num_experts_per_tok``)."""

from __future__ import annotations

from tokenflow.engine.builtin.models.llama import LlamaDecoderLayer, LlamaModel
from tokenflow.engine.builtin.models.mistral import MistralForCausalLM
from tokenflow.engine.builtin.models.moe import MoeMixin, MoeSpec, sparse_layer_mlp


def mixtral_spec(config) -> MoeSpec:
    return MoeSpec(num_experts=config.num_local_experts, top_k=config.num_experts_per_tok,
                   expert_size=config.intermediate_size, normalise=True)


class MixtralModel(LlamaModel):
    layer_cls = sparse_layer_mlp(LlamaDecoderLayer, mixtral_spec)


class MixtralForCausalLM(MoeMixin, MistralForCausalLM):
    model_cls = MixtralModel

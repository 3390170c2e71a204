"""Which model class serves a Hugging Face config (by ``architectures``, then ``model_type``)."""

from __future__ import annotations

from tokenflow.engine.models.llama import LlamaForCausalLM
from tokenflow.engine.models.mistral import MistralForCausalLM
from tokenflow.engine.models.mixtral import MixtralForCausalLM
from tokenflow.engine.models.qwen2 import Qwen2ForCausalLM
from tokenflow.engine.models.qwen2_moe import Qwen2MoeForCausalLM
from tokenflow.engine.models.qwen3 import Qwen3ForCausalLM
from tokenflow.engine.models.qwen3_moe import Qwen3MoeForCausalLM

ARCHITECTURES: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
}
MODEL_TYPES: dict[str, type[LlamaForCausalLM]] = {
    "llama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "mistral": MistralForCausalLM,
    "qwen3_moe": Qwen3MoeForCausalLM,
    "qwen2_moe": Qwen2MoeForCausalLM,
    "mixtral": MixtralForCausalLM,
}


def model_class(config) -> type[LlamaForCausalLM]:
    """The engine's class for ``config``, or a ValueError naming the supported ones."""
    for arch in getattr(config, "architectures", None) or []:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    model_type = getattr(config, "model_type", None)
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    raise ValueError(
        f"unsupported architecture {getattr(config, 'architectures', None)} "
        f"(model_type {model_type!r}); the built-in engine supports "
        f"{', '.join(ARCHITECTURES)} (model_type {', '.join(MODEL_TYPES)})"
    )

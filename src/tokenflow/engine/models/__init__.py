"""Model implementations of the built-in engine, named as in Hugging Face checkpoints.

The classes import torch; they load on first use, so that checking which architecture a model
folder names (``registry.check_supported``, the run's preflight) stays light."""

from tokenflow._lazy import lazy_getattr

_EXPORTS = {
    "ARCHITECTURES": "tokenflow.engine.models.registry",
    "MODEL_TYPES": "tokenflow.engine.models.registry",
    "LlamaForCausalLM": "tokenflow.engine.models.llama",
    "MistralForCausalLM": "tokenflow.engine.models.mistral",
    "Qwen2ForCausalLM": "tokenflow.engine.models.qwen2",
    "Qwen3ForCausalLM": "tokenflow.engine.models.qwen3",
    "model_class": "tokenflow.engine.models.registry",
}
__getattr__ = lazy_getattr(__name__, globals(), _EXPORTS)

__all__ = [
    "ARCHITECTURES",
    "MODEL_TYPES",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "model_class",
]

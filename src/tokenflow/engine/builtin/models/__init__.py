"""Model implementations of the built-in engine, named as in Hugging Face checkpoints.

The classes import torch; they load on first use, so that checking which architecture a model
folder names (``registry.check_supported``, the run's preflight) stays light.

May import: layer 1, the engine seam (``tokenflow.engine``'s own modules) and
``tokenflow.engine.builtin.cache``."""

from tokenflow._lazy import lazy_getattr

_EXPORTS = {
    "ARCHITECTURES": "tokenflow.engine.builtin.models.registry",
    "MODEL_TYPES": "tokenflow.engine.builtin.models.registry",
    "LlamaForCausalLM": "tokenflow.engine.builtin.models.llama",
    "MistralForCausalLM": "tokenflow.engine.builtin.models.mistral",
    "Qwen2ForCausalLM": "tokenflow.engine.builtin.models.qwen2",
    "Qwen3ForCausalLM": "tokenflow.engine.builtin.models.qwen3",
    "model_class": "tokenflow.engine.builtin.models.registry",
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

"""Model implementations of the built-in engine, named as in Hugging Face checkpoints.

The classes import torch; they load on first use, so that checking which architecture a model
folder names (``registry.check_supported``, the run's preflight) stays light.

May import: layer 1, the engine seam (``tokenflow.engine``'s own modules) and
``tokenflow.engine.builtin.cache``."""

from tokenflow._lazy import lazy_getattr

LARGE_WEIGHT = 1 << 18
"""Elements from which a float32 weight takes the large-weight paths of `packed.Linear` (packed
for oneDNN, or a few rows multiplied as ``weight @ x.T``; SmolLM2's smallest is 576 × 576). On
smaller ones the per-call cost outweighs the faster kernel: the tiny default model's engine
(hidden size 128) went 6,058 -> 5,558 tokens/s with every layer multiplied the other way round,
and 6,913 -> 5,962 with every layer packed (medians of three alternated runs). Here rather than
in `packed` so that `--dry-run`'s memory estimate reads it without importing torch."""

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
    "LARGE_WEIGHT",
    "MODEL_TYPES",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "model_class",
]

"""Model implementations of the built-in engine, named as in Hugging Face checkpoints."""

from tokenflow.engine.models.llama import LlamaForCausalLM
from tokenflow.engine.models.mistral import MistralForCausalLM
from tokenflow.engine.models.qwen2 import Qwen2ForCausalLM
from tokenflow.engine.models.qwen3 import Qwen3ForCausalLM
from tokenflow.engine.models.registry import ARCHITECTURES, MODEL_TYPES, model_class

__all__ = [
    "ARCHITECTURES",
    "MODEL_TYPES",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "model_class",
]

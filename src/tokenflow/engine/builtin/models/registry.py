"""Which model class serves a Hugging Face config (by ``architectures``, then ``model_type``).

The tables name classes as ``"module:Class"`` targets, imported (with torch) only when a class
is asked for: ``check_supported`` answers from the names alone."""

from __future__ import annotations

import importlib

_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "qwen3:Qwen3ForCausalLM",
    "MistralForCausalLM": "mistral:MistralForCausalLM",
    "Qwen3MoeForCausalLM": "qwen3_moe:Qwen3MoeForCausalLM",
    "Qwen2MoeForCausalLM": "qwen2_moe:Qwen2MoeForCausalLM",
    "MixtralForCausalLM": "mixtral:MixtralForCausalLM",
}
_MODEL_TYPES: dict[str, str] = {
    "llama": "llama:LlamaForCausalLM",
    "qwen2": "qwen2:Qwen2ForCausalLM",
    "qwen3": "qwen3:Qwen3ForCausalLM",
    "mistral": "mistral:MistralForCausalLM",
    "qwen3_moe": "qwen3_moe:Qwen3MoeForCausalLM",
    "qwen2_moe": "qwen2_moe:Qwen2MoeForCausalLM",
    "mixtral": "mixtral:MixtralForCausalLM",
}


def _load(target: str):
    module, name = target.split(":")
    return getattr(importlib.import_module(f"tokenflow.engine.builtin.models.{module}"), name)


def __getattr__(name: str):
    """``ARCHITECTURES`` / ``MODEL_TYPES``: the tables with the classes themselves (imports torch)."""
    table = {"ARCHITECTURES": _ARCHITECTURES, "MODEL_TYPES": _MODEL_TYPES}.get(name)
    if table is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = {k: _load(v) for k, v in table.items()}
    globals()[name] = value
    return value


def check_supported(config) -> str:
    """The ``"module:Class"`` target that serves ``config``, or a ValueError naming the
    supported architectures (no import of the model code)."""
    for arch in getattr(config, "architectures", None) or []:
        if arch in _ARCHITECTURES:
            return _ARCHITECTURES[arch]
    model_type = getattr(config, "model_type", None)
    if model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    raise ValueError(
        f"unsupported architecture {getattr(config, 'architectures', None)} "
        f"(model_type {model_type!r}); the built-in engine supports "
        f"{', '.join(_ARCHITECTURES)} (model_type {', '.join(_MODEL_TYPES)})"
    )


def model_class(config):
    """The engine's class for ``config``, or a ValueError naming the supported ones."""
    return _load(check_supported(config))

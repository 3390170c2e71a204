"""Reading a complete Llama ``config.json`` without transformers' config classes.

Importing any transformers config class imports ``transformers.activations`` and, through it,
``torch.distributed.tensor`` and sympy: about 0.6 s on this machine, on the critical path of a
run's start, since the engine cannot generate before its config is read. A Llama config that
states every value the engine reads, with plain RoPE, is read here as JSON instead; anything
else (another family, a missing value that transformers would default or derive, a scaled RoPE)
returns None and goes through ``AutoConfig``. ``tests/engine/test_plain_config.py`` checks that
each attribute the engine reads is the same either way.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

# Every value the engine's Llama reads (directly or with a default of its own), so that none of
# the engine's defaults can stand in for one of transformers'.
REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings",
            "rms_norm_eps", "vocab_size", "tie_word_embeddings", "attention_bias", "mlp_bias",
            "rope_parameters")


class PlainConfig(SimpleNamespace):
    """The JSON's keys as attributes (the engine reads configs by attribute)."""

    def to_dict(self) -> dict:
        return dict(vars(self))


def read_plain_llama_config(folder: str | Path) -> PlainConfig | None:
    """``folder``'s config if it is a complete, plain-RoPE Llama config, else None."""
    try:
        raw = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # AutoConfig will say what is wrong with it
    if not isinstance(raw, dict) or raw.get("model_type") != "llama":
        return None
    if raw.get("architectures") not in (None, ["LlamaForCausalLM"]):
        return None
    if any(raw.get(key) is None for key in REQUIRED):
        return None
    rope = raw["rope_parameters"]
    if not isinstance(rope, dict) or set(rope) != {"rope_type", "rope_theta"} or rope["rope_type"] != "default":
        return None
    if raw.get("rope_scaling") not in (None, rope) or "rope_theta" in raw:
        return None  # v4-style RoPE keys beside v5's: let transformers reconcile them
    return PlainConfig(**raw)

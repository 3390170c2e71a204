"""Model features the built-in engine does not implement are refused by name, not half-run."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig

from tokenflow.engine import Engine, UnsupportedModel

BASE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=50)


@pytest.mark.parametrize("extra,needle", [
    (dict(hidden_act="gelu"), "hidden_act 'gelu'"),
    (dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}), "rope_type 'dynamic'"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
     "partial_rotary_factor"),
])
def test_unsupported_features_are_named(extra, needle):
    with pytest.raises(UnsupportedModel, match=needle):
        Engine.from_config(LlamaConfig(**BASE, **extra))

"""`make_engine`: the one place that turns ``engine.backend`` into a `RolloutEngine`.

The runtime's engine worker, the synchronous reference loop, `tokenflow eval` and `tokenflow
bench engine` all build their engine here, so a backend is added in one table.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from tokenflow.engine.config import EngineConfig

BACKENDS = {
    "builtin": ("tokenflow.engine.llm_engine", "Engine"),
    "vllm": ("tokenflow.engine.vllm.engine", "VLLMEngine"),
}


def make_engine(model: str | Path, config: EngineConfig | None = None, *, tokenizer=None):
    """A `RolloutEngine` for the Hugging Face model folder ``model``, of ``config.backend``."""
    config = config or EngineConfig()
    try:
        module, name = BACKENDS[config.backend]
    except KeyError:
        raise ValueError(f"engine.backend must be one of {sorted(BACKENDS)}, got {config.backend!r}") from None
    cls = getattr(importlib.import_module(module), name)
    return cls(model, config, tokenizer=tokenizer)

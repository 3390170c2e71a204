"""tokenflow: asynchronous RL post-training for language models.

``import tokenflow`` is kept light: heavy libraries (torch, transformers, ray, matplotlib) load
only when the object that needs them is first used.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Public names, resolved on first access so that importing the package stays cheap.
_LAZY = {
    "Rollout": "tokenflow.rollout",
    "Engine": "tokenflow.engine",
    "SamplingParams": "tokenflow.engine",
    "Trainer": "tokenflow.trainer",
    "RolloutBuffer": "tokenflow.buffer",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tokenflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

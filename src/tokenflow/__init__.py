"""tokenflow: asynchronous RL post-training for language models.

``import tokenflow`` is kept light: heavy libraries (torch, transformers, ray, matplotlib) load
only when the object that needs them is first used.

May import: ``tokenflow._lazy`` alone when imported; each public name (``_LAZY``) imports its
module, of whatever layer, on first use.
"""

from __future__ import annotations

from tokenflow._lazy import lazy_getattr

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
__getattr__ = lazy_getattr(__name__, globals(), _LAZY)

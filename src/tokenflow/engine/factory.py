"""`make_engine`: the one place that turns ``engine.backend`` into a `RolloutEngine`.

The runtime's engine worker, the synchronous reference loop, `tokenflow eval` and `tokenflow
bench engine` all build their engine here, from the one table of backends
(`tokenflow.engine.backends.ENGINES`), so a backend is added by registering it there.
"""

from __future__ import annotations

from pathlib import Path

from tokenflow.config.engine import EngineConfig
from tokenflow.engine.backends import ENGINES


def make_engine(model: str | Path, config: EngineConfig | None = None, *, tokenizer=None):
    """A `RolloutEngine` for the Hugging Face model folder ``model``, of ``config.backend``."""
    config = config or EngineConfig()
    cls = ENGINES.get(config.backend)  # an unknown name raises UnknownName, listing the known ones
    return cls(model, config, tokenizer=tokenizer)

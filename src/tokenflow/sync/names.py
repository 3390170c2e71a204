"""Names of a run's shared-memory segments.

Every segment a run creates carries the run's tag (``TOKENFLOW_RUN_TAG``, set by the runtime
from the run folder), so that a run killed with SIGKILL leaves segments its resume can find and
remove (``tokenflow.runtime.run.resources``). Outside a run the prefix is plain ``tf``.
"""

from __future__ import annotations

import os

RUN_TAG_ENV = "TOKENFLOW_RUN_TAG"
"""Spawned workers read the tag from here (the trainer names its shared-memory segments with it)."""


def shm_prefix() -> str:
    """The prefix for this process's shared-memory segment names (the run's tag inside a run)."""
    return os.environ.get(RUN_TAG_ENV) or "tf"

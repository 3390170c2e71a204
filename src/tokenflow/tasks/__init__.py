"""Tasks: a prompt source plus a reward function, and how prompt texts become token ids
(`tokenflow.tasks.prompts`, the one encoding training and evaluation share).

May import: layers 1-3 (records and wiring above all); no other package of layer 4.
"""

from __future__ import annotations

from tokenflow.tasks.base import Prompt, Task


def build_task(cfg) -> Task:
    """The task described by a ``TaskConfig``: the factory registered as ``cfg.name``
    (:data:`tokenflow.registry.TASKS`), called with the config."""
    from tokenflow.registry import TASKS

    return TASKS.get(cfg.name)(cfg)


__all__ = ["Prompt", "Task", "build_task"]

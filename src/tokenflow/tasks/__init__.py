"""Tasks: a prompt source plus a reward function."""

from __future__ import annotations

from tokenflow.tasks.base import Prompt, Task


def build_task(cfg) -> Task:
    """The task described by a ``TaskConfig``: the factory registered as ``cfg.name``
    (:data:`tokenflow.registry.TASKS`), called with the config."""
    from tokenflow.registry import TASKS

    return TASKS.get(cfg.name)(cfg)


__all__ = ["Prompt", "Task", "build_task"]

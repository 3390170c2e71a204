"""Tasks: a prompt source plus a reward function."""

from __future__ import annotations

from tokenflow.tasks.base import Prompt, Task


def build_task(cfg) -> Task:
    """The task described by a ``TaskConfig``."""
    if cfg.name == "arithmetic":
        from tokenflow.tasks.arithmetic import ArithmeticTask

        return ArithmeticTask(seed=cfg.seed, num_eval=cfg.num_eval)
    from tokenflow.tasks.dataset import DatasetTask

    return DatasetTask(cfg.train_path, cfg.reward, eval_path=cfg.eval_path,
                       eval_fraction=cfg.eval_fraction, prompt_field=cfg.prompt_field, seed=cfg.seed)


__all__ = ["Prompt", "Task", "build_task"]

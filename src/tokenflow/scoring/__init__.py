"""Scoring: rewards computed in worker processes.

Three scorer shapes (per sample, per group, per token; :mod:`tokenflow.scoring.shapes`), token
scorers such as a distillation teacher or a process reward model (:mod:`.teacher`,
:mod:`.prm`), and a sandbox for model-written code (:mod:`.sandbox`). See ``docs/scorers.md``.
"""

from tokenflow.scoring.shapes import group_scorer, token_scorer

__all__ = ["group_scorer", "token_scorer"]

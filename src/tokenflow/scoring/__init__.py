"""Scoring: rewards computed in worker processes.

Three scorer shapes (per sample, per group, per token; :mod:`tokenflow.scoring.scorer_shapes`),
the pool that runs reward functions (:mod:`.pool`), token scorers (what they see and return:
:mod:`.token_scorer_protocol`; built from the config and combined: :mod:`.token_scorer_specs`)
such as a distillation teacher or a process reward model (:mod:`.teacher`, :mod:`.prm`), DAPO's
overlong penalty (:mod:`.overlong`), and a sandbox for model-written code (:mod:`.sandbox`).
See ``docs/scorers.md``.

May import: layers 1-3 and, of layer 4, ``tasks`` and ``envs`` (loading reward functions and
environments); never the runtime or a front end.
"""

from tokenflow.scoring.scorer_shapes import group_scorer, token_scorer

__all__ = ["group_scorer", "token_scorer"]

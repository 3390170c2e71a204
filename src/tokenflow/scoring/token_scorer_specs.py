"""Token scorer specs: which per-token scorers the config asks for (`TokenScorerSpec`), how a
spec becomes a scorer, and how the scorers' weighted rewards land on rollouts.

What a scorer sees, returns and is (`SampleView`, `TokenScores`, `TokenScorer`) is in
``tokenflow.scoring.token_scorer_protocol``.
A scorer runs in its own worker process (a model stays loaded there); :func:`build_token_scorer`
is what that worker calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenflow.rollout import Rollout
from tokenflow.scoring.scorer_shapes import normalise_token_rewards, shape_of
from tokenflow.scoring.token_scorer_protocol import SampleView, TokenScorer, TokenScores

__all__ = ["SampleView", "TokenScorer", "TokenScores", "TokenScorerSpec", "apply_token_scores",
           "build_token_scorer", "token_scorer_specs"]


class FunctionTokenScorer:
    """A user's ``@token_scorer`` function."""

    name = "token"

    def __init__(self, spec: str) -> None:
        from tokenflow.tasks.reward_loading import load_reward_fn

        self.fn = load_reward_fn(spec)
        if shape_of(self.fn) != "token":
            raise ValueError(f"scorer.token {spec!r} is not marked as a token scorer; decorate it with "
                             "tokenflow.scoring.token_scorer (it returns one reward array per sample)")

    def score(self, prompt: str, samples: list[SampleView], example: dict) -> TokenScores:
        out = self.fn(prompt, [s.text for s in samples], example, [s.completion_ids.tolist() for s in samples])
        rewards = normalise_token_rewards(out, [len(s.completion_ids) for s in samples])
        return TokenScores([r * (s.loss_mask > 0) for r, s in zip(rewards, samples)])


@dataclass(frozen=True)
class TokenScorerSpec:
    """Everything a worker needs to build one token scorer (strings and numbers only)."""

    kind: str  # "token" | "teacher" | "prm"
    name: str
    coef: float
    config: dict


def token_scorer_specs(scorer_cfg) -> list[TokenScorerSpec]:
    specs = []
    if scorer_cfg.token is not None:
        specs.append(TokenScorerSpec("token", "token", scorer_cfg.token_coef, {"spec": scorer_cfg.token}))
    if scorer_cfg.teacher is not None or scorer_cfg.prm is not None:
        from tokenflow.model_store import resolve_model_path  # "default" → the shipped model
    if scorer_cfg.teacher is not None:
        t = scorer_cfg.teacher
        specs.append(TokenScorerSpec("teacher", "teacher", t.distill_coef,
                                     {**t.model_dump(), "model": resolve_model_path(t.model)}))
    if scorer_cfg.prm is not None:
        p = scorer_cfg.prm
        specs.append(TokenScorerSpec("prm", "prm", p.coef, {**p.model_dump(), "model": resolve_model_path(p.model)}))
    return specs


def build_token_scorer(spec: TokenScorerSpec) -> TokenScorer:
    if spec.kind == "token":
        return FunctionTokenScorer(spec.config["spec"])
    if spec.kind == "teacher":
        from tokenflow.scoring.teacher import TeacherScorer

        return TeacherScorer(**spec.config)
    if spec.kind == "prm":
        from tokenflow.scoring.prm import ProcessRewardScorer

        return ProcessRewardScorer(**spec.config)
    raise ValueError(f"unknown token scorer kind {spec.kind!r}")


def apply_token_scores(group: list[Rollout], parts: list[tuple[TokenScorerSpec, "TokenScores | str"]]) -> None:
    """Put the weighted sum of the token scorers' rewards on each rollout of ``group``.

    ``parts`` holds each scorer's result for the group, or the error that stopped it (then every
    sample of the group fails with it). The one place the async stage and the synchronous loop
    combine token scores, so both give identical rollouts.
    """
    for spec, res in parts:
        if isinstance(res, str):
            for r in group:
                if not r.failed:
                    r.failed, r.reward = True, None
                    r.info["score_error"] = f"{spec.name} scorer: {res}"
            continue
        for r, rewards in zip(group, res.rewards):
            total = np.zeros(r.num_tokens, dtype=np.float32) if r.token_rewards is None else r.token_rewards
            r.token_rewards = (total + np.float32(spec.coef) * rewards.astype(np.float32)).astype(np.float32)
            scores = r.info.setdefault("scorer", {})
            for key, value in res.metrics.items():
                scores[f"{spec.name}/{key}"] = float(value)

"""DAPO's soft overlong punishment: a length penalty added to the outcome reward.

With L_max = ``sampling.max_tokens``, a buffer of L_cache = ``algorithm.overlong_buffer_tokens``
and a factor c = ``algorithm.overlong_penalty``, a completion of |y| tokens gets

    penalty(|y|) = 0                                     if |y| ≤ L_max − L_cache
                 = −c · (|y| − (L_max − L_cache)) / L_cache   if L_max − L_cache < |y| ≤ L_max

so the penalty grows linearly from 0 to −c over the last L_cache tokens before the limit (a
completion cut at the limit gets −c). It is added to the task's reward where rewards are
assigned (the orchestrator, before the buffer; the synchronous reference loop), only for training
samples: held-out accuracy is scored on the task's reward alone. ``rollout.rewards`` keeps it as
``"overlong_penalty"``, so the step metrics report ``reward/overlong_penalty_mean``, and
``rollout.info["unshaped_reward"]`` keeps the task's reward (what dynamic sampling counts).

**Multi-turn rollouts.** ``sampling.max_tokens`` bounds each model turn (the episode driver gives
every turn that budget), so |y| is a model turn's length: the tokens of one turn with loss mask
1 (``Rollout.turns`` gives the turns; without it, each run of loss-mask-1 tokens is a turn).
Environment tokens never count. The episode's penalty is its worst turn's: an episode is
penalised as much as its longest turn, and a single-turn rollout exactly as before.
"""

from __future__ import annotations

import numpy as np

from tokenflow.rollout import Rollout


def overlong_penalty(length: int, max_tokens: int, buffer_tokens: int, factor: float) -> float:
    """The penalty (≤ 0) of a completion of ``length`` tokens; see the module docstring."""
    start = max_tokens - buffer_tokens
    if length <= start:
        return 0.0
    return -factor * min(length - start, buffer_tokens) / buffer_tokens


def model_turn_lengths(r: Rollout) -> list[int]:
    """Model-generated tokens (loss mask 1) of each model turn, in order."""
    model = r.loss_mask > 0
    if r.turns is not None:
        turns = r.turns[model]
        return [int((turns == k).sum()) for k in np.unique(turns)]
    if model.all():
        return [r.num_tokens]
    # Runs of model tokens between environment tokens.
    edges = np.diff(np.concatenate([[0], model.astype(np.int8), [0]]))
    return (np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)).tolist()


def shape_overlong(group: list[Rollout], max_tokens: int, buffer_tokens: int, factor: float) -> None:
    """Add the overlong penalty (of each episode's longest model turn) to every scored sample's
    reward, in place. An episode split into several rows (one sample, ``sample_index``) gets one
    penalty, its worst turn's over all its rows."""
    scored = [r for r in group if not r.failed and r.reward is not None]
    worst: dict[int, float] = {}
    for r in scored:
        p = min((overlong_penalty(n, max_tokens, buffer_tokens, factor) for n in model_turn_lengths(r)),
                default=0.0)
        worst[r.sample_index] = min(p, worst.get(r.sample_index, 0.0))
    for r in scored:
        p = worst[r.sample_index]
        r.info = {**r.info, "unshaped_reward": float(r.reward)}
        r.reward = float(r.reward) + p
        r.rewards = {**r.rewards, "reward": r.reward, "overlong_penalty": p}

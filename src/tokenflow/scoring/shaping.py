"""DAPO's soft overlong punishment: a length penalty added to the outcome reward.

With L_max = ``sampling.max_tokens``, a buffer of L_cache = ``algorithm.overlong_buffer_tokens``
and a factor c = ``algorithm.overlong_penalty``, a completion of |y| tokens gets

    penalty(|y|) = 0                                     if |y| ≤ L_max − L_cache
                 = −c · (|y| − (L_max − L_cache)) / L_cache   if L_max − L_cache < |y| ≤ L_max

so the penalty grows linearly from 0 to −c over the last L_cache tokens before the limit (a
completion cut at the limit gets −c). It is added to the task's reward where rewards are
assigned (the orchestrator, before the buffer; the synchronous reference loop), only for training
samples: held-out accuracy is scored on the task's reward alone. ``rollout.rewards`` keeps it as
``"overlong_penalty"``, so the step metrics report ``reward/overlong_penalty_mean``.
"""

from __future__ import annotations

from tokenflow.rollout import Rollout


def overlong_penalty(length: int, max_tokens: int, buffer_tokens: int, factor: float) -> float:
    """The penalty (≤ 0) of a completion of ``length`` tokens; see the module docstring."""
    start = max_tokens - buffer_tokens
    if length <= start:
        return 0.0
    return -factor * min(length - start, buffer_tokens) / buffer_tokens


def shape_overlong(group: list[Rollout], max_tokens: int, buffer_tokens: int, factor: float) -> None:
    """Add the overlong penalty to every scored sample's reward, in place."""
    for r in group:
        if r.failed or r.reward is None:
            continue
        p = overlong_penalty(r.num_tokens, max_tokens, buffer_tokens, factor)
        r.reward = float(r.reward) + p
        r.rewards = {**r.rewards, "reward": r.reward, "overlong_penalty": p}

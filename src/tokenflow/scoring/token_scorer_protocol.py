"""The token scorer protocol: what a per-token scorer sees of a sample and what it returns.

A token scorer gets one prompt's group at a time (so a model-based scorer runs one batched
forward pass per group) as :class:`SampleView`\\ s — ids, text, behaviour log-probs — and returns
:class:`TokenScores`: one reward per completion token per sample (0 on tokens outside the loss
mask) and a few group-level metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tokenflow.rollout import Rollout


@dataclass
class SampleView:
    """What a token scorer sees of one rollout (picklable, no tensors)."""

    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    text: str
    behaviour: np.ndarray
    """Full-vocabulary behaviour log-prob log μ(a_t) = log softmax(logits/T)[a_t], from the engine."""
    temperature: float
    loss_mask: np.ndarray

    @classmethod
    def of(cls, r: Rollout) -> "SampleView":
        return cls(r.prompt_ids, r.completion_ids, r.text or "", r.full_logprobs, r.temperature, r.loss_mask)


@dataclass
class TokenScores:
    rewards: list[np.ndarray]
    """Per sample, one reward per completion token (unweighted; the stage applies the coefficient)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Group-level numbers, logged as ``scorer/<name>/<key>`` (mean over the step's samples)."""


class TokenScorer(Protocol):
    name: str

    def score(self, prompt: str, samples: list[SampleView], example: dict) -> TokenScores:
        """Called in the scorer's worker once per group, for training groups only."""
        ...

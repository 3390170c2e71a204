"""The ``[rollout]`` and ``[sampling]`` sections: the batch shape, the staleness budget, and how
training rollouts are sampled."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tokenflow.config.base import ConfigModel


class RolloutConfig(ConfigModel):
    prompts_per_step: int = Field(default=16, ge=1)
    """Prompts (groups) consumed by one optimizer step."""
    group_size: int = Field(default=8, ge=1)
    """Samples per prompt (the GRPO group, the engine's n)."""
    max_staleness: int = Field(default=1, ge=0)
    """Admission bound K: at most (K+1) × rollouts per step admitted and not yet consumed. 0 = synchronous.
    It bounds admission, not the age of trained tokens: under batch_order "ready" a straggler
    overtaken by younger groups is trained older than K (about 7% of the default run's tokens,
    up to 4 versions old); the live view and the end-of-run table give that share.
    algorithm.max_token_age drops such tokens, batch_order "admission" waits for them, and
    trainer.staleness_lr shortens the step of a batch by its mean token age."""
    batch_order: Literal["admission", "ready"] = "ready"
    """Which groups make a step's batch. "admission": the prompts_per_step oldest admitted
    groups, waiting for all of them, so no token is older than max_staleness. "ready": the
    oldest prompts_per_step groups already scored; a slow group is overtaken by younger ones
    and can be trained older than max_staleness."""

    @property
    def rollouts_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


class SamplingConfig(ConfigModel):
    temperature: float = Field(default=1.0, ge=0.0)
    """Sampling temperature for training rollouts (evaluation is always greedy)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass (1 = off)."""
    top_k: int = Field(default=0, ge=0)
    """Keep the k most likely tokens (0 = off)."""
    max_tokens: int = Field(default=96, ge=1)
    """Maximum completion length in tokens."""
    stop: list[str] = Field(default_factory=list)
    """Stop strings (the end-of-sequence token always stops)."""

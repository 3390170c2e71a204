"""`Sequence` (one sample being generated) and `SequenceGroup` (the n samples of one request).

A sequence's ``token_ids`` hold the prompt, then a resumed partial completion if any, then the
tokens generated here; per generated token it records what becomes the `Rollout`'s per-token
arrays. The n sequences of a group share the prompt's prefill.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from tokenflow.engine.sampling_params import SamplingParams
from tokenflow.rollout import Rollout


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    sample_index: int
    params: SamplingParams
    seed: int
    """The counter-based sampler's seed: tokens depend only on (seed, sample_index, step)."""
    prompt_ids: list[int]
    token_ids: list[int]
    """Prompt + resumed partial completion + tokens generated here."""
    stop_ids: frozenset[int]
    group_id: int = 0
    prompt_id: int = -1
    prefix: Rollout | None = None
    """The partial rollout this sequence resumes (prefix resume), or None."""
    slot: int = -1
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    logmass: list[float] = field(default_factory=list)
    support: list[np.ndarray | None] = field(default_factory=list)
    truncated: bool = False
    """Whether any generated token had a truncated support (so `Rollout.support` is a list)."""

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_completion_tokens(self) -> int:
        """Completion length so far, a resumed prefix included (what max_tokens bounds)."""
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def num_new_tokens(self) -> int:
        return len(self.logprobs)

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append(self, token: int, logprob: float, version: int, logmass: float,
               support: np.ndarray | None) -> None:
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)
        self.logmass.append(logmass)
        self.support.append(support)
        if support is not None:
            self.truncated = True

    def to_rollout(self, text: str | None = None) -> Rollout:
        """The finished (or aborted) sample as a `Rollout`, joined onto its resumed prefix."""
        n_new = self.num_new_tokens
        new = Rollout(
            prompt_ids=np.asarray(self.prompt_ids, dtype=np.int32),
            completion_ids=np.asarray(self.token_ids[len(self.token_ids) - n_new:], dtype=np.int32),
            logprobs=np.asarray(self.logprobs, dtype=np.float32),
            versions=np.asarray(self.versions, dtype=np.int32),
            finish_reason=self.finish_reason or "abort",
            temperature=self.params.temperature,
            support_logmass=np.asarray(self.logmass, dtype=np.float32),
            support=list(self.support) if self.truncated else None,
            request_id=self.request_id,
            sample_index=self.sample_index,
            group_id=self.group_id,
            prompt_id=self.prompt_id,
            info={"seed": self.seed},
        )
        out = self.prefix.extend(new) if self.prefix is not None else new
        out.text = text
        return out


@dataclass(eq=False)
class SequenceGroup:
    """One request: n samples of one prompt, prefilled once and decoded as n sequences."""

    request_id: str
    seqs: list[Sequence]

    @property
    def n(self) -> int:
        return len(self.seqs)

    @property
    def prefill_ids(self) -> list[int]:
        """What the shared prefill reads: the prompt, plus a resumed partial completion."""
        return self.seqs[0].token_ids

    @property
    def num_prefill_tokens(self) -> int:
        return len(self.seqs[0].token_ids)

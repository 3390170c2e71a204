"""`Sequence` (one sample being generated) and `SequenceGroup` (the n samples of one request).

A sequence's ``token_ids`` hold the prompt, then a resumed partial completion (or the earlier
turns and environment tokens of a multi-turn continuation) if any, then the tokens generated
here; per generated token it records what becomes the `Rollout`'s per-token arrays. The n
sequences of a group share the prompt's prefill.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from tokenflow.engine.request import RequestLimits, plan_request
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
    """The rollout this sequence resumes (an aborted partial, or a multi-turn rollout ending in
    environment tokens), or None."""
    turn: int | None = None
    """`Rollout.turns` value of the tokens generated here (None: the rollout records no turns)."""
    turn_start: int = -1
    """Index in ``token_ids`` where this model turn began (stop strings are looked for from
    here); -1 = after the prompt."""
    slot: int = -1
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    logmass: list[float] = field(default_factory=list)
    support: list[np.ndarray | None] = field(default_factory=list)
    truncated: bool = False
    """Whether any generated token had a truncated support (so `Rollout.support` is a list)."""
    top: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    """Per generated token, its ``params.logprobs`` most likely alternatives (ids, log-probs);
    empty when not asked for."""
    reported: int = 0
    """Generated tokens already handed out by `Engine.new_tokens` (streaming front ends)."""
    routing: list[np.ndarray] = field(default_factory=list)
    """MoE models: expert ids of the tokens forwarded so far, in chunks of [tokens, layers, k]
    (the prefill's chunk covers the prompt and any resumed partial; each decode adds one)."""
    prompt_scores: dict | None = None
    """``params.prompt_logprobs`` asked: the `Rollout` fields ``prompt_logprobs`` (and
    ``prompt_top_ids``/``prompt_top_logprobs``), from this sample's prefill."""

    def __post_init__(self) -> None:
        if self.turn_start < 0:
            self.turn_start = len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def continues(self) -> bool:
        """Whether this is the next model turn of a rollout that ended in environment tokens."""
        return self.prefix is not None and self.prefix.ends_with_environment

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
               support: np.ndarray | None, top: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        if top is not None:
            self.top.append(top)
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
        # A continuation's environment tokens were never routed by a forward that produced
        # a token, and its prefix may come from parked KV: no routing record.
        routing = None if self.continues else self._routing()
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
            routed_experts=routing if self.prefix is None else None,
            turns=None if self.turn is None else np.full(n_new, self.turn, dtype=np.int16),
            top_logprobs=list(self.top) if self.params.logprobs else None,
            **(self.prompt_scores or {}),
        )
        out = self.prefix.extend(new, routing) if self.prefix is not None else new
        out.text = text
        return out

    def _routing(self) -> np.ndarray | None:
        """Routing of the whole rollout (prefix included): one row per token it reads. Rows of
        a resumed prefix's tokens come from the prefix, i.e. from the forward that produced
        them, not from the prefill that re-read them here."""
        if not self.routing:  # never prefilled here (aborted while waiting)
            return self.prefix.routed_experts if self.prefix is not None else None
        rows = np.concatenate(self.routing)[: max(self.num_tokens - 1, 0)]
        if self.prefix is None or self.prefix.num_tokens == 0:
            return rows
        if self.prefix.routed_experts is None:
            return None
        kept = self.prefix.routed_experts
        return np.concatenate([kept, rows[len(kept):]])


@dataclass(eq=False)
class SequenceGroup:
    """One request: n samples of one prompt, prefilled once and decoded as n sequences."""

    request_id: str
    seqs: list[Sequence]
    reused: int = 0
    """Leading positions served from parked KV at admission (set by the scheduler); the
    prefill forwards only ``prefill_ids[reused:]``."""

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


def make_group(limits: RequestLimits, arrival: int, prompt_ids, params: SamplingParams,
               request_id: str | None, resume: Rollout | None, group_id: int,
               prompt_id: int) -> SequenceGroup:
    """Validate one request (`tokenflow.engine.request.plan_request`) and build its n sequences
    (or the one resumed/continued sequence)."""
    plan = plan_request(limits, arrival, prompt_ids, params, request_id, resume, group_id, prompt_id)
    seqs = [
        Sequence(request_id=plan.request_id, sample_index=i, params=params, seed=plan.seed,
                 prompt_ids=plan.prompt_ids, token_ids=plan.prompt_ids + plan.prefix, stop_ids=plan.stop_ids,
                 group_id=plan.group_id, prompt_id=plan.prompt_id, prefix=plan.resume, turn=plan.turn,
                 turn_start=plan.turn_start)
        for i in plan.sample_indices
    ]
    return SequenceGroup(plan.request_id, seqs)

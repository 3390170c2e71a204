"""The rollout record that flows engine → scorer → buffer → trainer.

One `Rollout` is one sampled completion of one prompt. Per-token arrays are NumPy so that a
rollout crosses a process boundary (pickle, shared memory, Ray's object store) as a few flat
buffers instead of millions of Python objects.

Conventions (see `shared/REFERENCES.md`):

* ``logprobs[t]`` is the **behaviour log-prob** log μ(a_t): the log-probability of the sampled
  token under the distribution the engine actually sampled from, i.e. ``softmax(logits / T)``
  restricted to the kept support ``S_t`` and renormalised. With no truncation (top_k = 0,
  top_p = 1) it is simply ``log_softmax(logits / T)[a_t]``. For greedy decoding (T = 0) it is
  ``log_softmax(logits)[a_t]`` (T taken as 1), as vLLM reports it.
* ``support_logmass[t]`` is ``log Σ_{s∈S_t} softmax(logits / T)[s]`` (0 when nothing was cut),
  so the full-vocabulary log-prob is ``logprobs[t] + support_logmass[t]``.
* ``versions[t]`` is the policy version (optimizer steps applied) of the weights that produced
  token t. A rollout may hold several versions when weights changed mid-generation.
* ``support[t]`` is the sorted array of token ids kept by top-k/top-p at step t, or ``None`` when
  the whole vocabulary was kept ("Keep Sampling Mask").
* ``routed_experts[p, l, j]`` (mixture-of-experts policies) is the j-th expert the engine routed
  input position p to in its l-th sparse layer ("Keep Routing"). Positions are those of
  ``prompt_ids + completion_ids[:-1]``, the tokens the model reads (the last token is never fed
  back), so prompt tokens are covered too; see `tokenflow.trainer.keep_routing`.
* ``turns[t]`` (multi-turn rollouts) is the model turn token t belongs to: model turn k's
  generated tokens have turn k, and the environment tokens appended after model turn k
  (``loss_mask`` 0) have turn k too. None for single-turn rollouts.
* ``top_logprobs[t]`` (on request, ``SamplingParams.logprobs = N``) is ``(ids, logprobs)``: the N
  most likely tokens at step t, most likely first, and their log-probs on the scale of
  ``logprobs[t]`` (the distribution the token was drawn from; ``-inf`` outside the support).
  Where the sampled token is among them, its value equals ``logprobs[t]``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

CORRECT_REWARD = 0.5
"""A sample is *correct* when its task reward is at least this: held-out accuracy
(`tokenflow.evaluation`) and DAPO's dynamic sampling (`tokenflow.buffer`) count alike. For the
0/1 rewards of verifiable tasks, correct means solved."""


def task_reward(r: "Rollout") -> float | None:
    """The task's reward of a scored sample before batch shaping (DAPO's overlong penalty keeps
    the unshaped value in ``info["unshaped_reward"]``); None for a failed or unscored one."""
    if r.failed or r.reward is None:
        return None
    return float(r.info.get("unshaped_reward", r.reward))


FinishReason = Literal["stop", "length", "abort", "error", "max_turns", "token_limit", "context_length"]
""""stop" / "length" / "abort" come from the engine (EOS or stop id or string / max_tokens or the
context / a partial); "error" from a failed generation; "max_turns", "token_limit" and
"context_length" end a multi-turn episode and are set by the environment runtime."""


def _i32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int32).reshape(-1)


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).reshape(-1)


@dataclass
class Rollout:
    """One sampled completion with everything the trainer needs to correct for staleness."""

    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    finish_reason: FinishReason = "length"
    temperature: float = 1.0
    support_logmass: np.ndarray | None = None
    support: list[np.ndarray | None] | None = None
    loss_mask: np.ndarray | None = None
    """1 for model-generated tokens that count in the loss, 0 for environment/tool tokens."""
    request_id: str = ""
    sample_index: int = 0
    group_id: int = 0
    """Rollouts of one prompt (the n samples) share a group id; advantages are computed within it."""
    prompt_id: int = -1
    """The prompt's id in its dataset, for exact accounting across resume."""
    reward: float | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    token_rewards: np.ndarray | None = None
    """Per-token rewards from token-shaped scorers (teacher, process reward, ...), one per
    completion token, summed with their weights; they enter the returns as r_t beside the
    outcome ``reward`` (see ``docs/algorithms.md``). None when no token scorer ran."""
    failed: bool = False
    """The scorer raised or timed out for this rollout; it carries no reward signal."""
    text: str | None = None
    info: dict = field(default_factory=dict)
    routed_experts: np.ndarray | None = None
    """[len(prompt) + len(completion) − 1, moe_layers, top_k] small unsigned ints: the experts
    each input token was routed to (None for dense models or when not recorded)."""
    turns: np.ndarray | None = None
    """Multi-turn rollouts: the model-turn index of each completion token (int16; environment
    tokens carry the turn they follow). None for single-turn rollouts."""
    top_logprobs: list[tuple[np.ndarray, np.ndarray]] | None = None
    """On request (``SamplingParams.logprobs = N``): per completion token, the N most likely
    tokens (int32, most likely first) and their log-probs (float32, on the scale of
    ``logprobs``). Environment tokens have empty arrays. None when not asked for."""
    prompt_logprobs: np.ndarray | None = None
    """On request (``SamplingParams.prompt_logprobs``): per prompt token, float32, its log-prob
    ``log_softmax(logits)`` given the tokens before it (NaN for the first, which has no context).
    None when not asked for."""
    prompt_top_ids: np.ndarray | None = None
    """With ``SamplingParams.prompt_logprobs = K > 0``: [len(prompt), K] int32, the K most likely
    tokens at each prompt position, most likely first (-1 in the first row)."""
    prompt_top_logprobs: np.ndarray | None = None
    """Their log-probs, [len(prompt), K] float32 (NaN in the first row)."""

    def __post_init__(self) -> None:
        self.prompt_ids = _i32(self.prompt_ids)
        self.completion_ids = _i32(self.completion_ids)
        self.logprobs = _f32(self.logprobs)
        self.versions = _i32(self.versions)
        n = len(self.completion_ids)
        if self.loss_mask is None:
            self.loss_mask = np.ones(n, dtype=np.int8)
        else:
            self.loss_mask = np.asarray(self.loss_mask, dtype=np.int8).reshape(-1)
        if self.support_logmass is not None:
            self.support_logmass = _f32(self.support_logmass)
        if self.token_rewards is not None:
            self.token_rewards = _f32(self.token_rewards)
        if self.turns is not None:
            self.turns = np.asarray(self.turns, dtype=np.int16).reshape(-1)
        for name in ("logprobs", "versions", "loss_mask", "support_logmass", "token_rewards", "turns"):
            arr = getattr(self, name)
            if arr is not None and len(arr) != n:
                raise ValueError(
                    f"Rollout.{name} has {len(arr)} entries but the completion has {n} tokens; "
                    "per-token arrays must have one entry per completion token"
                )
        if self.top_logprobs is not None:
            self.top_logprobs = [_top_pair(entry) for entry in self.top_logprobs]
            if len(self.top_logprobs) != n:
                raise ValueError(f"Rollout.top_logprobs has {len(self.top_logprobs)} entries but the "
                                 f"completion has {n} tokens")
        self._check_prompt_logprobs()
        if self.support is not None and len(self.support) != n:
            raise ValueError(
                f"Rollout.support has {len(self.support)} entries but the completion has {n} tokens"
            )
        if self.routed_experts is not None:
            self.routed_experts = np.asarray(self.routed_experts)
            want = max(len(self.prompt_ids) + n - 1, 0)
            if self.routed_experts.ndim != 3 or len(self.routed_experts) != want:
                raise ValueError(
                    f"Rollout.routed_experts has shape {self.routed_experts.shape} but must be "
                    f"[{want}, moe_layers, top_k]: one row per input token (prompt + completion − 1)"
                )

    def _check_prompt_logprobs(self) -> None:
        p = len(self.prompt_ids)
        if self.prompt_logprobs is not None:
            self.prompt_logprobs = _f32(self.prompt_logprobs)
            if len(self.prompt_logprobs) != p:
                raise ValueError(f"Rollout.prompt_logprobs has {len(self.prompt_logprobs)} entries but the "
                                 f"prompt has {p} tokens")
        if (self.prompt_top_ids is None) != (self.prompt_top_logprobs is None):
            raise ValueError("Rollout.prompt_top_ids and prompt_top_logprobs come together")
        if self.prompt_top_ids is not None:
            self.prompt_top_ids = np.asarray(self.prompt_top_ids, dtype=np.int32)
            self.prompt_top_logprobs = np.asarray(self.prompt_top_logprobs, dtype=np.float32)
            if (self.prompt_top_ids.ndim != 2 or len(self.prompt_top_ids) != p
                    or self.prompt_top_ids.shape != self.prompt_top_logprobs.shape):
                raise ValueError(f"Rollout.prompt_top_ids/prompt_top_logprobs must both be [{p}, K], got "
                                 f"{self.prompt_top_ids.shape} and {self.prompt_top_logprobs.shape}")

    @property
    def num_tokens(self) -> int:
        return len(self.completion_ids)

    @property
    def ends_with_environment(self) -> bool:
        """Whether the last completion token is an environment token (``loss_mask`` 0): the
        rollout is then a multi-turn episode waiting for the model's next turn."""
        return self.num_tokens > 0 and self.loss_mask[-1] == 0

    @property
    def last_turn(self) -> int:
        """The turn of the last completion token (0 without turns or tokens)."""
        return int(self.turns[-1]) if self.turns is not None and self.num_tokens else 0

    @property
    def full_logprobs(self) -> np.ndarray:
        """Full-vocabulary behaviour log-probs ``log softmax(logits/T)[a_t]``."""
        if self.support_logmass is None:
            return self.logprobs
        return self.logprobs + self.support_logmass

    def token_ages(self, trainer_version: int) -> np.ndarray:
        """Age of each token at consumption, in optimizer steps: trainer version − token version."""
        return trainer_version - self.versions

    def extend(self, other: "Rollout", routed_experts: np.ndarray | None = None) -> "Rollout":
        """Concatenate a continuation (prefix resume, or the next model turn) onto this rollout.
        A continuation re-reads this rollout's tokens, so only its producer knows the joined
        routing; it passes ``routed_experts`` (covering the whole concatenation) or there is
        none. ``turns`` and ``token_rewards`` are joined when either side has them (a side
        without them counts as turn 0 / reward 0)."""
        sup = None
        if self.support is not None or other.support is not None:
            sup = list(self.support or [None] * self.num_tokens) + list(
                other.support or [None] * other.num_tokens
            )
        logmass = None
        if self.support_logmass is not None or other.support_logmass is not None:
            a = self.support_logmass if self.support_logmass is not None else np.zeros(self.num_tokens)
            b = other.support_logmass if other.support_logmass is not None else np.zeros(other.num_tokens)
            logmass = np.concatenate([a, b])
        top = None
        if self.top_logprobs is not None or other.top_logprobs is not None:
            top = (list(self.top_logprobs or [_NO_TOP] * self.num_tokens)
                   + list(other.top_logprobs or [_NO_TOP] * other.num_tokens))
        return Rollout(
            prompt_ids=self.prompt_ids,
            completion_ids=np.concatenate([self.completion_ids, other.completion_ids]),
            logprobs=np.concatenate([self.logprobs, other.logprobs]),
            versions=np.concatenate([self.versions, other.versions]),
            finish_reason=other.finish_reason,
            temperature=self.temperature,
            support_logmass=logmass,
            support=sup,
            loss_mask=np.concatenate([self.loss_mask, other.loss_mask]),
            request_id=self.request_id,
            sample_index=self.sample_index,
            group_id=self.group_id,
            prompt_id=self.prompt_id,
            text=None,
            info={**self.info, **other.info},
            routed_experts=routed_experts,
            token_rewards=_joined(self.token_rewards, other.token_rewards, self.num_tokens, other.num_tokens),
            turns=_joined(self.turns, other.turns, self.num_tokens, other.num_tokens),
            top_logprobs=top,
            **_prompt_scores(self if self.prompt_logprobs is not None else other),
        )

    def append_environment(self, ids) -> "Rollout":
        """This rollout with environment tokens ``ids`` (a tool result, a user message, ...)
        appended to the completion, ready to be continued with ``engine.add_request(prompt,
        params, resume=...)``. The ids are used as given: nothing is detokenized or
        re-tokenized, so the next model turn reads exactly these tokens.

        The new tokens have ``loss_mask`` 0, ``logprobs`` 0, ``support_logmass`` 0 and
        ``support`` None and ``top_logprobs`` empty (where those fields exist), ``token_rewards`` 0
        (where present), and
        ``turns`` equal to the last token's turn (``turns`` starts as zeros if it was None).
        Their ``versions`` repeat the version of the last generated token: an environment token
        was not sampled and has no age of its own, so metrics and corrections that read versions
        must select tokens by ``loss_mask`` (the trainer does). ``routed_experts`` becomes None:
        the routing of the environment tokens is not recorded, and an engine continuing the
        rollout returns None too. ``text`` becomes None (it no longer matches the completion).
        ``finish_reason`` stays the original's: the result is a vehicle for the next turn, and
        the runtime sets the episode's final reason."""
        ids = _i32(ids)
        if len(ids) == 0:
            raise ValueError("append_environment needs at least one token id")
        if (ids < 0).any():
            raise ValueError(f"token ids must be >= 0, got {ids[ids < 0][:8].tolist()}")
        k = len(ids)
        generated = np.flatnonzero(self.loss_mask)
        version = (self.versions[generated[-1]] if len(generated)
                   else self.versions[-1] if self.num_tokens else 0)
        turns = self.turns if self.turns is not None else np.zeros(self.num_tokens, dtype=np.int16)

        def more(arr, value):
            return None if arr is None else np.concatenate([arr, np.full(k, value, dtype=arr.dtype)])

        return dataclasses.replace(
            self,
            completion_ids=np.concatenate([self.completion_ids, ids]),
            logprobs=more(self.logprobs, 0.0),
            versions=more(self.versions, version),
            loss_mask=more(self.loss_mask, 0),
            support_logmass=more(self.support_logmass, 0.0),
            support=None if self.support is None else list(self.support) + [None] * k,
            top_logprobs=None if self.top_logprobs is None else list(self.top_logprobs) + [_NO_TOP] * k,
            token_rewards=more(self.token_rewards, 0.0),
            turns=more(turns, self.last_turn),
            routed_experts=None,
            text=None,
            info=dict(self.info),
            rewards=dict(self.rewards),
        )


_NO_TOP = (np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32))
"""The ``top_logprobs`` entry of a token with no alternatives recorded (an environment token)."""


def _top_pair(entry) -> tuple[np.ndarray, np.ndarray]:
    ids, logprobs = entry
    ids, logprobs = _i32(ids), _f32(logprobs)
    if len(ids) != len(logprobs):
        raise ValueError(f"a Rollout.top_logprobs entry has {len(ids)} ids but {len(logprobs)} log-probs")
    return ids, logprobs


def _joined(a: np.ndarray | None, b: np.ndarray | None, len_a: int, len_b: int) -> np.ndarray | None:
    """``a`` + ``b`` where either may be None (then zeros of its length); None if both are."""
    if a is None and b is None:
        return None
    dtype = (a if a is not None else b).dtype
    return np.concatenate([a if a is not None else np.zeros(len_a, dtype),
                           b if b is not None else np.zeros(len_b, dtype)])


def _prompt_scores(r: Rollout) -> dict:
    """The prompt log-prob fields of ``r`` (a continuation keeps whichever side has them)."""
    return {"prompt_logprobs": r.prompt_logprobs, "prompt_top_ids": r.prompt_top_ids,
            "prompt_top_logprobs": r.prompt_top_logprobs}

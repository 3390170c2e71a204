"""Checking `add_request` arguments, the same way on every backend: `plan_request` turns them
into a `RequestPlan` (the samples to start, their seed and stop ids) or raises `InvalidRequest`;
`derive_seed` gives a request without a seed of its own one derived from the engine's.

Part of the seam: a backend builds its own per-sample state from the plan (the built-in engine
its `Sequence`s, vLLM one request per sample)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenflow.engine.errors import InvalidRequest
from tokenflow.engine.sampling_params import SamplingParams
from tokenflow.rollout import Rollout

_MASK64 = (1 << 64) - 1


def derive_seed(base: int, counter: int) -> int:
    """splitmix64 of (base, counter): distinct, well-mixed request seeds from one engine seed."""
    x = (base * 0x9E3779B97F4A7C15 + counter + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1  # 63 bits: fits torch.int64


@dataclass
class RequestLimits:
    """What a request is checked against."""

    vocab_size: int
    max_model_len: int
    max_num_seqs: int
    has_tokenizer: bool
    eos_token_ids: frozenset[int]
    engine_seed: int


@dataclass
class RequestPlan:
    """One validated request: what a backend starts for it."""

    request_id: str
    prompt_ids: list[int]
    prefix: list[int]
    """Completion ids already generated (a resumed or continued rollout's), else empty."""
    sample_indices: list[int]
    seed: int
    stop_ids: frozenset[int]
    group_id: int
    prompt_id: int
    resume: Rollout | None
    turn: int | None
    """The turn the new tokens belong to (multi-turn rollouts), else None."""
    turn_start: int
    """Where that model turn began in prompt + completion (-1 without a resume)."""


def plan_request(limits: RequestLimits, arrival: int, prompt_ids, params: SamplingParams,
                 request_id: str | None, resume: Rollout | None, group_id: int,
                 prompt_id: int) -> RequestPlan:
    """Validate one request (``arrival`` = how many requests the engine accepted before it) and
    say what to start: its n samples, or the one resumed/continued sample."""
    params.validate(limits.vocab_size, has_tokenizer=limits.has_tokenizer)
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise InvalidRequest("prompt_ids is empty")
    bad = [t for t in prompt if not 0 <= t < limits.vocab_size]
    if bad:
        raise InvalidRequest(f"prompt_ids must be in [0, {limits.vocab_size}), got {bad[:8]}")
    if params.n > limits.max_num_seqs:
        raise InvalidRequest(f"n must be <= max_num_seqs ({limits.max_num_seqs}), got {params.n}")
    prefix: list[int] = []
    sample_indices: list[int] = list(range(params.n))
    seed = params.seed
    turn, turn_start = None, -1
    if resume is not None:
        _check_resume(resume, prompt, params)
        prefix = resume.completion_ids.tolist()
        request_id = request_id or resume.request_id
        sample_indices = [resume.sample_index]
        group_id, prompt_id = resume.group_id, resume.prompt_id
        # The episode's noise stream: a resumed or continued sample keeps its seed, so the
        # whole rollout is regenerable from it.
        seed = resume.info.get("seed", seed)
        turn, turn_start = _turn_of_new_tokens(resume, len(prompt))
    total = len(prompt) + len(prefix)
    if total >= limits.max_model_len:
        raise InvalidRequest(
            f"prompt{' + resumed completion' if prefix else ''} has {total} tokens; the context "
            f"(max_model_len) is {limits.max_model_len} tokens, so at most {limits.max_model_len - 1}"
        )
    seed = derive_seed(limits.engine_seed, arrival) if seed is None else seed & ((1 << 63) - 1)
    stop_ids = frozenset(params.stop_token_ids)
    if not params.ignore_eos:
        stop_ids |= limits.eos_token_ids
    return RequestPlan(request_id or f"req-{arrival}", prompt, prefix, sample_indices, seed, stop_ids,
                       group_id, prompt_id, resume, turn, turn_start)


def _turn_of_new_tokens(resume: Rollout, prompt_len: int) -> tuple[int | None, int]:
    """The turn the tokens generated after ``resume`` belong to, and where their model turn
    began in prompt + completion. After environment tokens a new turn starts; an aborted
    partial keeps its last token's turn (None if it records no turns)."""
    env = np.flatnonzero(resume.loss_mask == 0)
    turn_start = prompt_len + (int(env[-1]) + 1 if len(env) else 0)
    if resume.ends_with_environment:
        return resume.last_turn + 1, turn_start
    return (resume.last_turn if resume.turns is not None else None), turn_start


def _check_resume(resume: Rollout, prompt: list[int], params: SamplingParams) -> None:
    if params.n != 1:
        raise InvalidRequest(f"n must be 1 when resuming or continuing a rollout, got {params.n}")
    if resume.finish_reason != "abort" and not resume.ends_with_environment:
        raise InvalidRequest(
            "resume must be a partial rollout (finish_reason 'abort') or a rollout ending in "
            "environment tokens (Rollout.append_environment: loss_mask 0 on its last token); got "
            f"finish_reason {resume.finish_reason!r} with a generated last token"
        )
    if resume.prompt_ids.tolist() != prompt:
        raise InvalidRequest("resume.prompt_ids differ from prompt_ids")
    if resume.num_tokens >= params.max_tokens:
        raise InvalidRequest(
            f"the resumed rollout already has {resume.num_tokens} completion tokens and max_tokens "
            f"is {params.max_tokens}; nothing is left to generate (max_tokens bounds the whole "
            "completion: pass len(completion) + this turn's budget)"
        )

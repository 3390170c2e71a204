"""`RolloutEngine`: the seam every engine implements (the built-in one, vLLM, ...).

The runtime drives an engine from one generation loop (``add_request`` ... ``step``) while the
weight-sync layer calls ``update_weights`` whenever the trainer finishes an optimizer step. An
implementation must make those safe to call from two threads. The runtime, `tokenflow eval` and
`tokenflow bench` use nothing but what is declared here, and get an engine from
`tokenflow.engine.factory.make_engine` (``engine.backend``). `tests/engine/test_conformance.py`
is the contract, run against every backend.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from tokenflow.engine.sampling_params import SamplingParams
from tokenflow.engine.stats import EngineStats
from tokenflow.engine.loading.weights import NamedTensors
from tokenflow.rollout import Rollout


@dataclass
class TokenDelta:
    """Tokens one unfinished sample generated since they were last handed out (`new_tokens`)."""

    request_id: str
    sample_index: int
    token_ids: list[int]
    logprobs: list[float]
    """Behaviour log-probs of ``token_ids`` (as `Rollout.logprobs`)."""
    top_logprobs: list[tuple[np.ndarray, np.ndarray]] | None = None
    """As `Rollout.top_logprobs`, for these tokens; None unless the request asked."""


@runtime_checkable
class RolloutEngine(Protocol):
    version: int
    """Policy version (optimizer steps applied) of the weights now in use."""
    vocab_size: int
    max_model_len: int
    """Longest sequence (prompt + completion) in tokens."""
    tokenizer: object | None
    """The model's Hugging Face tokenizer (None if the folder has none): ``Rollout.text`` and
    stop strings use it."""
    stats: EngineStats
    """Counters the runtime reads once a second (tokens, steps, seconds). A backend fills what
    it can measure; `tokenflow bench` and the engine metrics read them."""

    @property
    def num_running(self) -> int:
        """Samples being decoded now (for the engine status the runtime reports)."""
        ...

    @property
    def num_waiting(self) -> int:
        """Samples queued and not yet started."""
        ...

    def add_request(self, prompt_ids: list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, *, resume: Rollout | None = None,
                    group_id: int = 0, prompt_id: int = -1) -> str:
        """Called by the runtime whenever admission control lets a prompt in (its n samples
        form one group), to resubmit a partial rollout returned after an abort (``resume``),
        and to start the next model turn of a multi-turn rollout (``resume`` ending in
        environment tokens, `Rollout.append_environment`): the engine continues prompt +
        ``resume.completion_ids`` exactly and returns ``resume`` extended by the new tokens
        (docs/engine.md, "Continuing a sequence"). Validates at once: a bad request raises
        `InvalidRequest` and changes nothing. Returns the request id."""
        ...

    def step(self) -> list[Rollout]:
        """Called in a loop by the generation worker while `has_unfinished` is true. Does one
        unit of work (a prefill or a decode step) and returns the rollouts that finished in it,
        so rollouts stream to the scorer as they complete."""
        ...

    def new_tokens(self, request_ids: Collection[str]) -> list[TokenDelta]:
        """Called by a streaming front end (`tokenflow serve`) after `step`: for every unfinished
        sample of ``request_ids``, the tokens it generated since the previous call handed them
        out (samples with none are left out). A sample's remaining tokens come with its
        `Rollout` when it finishes, so a caller that counts what it received can complete the
        stream from the rollout. Costs nothing for requests not named."""
        ...

    def has_unfinished(self) -> bool:
        """Called by the generation loop to decide whether to keep stepping or to wait for
        new prompts."""
        ...

    def update_weights(self, named_tensors: NamedTensors, version: int, *, mode: str | None = None,
                       recompute_kv: bool | None = None, checksum: str | None = None) -> dict:
        """Called by the weight-sync layer after each optimizer step, possibly while `step`
        runs in another thread (the swap then lands between two steps). ``mode`` is
        "inflight", "abort" or "drain" (see `tokenflow.engine.builtin.weight_update`). Missing,
        unexpected or mis-shaped tensors, or a ``checksum`` mismatch, raise
        `WeightUpdateError` and leave weights and version unchanged. Returns a report dict
        with at least ``mode``, ``applied``, ``pending`` and ``seconds``."""
        ...

    def pause(self) -> None:
        """Called when generation must stop without losing state (blocking sync, shutdown of a
        training phase): `step` does no work until `resume`."""
        ...

    def resume(self) -> None:
        """Called to undo `pause`."""
        ...

    def abort(self, request_id: str) -> int:
        """Called when a request is no longer wanted (timeout, cancelled run): its samples come
        back from the next `step` as partial rollouts with finish reason "abort"."""
        ...

    def generate(self, prompts: list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[list[Rollout]]:
        """Blocking form, used by evaluation and benchmarks: ``result[i]`` holds prompt i's
        samples ordered by ``sample_index``. Every request is validated before any is queued."""
        ...

    def weights_checksum(self) -> str:
        """`tokenflow.engine.weights_checksum` of the weights in use, under Hugging Face names
        (tests and checksummed syncs compare it with the trainer's)."""
        ...

    def close(self) -> None:
        """Called once when the worker stops: release what the backend holds (threads, memory)."""
        ...



def collect_samples(engine, index: dict[str, int], num_samples: int) -> tuple[list[list[Rollout]], list[Rollout]]:
    """The loop behind a blocking ``generate``: step ``engine`` until the ``num_samples`` samples
    of the requests in ``index`` (request id -> prompt position) are back. Returns them per prompt,
    ordered by sample index, and the other callers' rollouts that finished meanwhile (for the
    engine to hand out at its next `step`). The engine's lock is taken per step, not for the
    loop, so a weight update from another thread still lands between two steps."""
    import time

    results: list[list[Rollout]] = [[] for _ in range(len(set(index.values())))]
    others: list[Rollout] = []
    while num_samples:
        finished = engine.step()
        if not finished and engine.paused:
            time.sleep(0.01)  # paused from another thread: wait for resume() without spinning
        for rollout in finished:
            i = index.get(rollout.request_id)
            if i is None:
                others.append(rollout)
            else:
                results[i].append(rollout)
                num_samples -= 1
    return [sorted(r, key=lambda x: x.sample_index) for r in results], others

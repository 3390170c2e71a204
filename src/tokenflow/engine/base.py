"""`RolloutEngine`: the seam every engine implements (the built-in one, vLLM, ...).

The runtime drives an engine from one generation loop (``add_request`` ... ``step``) while the
weight-sync layer calls ``update_weights`` whenever the trainer finishes an optimizer step. An
implementation must make those safe to call from two threads.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tokenflow.engine.sampling_params import SamplingParams
from tokenflow.engine.weights import NamedTensors
from tokenflow.rollout import Rollout


@runtime_checkable
class RolloutEngine(Protocol):
    version: int
    """Policy version (optimizer steps applied) of the weights now in use."""
    vocab_size: int

    def add_request(self, prompt_ids: list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, *, resume: Rollout | None = None,
                    group_id: int = 0, prompt_id: int = -1) -> str:
        """Called by the runtime whenever admission control lets a prompt in (its n samples
        form one group), and to resubmit a partial rollout returned after an abort
        (``resume``). Validates at once: a bad request raises `InvalidRequest` and changes
        nothing. Returns the request id."""
        ...

    def step(self) -> list[Rollout]:
        """Called in a loop by the generation worker while `has_unfinished` is true. Does one
        unit of work (a prefill or a decode step) and returns the rollouts that finished in it,
        so rollouts stream to the scorer as they complete."""
        ...

    def has_unfinished(self) -> bool:
        """Called by the generation loop to decide whether to keep stepping or to wait for
        new prompts."""
        ...

    def update_weights(self, named_tensors: NamedTensors, version: int, *, mode: str | None = None,
                       recompute_kv: bool | None = None, checksum: str | None = None) -> dict:
        """Called by the weight-sync layer after each optimizer step, possibly while `step`
        runs in another thread (the swap then lands between two steps). ``mode`` is
        "inflight", "abort" or "drain" (see `tokenflow.engine.weight_update`). Missing,
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

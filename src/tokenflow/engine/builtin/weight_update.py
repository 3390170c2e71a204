"""`Engine.update_weights`: validate, verify, then swap in one of three modes.

Each function takes the built-in `tokenflow.engine.builtin.llm_engine.Engine` (untyped here: that module
imports this one).

* ``inflight``: swap now (between two steps); running sequences keep their KV cache (or
  recompute it, if asked) and their later tokens carry the new version.
* ``abort``: running sequences stop and come back from the next `step` as partial rollouts
  (finish reason "abort"); waiting requests stay queued and run under the new weights.
* ``drain``: admit nothing new; the tensors are staged (copied, since a trainer may keep
  updating its own in place) and swapped in at the first step with an empty running batch.

Every check runs before anything changes: on a refused update the engine keeps its weights and
version. A newer update supersedes a staged (drain) one.

Parked KV caches (finished turns kept for their continuation) are treated like the running
sequences' caches: kept across an update, so a continuation attends to keys computed under the
weights of its earlier turns, unless a KV recompute is requested; then they are dropped at the
swap (their continuations prefill everything under the new weights).
"""

from __future__ import annotations

import logging
import time

import torch

from tokenflow.engine.backends import UPDATE_MODES
from tokenflow.engine.errors import WeightUpdateError
from tokenflow.engine.loading.weights import (
    NamedTensors,
    as_dict,
    check_weights,
    weights_checksum,
)
from tokenflow.metrics.trace import record

logger = logging.getLogger(__name__)

MODES = UPDATE_MODES


def apply_update(engine, named_tensors: NamedTensors, version: int, *, mode: str | None,
                 recompute_kv: bool | None, checksum: str | None) -> dict:
    mode = mode or engine.config.update_mode
    if mode not in MODES:
        raise ValueError(f"update mode must be one of {MODES}, got {mode!r}")
    if mode == "blocking":  # the runtime takes turns; for the engine that is a drain
        mode = "drain"
    recompute = engine.config.recompute_kv_after_update if recompute_kv is None else recompute_kv
    start = time.perf_counter()
    named = engine.model.canonical_weights(as_dict(named_tensors))
    with engine.lock:
        check_weights(named, engine.expected_weights, engine.optional_weights)
        if checksum is not None:
            # Hash what arrived, before loading: a corrupt transfer is refused with nothing changed.
            got = weights_checksum(named)
            if got != checksum:
                raise WeightUpdateError(
                    f"weight update refused: checksum {got} does not match the expected {checksum}"
                )
        report = {"mode": mode, "version": version, "applied": False, "pending": False,
                  "aborted": 0, "recomputed": 0, "swap_seconds": 0.0}
        scheduler = engine.scheduler
        if mode == "drain" and scheduler.running:
            staged = {k: v.detach().to(engine.device, engine.dtype, copy=True) for k, v in named.items()}
            engine.pending_update = (staged, version, recompute)
            scheduler.admitting = False
            report["pending"] = True
        else:
            engine.pending_update = None
            scheduler.admitting = True
            if mode == "abort":
                seqs = scheduler.abort_running()
                engine.outbox.extend(engine.finish_sequence(s) for s in seqs)
                report["aborted"] = len(seqs)
            report["swap_seconds"] = swap(engine, named, version)
            engine.runner.apply_moves(scheduler.take_moves())
            if recompute:
                engine.runner.parked.clear()
            if mode == "inflight" and recompute and scheduler.running:
                engine.runner.recompute(scheduler.running)
                report["recomputed"] = len(scheduler.running)
            report["applied"] = True
    report["seconds"] = time.perf_counter() - start
    logger.debug("engine: weight update to version %d (%s): %s", version, mode,
                "applied" if report["applied"] else "pending until the running batch drains")
    return report


def swap(engine, named: dict[str, torch.Tensor], version: int) -> float:
    """Copy the tensors into the model and take on their version; returns the seconds taken."""
    wall, start = time.time(), time.perf_counter()
    engine.model.load_weights(named.items())
    engine.version = version
    seconds = time.perf_counter() - start
    engine.stats.weight_swaps += 1
    engine.stats.last_weight_swap_seconds = seconds
    record("engine/weight_swap", wall, seconds, version=version)
    return seconds


def apply_pending(engine) -> None:
    """Swap in a staged (drain) update once the running batch is empty; admit again."""
    named, version, recompute = engine.pending_update
    engine.pending_update = None
    swap(engine, named, version)
    if recompute:
        engine.runner.parked.clear()
    engine.scheduler.admitting = True
    logger.debug("engine: drained, now at version %d", version)

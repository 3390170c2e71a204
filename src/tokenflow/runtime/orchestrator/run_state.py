"""A run's state in the orchestrator: what a checkpoint saves, how a resume restores it, and the
summary the run ends with.

    checkpoint: ``state_of`` + the buffer's state, taken and committed by
        `tokenflow.runtime.orchestrator.checkpoints` (in the background) as ``checkpoints/step_N``
    resume: ``RunDir.load_checkpoint`` ──► ``restore`` (cursor, group ids, buffer, offsets, the
        in-flight rollouts the checkpoint kept)

Each function takes the `Orchestrator` whose state it reads or writes.
"""

from __future__ import annotations

import logging
import time


log = logging.getLogger(__name__)


class RunFailed(RuntimeError):
    """The run cannot go on; the message says why (the last checkpoint is intact)."""


def restore(orch, state: dict, buffer_state: dict) -> None:
    orch.step = state["step"]
    orch.cursor = state["cursor"]
    orch.next_group_id = state["next_group_id"]
    orch.baseline_accuracy = state["baseline_accuracy"]
    orch.wall_offset = state["wall_s"]
    orch.elapsed_offset = state.get("elapsed_s", state["wall_s"])
    orch.tokens_offset = state.get("tokens_generated", 0)
    orch.dropped_prompt_ids = list(state.get("dropped_prompt_ids", []))
    orch.buffer.load_state_dict(buffer_state)
    orch.engine_versions = {k: orch.step for k in orch.engine_versions}
    # The engines start with the checkpoint's weights. The saved buffer may predate their
    # loading that version (a periodic checkpoint is taken as the step ends); left there, a
    # synchronous run would wait for ever for a WeightsLoaded that never comes.
    orch.buffer.set_engine_version(orch.step)
    for gid, pid in orch.buffer.in_flight.items():
        orch.prompts[gid] = orch.task.train_prompt(pid)


def state_of(orch) -> dict:
    return {"step": orch.step, "cursor": orch.cursor, "next_group_id": orch.next_group_id,
            "baseline_accuracy": orch.baseline_accuracy, "wall_s": orch.wall_s(),
            "elapsed_s": orch.elapsed_offset + time.monotonic() - orch.t_start,
            "tokens_generated": orch.tokens_offset + orch.engine_totals.total("tokens"),
            "dropped_prompt_ids": list(orch.dropped_prompt_ids)}


def summary(orch, final: float, train_wall: float, total_s: float) -> dict:
    """``summary.json``: the whole run's figures (earlier invocations included, after a resume)."""
    window = train_wall - orch.wall_offset
    return {
        "baseline_accuracy": orch.baseline_accuracy, "final_accuracy": final,
        "steps": orch.step, "wall_s": round(orch.elapsed_offset + total_s, 3), "train_wall_s": round(train_wall, 3),
        "mode": "sync" if orch.cfg.rollout.max_staleness == 0 else "async",
        "max_staleness": orch.cfg.rollout.max_staleness,
        "update_mode": orch.cfg.engine.update_mode,
        "trainer_idle_frac": orch.idle.trainer_idle(window),
        "engine_idle_frac": orch.idle.engine_idle(orch.engine_totals),
        "tokens_generated": orch.tokens_offset + orch.engine_totals.total("tokens"),
        "in_flight_prompt_ids": sorted(orch.buffer.in_flight.values()),
        "last_reward_mean": orch.last_progress.get("reward"),
        "token_age_histogram": {str(a): c for a, c in sorted(orch.buffer.stats.age_histogram.items())},
        "checkpointing": orch.checkpoints.summary(),
        "inflight_on_resume": orch.resume_counts,
    }

"""A run's state in the orchestrator: what a checkpoint saves, how a resume restores it, and the
summary the run ends with.

    checkpoint ──Save(staging)──► trainer writes model + optimizer ──Saved──► on_saved commits
        staging + ``state_of`` + the buffer's state as ``checkpoints/step_N`` (``run.run_dir``)
    resume: ``RunDir.load_checkpoint`` ──► ``restore`` (cursor, group ids, buffer, offsets)

Each function takes the `Orchestrator` whose state it reads or writes.
"""

from __future__ import annotations

import logging
import time

from tokenflow.runtime.workers import messages as M

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


def checkpoint(orch) -> None:
    """Ask the trainer to save into a staging folder; `on_saved` commits it."""
    staging = orch.run_dir.staging_dir(orch.step)
    orch._pending_checkpoint = (staging, orch.step, state_of(orch), orch.buffer.state_dict())
    orch.trainer_busy = True
    orch.last_msg_from[orch.backend.trainer.name] = time.monotonic()
    orch.backend.trainer.send(M.Save(str(staging)))


def on_saved(orch, msg: M.Saved) -> None:
    from tokenflow.runtime.run.run_dir import CheckpointError

    staging, step, state, buffer_state = orch._pending_checkpoint
    try:
        path = orch.run_dir.commit_checkpoint(staging, step, state, buffer_state, orch.cfg.run.keep_checkpoints)
    except CheckpointError as e:
        raise RunFailed(str(e)) from None
    log.debug("checkpoint %s", path)
    orch._pending_checkpoint = None
    orch.trainer_busy = False
    orch._maybe_unpause()  # blocking mode: a load that landed during the save unpauses nothing


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
    }

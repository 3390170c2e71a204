"""A run's state in the orchestrator, typed: every field the loop and its helpers share is
declared and documented here, where it is born. What a checkpoint saves, how a resume restores
it, and the summary the run ends with are read from it too.

    checkpoint: ``state_of`` + the buffer's state, taken and committed by
        `tokenflow.runtime.orchestrator.checkpoints` (in the background) as ``checkpoints/step_N``
    resume: ``RunDir.load_checkpoint`` ──► ``restore`` (cursor, group ids, buffer, offsets, the
        in-flight rollouts the checkpoint kept)

The orchestrator builds one `RunState`; its helpers (inbox, checkpoints, healing, elasticity,
routing, the run tracer) receive it and the backend, never the orchestrator.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tokenflow.buffer import RolloutBuffer
from tokenflow.runtime.orchestrator.calibration_log import CalibrationLog
from tokenflow.runtime.orchestrator.step_metrics import EngineTotals, IdleClock
from tokenflow.runtime.run.run_dir import RunDir
from tokenflow.runtime.workers import messages as M

log = logging.getLogger(__name__)


class RunFailed(RuntimeError):
    """The run cannot go on; the message says why (the last checkpoint is intact)."""


@dataclass
class RunState:
    """What the orchestrator's loop and its helpers share for one invocation of a run."""

    # ---- fixed for the run -------------------------------------------------------------------
    cfg: Any  # the resolved TrainConfig
    run_dir: RunDir
    task: Any  # the Task: train_prompt(i), eval_prompts(), reward_spec
    buffer: RolloutBuffer  # admission, readiness, versions, token ages
    encode: Callable[[str], list[int]]  # a prompt's ids (through the chat template when asked)
    train_params: Any  # SamplingParams of a training group (its seed set per prompt)
    blocking: bool  # engine.update_mode == "blocking": engines pause while the trainer steps

    # ---- where the run is (saved in a checkpoint: `state_of`) ---------------------------------
    step: int = 0  # the last trained step (= the trainer's policy version)
    cursor: int = 0  # the next training prompt's index in the task's stream
    next_group_id: int = 0  # training groups count up from 0; held-out ones are negative
    baseline_accuracy: float | None = None  # the starting model's held-out accuracy (step 0)
    # What earlier invocations of this run did (up to the checkpoint resumed from), so that
    # summary.json covers the whole run, not only the last call.
    wall_offset: float = 0.0  # training-window seconds before this invocation
    elapsed_offset: float = 0.0  # process seconds before this invocation
    tokens_offset: int = 0  # tokens generated before this invocation
    dropped_prompt_ids: list[int] = field(default_factory=list)  # by dynamic sampling, since the last batch

    # ---- groups in flight ----------------------------------------------------------------------
    prompts: dict[int, Any] = field(default_factory=dict)  # group id -> Prompt, for in-flight groups
    group_engine: dict[int, tuple[Any, int]] = field(default_factory=dict)  # group id -> (engine, samples)
    scoring: dict[int, list] = field(default_factory=dict)  # group id -> rollouts being scored (training)
    kept: dict[int, tuple] = field(default_factory=dict)  # group id -> rollouts a checkpoint kept (resume)
    pending_batch: tuple[list[int], list[int], dict] | None = None  # (prompt ids, dropped ids, metrics) of the step training

    # ---- the workers ---------------------------------------------------------------------------
    trainer_busy: bool = True  # a Train or Save is outstanding (or the trainer is still loading)
    trainer_ready: bool = False  # TrainerReady came (it may come after the window opens)
    num_parameters: int | None = None  # the trainer's model size (TrainerReady)
    sync_spec: Any = None  # from TrainerReady; re-sent to an engine that restarts
    sync_broken: tuple[float, M.SyncBroken] | None = None  # a failed push awaiting a re-formed group
    engine_versions: dict[str, int] = field(default_factory=dict)  # engine -> policy version it holds
    last_msg_from: dict[str, float] = field(default_factory=dict)  # worker -> monotonic time last heard
    booted: set[str] = field(default_factory=set)  # workers that sent WorkerBooted
    worker_marks: dict[str, float] = field(default_factory=dict)  # start-up marks the workers sent

    # ---- figures -------------------------------------------------------------------------------
    engine_totals: EngineTotals = field(default_factory=EngineTotals)  # each engine's latest counters
    idle: IdleClock = field(default_factory=IdleClock)  # busy time → idle fractions
    calibration: CalibrationLog = field(default_factory=CalibrationLog)  # samples for `tokenflow simulate`
    sync_timings: list[dict] = field(default_factory=list)  # weight loads since the last step's row
    live_figures: dict[str, float] = field(default_factory=dict)  # the live view's latest rates
    last_progress: dict = field(default_factory=dict)  # the last step's reward and token ages
    last_eval: float | None = None  # the latest held-out accuracy
    resume_counts: dict[str, int] | None = None  # what a resume kept and generated again
    t_start: float = field(default_factory=time.monotonic)  # this invocation's start
    t_train0: float | None = None  # the training window's start (None before it opens)
    last_step_wall: float = 0.0  # wall_s() at the last step's end

    def wall_s(self) -> float:
        """Seconds of training window, earlier invocations included."""
        return self.wall_offset + (time.monotonic() - self.t_train0 if self.t_train0 is not None else 0.0)

    def tokens_generated(self) -> float:
        return self.tokens_offset + self.engine_totals.total("tokens")


def restore(state: RunState, saved: dict, buffer_state: dict) -> None:
    state.step = saved["step"]
    state.cursor = saved["cursor"]
    state.next_group_id = saved["next_group_id"]
    state.baseline_accuracy = saved["baseline_accuracy"]
    state.wall_offset = saved["wall_s"]
    state.elapsed_offset = saved.get("elapsed_s", saved["wall_s"])
    state.tokens_offset = saved.get("tokens_generated", 0)
    state.dropped_prompt_ids = list(saved.get("dropped_prompt_ids", []))
    state.buffer.load_state_dict(buffer_state)
    state.engine_versions = {k: state.step for k in state.engine_versions}
    # The engines start with the checkpoint's weights. The saved buffer may predate their
    # loading that version (a periodic checkpoint is taken as the step ends); left there, a
    # synchronous run would wait for ever for a WeightsLoaded that never comes.
    state.buffer.set_engine_version(state.step)
    for gid, pid in state.buffer.in_flight.items():
        state.prompts[gid] = state.task.train_prompt(pid)


def state_of(state: RunState) -> dict:
    return {"step": state.step, "cursor": state.cursor, "next_group_id": state.next_group_id,
            "baseline_accuracy": state.baseline_accuracy, "wall_s": state.wall_s(),
            "elapsed_s": state.elapsed_offset + time.monotonic() - state.t_start,
            "tokens_generated": state.tokens_generated(),
            "dropped_prompt_ids": list(state.dropped_prompt_ids)}


def summary(state: RunState, final: float, train_wall: float, total_s: float, checkpointing: dict) -> dict:
    """``summary.json``: the whole run's figures (earlier invocations included, after a resume)."""
    window = train_wall - state.wall_offset
    cfg = state.cfg
    return {
        "baseline_accuracy": state.baseline_accuracy, "final_accuracy": final,
        "steps": state.step, "wall_s": round(state.elapsed_offset + total_s, 3), "train_wall_s": round(train_wall, 3),
        "mode": "sync" if cfg.rollout.max_staleness == 0 else "async",
        "max_staleness": cfg.rollout.max_staleness,
        "update_mode": cfg.engine.update_mode,
        "trainer_idle_frac": state.idle.trainer_idle(window),
        "engine_idle_frac": state.idle.engine_idle(state.engine_totals),
        "tokens_generated": state.tokens_generated(),
        "in_flight_prompt_ids": sorted(state.buffer.in_flight.values()),
        "last_reward_mean": state.last_progress.get("reward"),
        "token_age_histogram": {str(a): c for a, c in sorted(state.buffer.stats.age_histogram.items())},
        "checkpointing": checkpointing,
        "inflight_on_resume": state.resume_counts,
    }

"""The orchestrator's inbox: every message a worker sends, routed to what it changes, and the
watchdog that turns a silent worker into a clear failure.

    engine ──Generated──► scorer pool (train) / held-out round (eval)
           ──WeightsLoaded──► buffer's engine version      ──EngineStatus──► live figures
    trainer ──TrainerReady──► engines attach to the weight sync   ──Trained──► step
            ──Saved / SaveWritten──► checkpoints      engine ──InFlight──► checkpoints
    any ──WorkerFailed──► RunFailed     Ray ──WorkerRestarted / SyncBroken / SyncReformed──► restarts
    trainer ──RelayedNotice──► a replaced engine (healing.py)
"""

from __future__ import annotations

import logging
import time

from tokenflow.errors import CheckpointError
from tokenflow.metrics import phases
from tokenflow.runtime.orchestrator.restarts import attach_reformed, resend_after_restart
from tokenflow.runtime.orchestrator.run_state import RunFailed
from tokenflow.runtime.workers import messages as M

log = logging.getLogger(__name__)


def handle(orch, worker: str, msg) -> None:
    """Apply one message from ``worker`` to the orchestrator's state."""
    if isinstance(msg, M.Generated):
        sent = orch.group_engine.pop(msg.group_id, None)
        if sent is None and msg.kind == "train":
            return  # not outstanding: a second copy after an engine restart, or aborted work
        if sent is not None:
            engine, n = sent
            engine.load -= n  # not len(rollouts): a multi-row episode brings more rows
        if msg.kind == "eval":
            orch.heldout.on_generated(msg.group_id, msg.rollouts)
            return
        prompt = orch.prompts[msg.group_id]
        for r in msg.rollouts:
            r.info["engine"] = worker  # provenance: which engine (of a changing set) generated it
        orch.scoring[msg.group_id] = msg.rollouts  # whole: a checkpoint taken meanwhile keeps them
        orch.calibration.rollouts(msg.rollouts)
        orch.scorer.submit(msg.rollouts, prompt.text, prompt.example, group_id=msg.group_id)
    elif isinstance(msg, M.Trained):
        if not orch.healer.replayed(msg):  # a replaced trainer's replay was logged the first time
            orch._on_trained(msg)
    elif isinstance(msg, M.WeightsLoaded):
        orch.engine_versions[worker] = msg.version
        orch.buffer.set_engine_version(min(orch.engine_versions.values()))
        orch.sync_timings.append(msg.timings)
        orch._maybe_unpause()
    elif isinstance(msg, M.EngineStatus):
        orch.engine_totals.update(worker, msg)
        orch.calibration.engine_status(msg)
        orch._show_live()
    elif isinstance(msg, M.Saved):
        orch.checkpoints.on_saved(msg)
    elif isinstance(msg, M.SaveWritten):
        orch.checkpoints.on_written(msg)
    elif isinstance(msg, M.InFlight):
        orch.checkpoints.on_inflight(worker, msg)
    elif isinstance(msg, M.WorkerBooted):
        orch.booted.add(worker)
        orch.worker_marks.update(msg.marks)
        orch.healer.booted(worker)
    elif isinstance(msg, M.TrainerReady):
        phases.mark("trainer_ready")
        orch.trainer_busy = False
        orch.trainer_ready = True
        orch.num_parameters = msg.num_parameters
        orch.sync_spec = msg.sync_spec
        for i, engine in enumerate(orch.backend.engines):
            engine.send(M.AttachSync(msg.sync_spec, receiver_index=i))
        orch.healer.trainer_ready()  # a replaced trainer replays first
    elif isinstance(msg, M.RelayedNotice):
        orch.healer.relay(msg)
    elif isinstance(msg, M.WorkerRestarted):
        orch.checkpoints.engine_gone(msg.worker)
        resend_after_restart(orch, msg)
    elif isinstance(msg, M.SyncBroken):
        if not orch.backend.restarts_engines:
            raise RunFailed(f"the weight push of version {msg.version} failed: {msg.error}")
        log.warning("the weight push of version %d failed; the weight-sync group is re-formed once the "
                    "engine is back (%s)", msg.version, msg.error.splitlines()[0])
        orch.sync_broken = (time.monotonic(), msg)
    elif isinstance(msg, M.SyncReformed):
        attach_reformed(orch, msg)
    elif isinstance(msg, M.WorkerFailed):
        if msg.user_error:  # a run folder's file that does not read: the message says which and what to do
            raise CheckpointError(msg.error.split(": ", 1)[-1])
        raise RunFailed(f"the {msg.worker} worker failed: {msg.error}\n{msg.traceback}")
    else:
        raise TypeError(f"orchestrator got an unknown message {type(msg).__name__} from {worker}")


def check_timeouts(orch) -> None:
    """Fail the run when a worker has been silent past ``runtime.worker_timeout_s``."""
    limit = orch.cfg.runtime.worker_timeout_s
    now = time.monotonic()
    if orch.sync_broken is not None and now - orch.sync_broken[0] > limit:
        raise RunFailed(f"the weight push of version {orch.sync_broken[1].version} failed and no engine came "
                        f"back within {limit:g}s (runtime.worker_timeout_s): {orch.sync_broken[1].error}")
    for name, t in orch.last_msg_from.items():
        if name == orch.backend.trainer.name and not orch.trainer_busy:
            continue  # an idle trainer has nothing to say; it answers every Train and Save
        if now - t > limit:
            raise RunFailed(f"the {name} worker sent nothing for {now - t:.0f}s "
                            f"(runtime.worker_timeout_s = {limit:g}); it is hung or overloaded")

"""The orchestrator's inbox: every message a worker sends, routed to what it changes, and the
watchdog that turns a silent worker into a clear failure.

    engine ──Generated──► scorer pool (train) / held-out round (eval)
           ──WeightsLoaded──► buffer's engine version      ──EngineStatus──► live figures
    trainer ──TrainerReady──► engines attach to the weight sync   ──Trained──► the step's end
            ──Saved / SaveWritten──► checkpoints      engine ──InFlight──► checkpoints
    any ──WorkerFailed──► RunFailed     Ray ──WorkerRestarted / SyncBroken / SyncReformed──► routing
    trainer ──RelayedNotice──► a replaced engine (healing.py)

The inbox changes the `RunState`; what ends a step (metrics, the ledger, the next checkpoint) is
the loop's, reached through the ``on_trained`` callback it is given.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from tokenflow.errors import CheckpointError
from tokenflow.metrics import phases
from tokenflow.runtime.backends.protocol import Backend
from tokenflow.runtime.orchestrator import routing
from tokenflow.runtime.orchestrator.checkpoints import Checkpointer
from tokenflow.runtime.orchestrator.healing import Healer
from tokenflow.runtime.orchestrator.heldout import HeldOutEval
from tokenflow.runtime.orchestrator.run_state import RunFailed, RunState
from tokenflow.runtime.workers import messages as M

log = logging.getLogger(__name__)


class Inbox:
    def __init__(self, state: RunState, backend: Backend, *, scorer, heldout: HeldOutEval,
                 checkpoints: Checkpointer, healer: Healer, on_trained: Callable[[M.Trained], None],
                 on_status: Callable[[], None]) -> None:
        """``on_trained``: the loop's end of a step; ``on_status``: the live view's refresh."""
        self.state, self.backend, self.scorer, self.heldout = state, backend, scorer, heldout
        self.checkpoints, self.healer = checkpoints, healer
        self.on_trained, self.on_status = on_trained, on_status

    def handle(self, worker: str, msg) -> None:
        """Apply one message from ``worker`` to the run's state."""
        s, backend = self.state, self.backend
        if isinstance(msg, M.Generated):
            self._generated(worker, msg)
        elif isinstance(msg, M.Trained):
            if not self.healer.replayed(msg):  # a replaced trainer's replay was logged the first time
                self.on_trained(msg)
        elif isinstance(msg, M.WeightsLoaded):
            s.engine_versions[worker] = msg.version
            s.buffer.set_engine_version(min(s.engine_versions.values()))
            s.sync_timings.append(msg.timings)
            routing.maybe_unpause(s, backend)
        elif isinstance(msg, M.EngineStatus):
            s.engine_totals.update(worker, msg)
            s.calibration.engine_status(msg)
            self.on_status()
        elif isinstance(msg, M.Saved):
            self.checkpoints.on_saved(msg)
        elif isinstance(msg, M.SaveWritten):
            self.checkpoints.on_written(msg)
        elif isinstance(msg, M.InFlight):
            self.checkpoints.on_inflight(worker, msg)
        elif isinstance(msg, M.WorkerBooted):
            s.booted.add(worker)
            s.worker_marks.update(msg.marks)
            self.healer.booted(worker)
        elif isinstance(msg, M.TrainerReady):
            phases.mark("trainer_ready")
            s.trainer_busy = False
            s.trainer_ready = True
            s.num_parameters = msg.num_parameters
            s.sync_spec = msg.sync_spec
            for i, engine in enumerate(backend.engines):
                engine.send(M.AttachSync(msg.sync_spec, receiver_index=i))
            self.healer.trainer_ready()  # a replaced trainer replays first
        elif isinstance(msg, M.RelayedNotice):
            self.healer.relay(msg)
        elif isinstance(msg, M.WorkerRestarted):
            self.checkpoints.engine_gone(msg.worker)
            routing.resend_after_restart(s, backend, self.heldout, msg)
        elif isinstance(msg, M.SyncBroken):
            if not backend.restarts_engines:
                raise RunFailed(f"the weight push of version {msg.version} failed: {msg.error}")
            log.warning("the weight push of version %d failed; the weight-sync group is re-formed once the "
                        "engine is back (%s)", msg.version, msg.error.splitlines()[0])
            s.sync_broken = (time.monotonic(), msg)
        elif isinstance(msg, M.SyncReformed):
            routing.attach_reformed(s, backend, msg)
        elif isinstance(msg, M.WorkerFailed):
            if msg.user_error:  # a run folder's file that does not read: the message says which and what to do
                raise CheckpointError(msg.error.split(": ", 1)[-1])
            raise RunFailed(f"the {msg.worker} worker failed: {msg.error}\n{msg.traceback}")
        else:
            raise TypeError(f"orchestrator got an unknown message {type(msg).__name__} from {worker}")

    def _generated(self, worker: str, msg: M.Generated) -> None:
        s = self.state
        sent = s.group_engine.pop(msg.group_id, None)
        if sent is None and msg.kind == "train":
            return  # not outstanding: a second copy after an engine restart, or aborted work
        if sent is not None:
            engine, n = sent
            engine.load -= n  # not len(rollouts): a multi-row episode brings more rows
        if msg.kind == "eval":
            self.heldout.on_generated(msg.group_id, msg.rollouts)
            return
        prompt = s.prompts[msg.group_id]
        for r in msg.rollouts:
            r.info["engine"] = worker  # provenance: which engine (of a changing set) generated it
        s.scoring[msg.group_id] = msg.rollouts  # whole: a checkpoint taken meanwhile keeps them
        s.calibration.rollouts(msg.rollouts)
        self.scorer.submit(msg.rollouts, prompt.text, prompt.example, group_id=msg.group_id)

    def check_timeouts(self) -> None:
        """Fail the run when a worker has been silent past ``runtime.worker_timeout_s``."""
        s = self.state
        limit = s.cfg.runtime.worker_timeout_s
        now = time.monotonic()
        if s.sync_broken is not None and now - s.sync_broken[0] > limit:
            raise RunFailed(f"the weight push of version {s.sync_broken[1].version} failed and no engine came "
                            f"back within {limit:g}s (runtime.worker_timeout_s): {s.sync_broken[1].error}")
        for name, t in s.last_msg_from.items():
            if name == self.backend.trainer.name and not s.trainer_busy:
                continue  # an idle trainer has nothing to say; it answers every Train and Save
            if now - t > limit:
                raise RunFailed(f"the {name} worker sent nothing for {now - t:.0f}s "
                                f"(runtime.worker_timeout_s = {limit:g}); it is hung or overloaded")

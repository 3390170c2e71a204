"""Replacing a dead worker while the run goes on (``runtime.max_worker_restarts``).

    backend.check() ──WorkerDied(worker)──► Healer.heal ──► RestartPolicy: at most N each, not again within the window
      engine  ─► backend.replace_engine (new process, new queues) ─► the trainer relays its notices to it
              ─► routing.resend_after_restart: sync attach (the newest weights first), its groups again
      trainer ─► backend.replace_trainer(last checkpoint C) ──TrainerReady──► replay Train C+1..S
              (the same batches, no push, nothing logged) ─► PushWeights (version S) ─► the step or
              checkpoint that was in flight, again
    scorer pool ──ScorerDied──► pool.restart(): a new pool scores every pending group again

Why replay: steps C+1..S were trained, logged and written to the ledger, and the engines already
generate with version S. Re-training the same batches from checkpoint C gives the trainer the
weights it had (bit for bit on CPU), so nothing already written is undone and no prompt is
consumed twice; the rollouts generated meanwhile under version S stay valid. The batches since
the last committed checkpoint are kept here for that (``run.checkpoint_every`` bounds them).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter

from tokenflow.errors import WorkerDied
from tokenflow.runtime.backends.protocol import Backend
from tokenflow.runtime.orchestrator.checkpoints import Checkpointer
from tokenflow.runtime.orchestrator.heldout import HeldOutEval
from tokenflow.runtime.orchestrator.routing import resend_after_restart
from tokenflow.runtime.orchestrator.run_state import RunFailed, RunState
from tokenflow.runtime.workers import messages as M

log = logging.getLogger("tokenflow.runtime.orchestrator.orchestrator")


class RestartPolicy:
    """How often each worker may be replaced: ``max_restarts`` times in the run, and not again
    within ``window_s`` seconds of its last replacement (a crash loop stops the run)."""

    def __init__(self, max_restarts: int, window_s: float, clock=time.monotonic) -> None:
        self.max_restarts, self.window_s, self.clock = max_restarts, window_s, clock
        self.counts: Counter = Counter()
        self.last: dict[str, float] = {}

    def admit(self, worker: str, error: Exception) -> int:
        """Count a replacement of ``worker`` (its number), or raise ``WorkerDied`` saying why not."""
        n, now = self.counts[worker], self.clock()
        if n >= self.max_restarts:
            why = (f"runtime.max_worker_restarts = {self.max_restarts}" if not n else
                   f"it was replaced {n} time{'s' * (n != 1)} already (runtime.max_worker_restarts = {self.max_restarts})")
            raise WorkerDied(f"{error}; not replaced: {why}", worker=worker)
        if self.window_s and worker in self.last and now - self.last[worker] < self.window_s:
            raise WorkerDied(f"{error}; not replaced: it died again {now - self.last[worker]:.1f}s after it was "
                             f"replaced (runtime.restart_window_s = {self.window_s:g})", worker=worker)
        self.counts[worker] += 1
        self.last[worker] = now
        return self.counts[worker]


def _role(worker: str) -> str:
    """The unit that is replaced: every trainer rank goes together."""
    return "trainer" if worker.startswith("trainer") else worker


class Healer:
    """The run's replacements of dead workers; one per run."""

    def __init__(self, state: RunState, backend: Backend, *, scorer, checkpoints: Checkpointer,
                 heldout: HeldOutEval) -> None:
        rt = state.cfg.runtime
        self.state, self.backend, self.scorer = state, backend, scorer
        self.checkpoints, self.heldout = checkpoints, heldout
        self.policy = RestartPolicy(rt.max_worker_restarts, rt.restart_window_s)
        self.enabled = rt.max_worker_restarts > 0
        self.sent: list[M.Train] = []  # Train messages since the last committed checkpoint
        self.replay: list[M.Train] | None = None  # what a replaced trainer does before anything new
        self.resave: list[tuple[int, str]] = []  # (step, staging folder) of checkpoints the dead trainer never wrote
        self.booting: set[str] = set()  # replaced engines that have not sent WorkerBooted yet
        self.log_path = state.run_dir.root / "heal.jsonl"

    # ---- what the orchestrator tells us ------------------------------------------------------
    def train_sent(self, msg: M.Train) -> None:
        done = self._checkpoint_step()
        self.sent = [m for m in self.sent if m.step > done] + [msg]

    def replayed(self, msg: M.Trained) -> bool:
        """True for a replaced trainer's answer to a replayed step (the step was logged already)."""
        if msg.step > self.state.step:
            return False
        log.debug("trainer replayed step %d (loss %s)", msg.step, msg.metrics.get("loss/total"))
        return True

    def trainer_ready(self) -> None:
        """A replaced trainer is up (after ``TrainerReady``): replay, catch the engines up, go on."""
        replay, self.replay = self.replay, None
        if replay is None:
            return
        state, trainer = self.state, self.backend.trainer
        in_flight = replay[-1] if replay and replay[-1].step > state.step else None
        # Each unwritten checkpoint is saved again right after its own step is replayed, so
        # checkpoint N holds version N's weights beside step N's state (not the replay's end).
        resave = sorted(self.resave)
        for m in replay[:-1] if in_flight is not None else replay:
            while resave and resave[0][0] < m.step:
                self._save(resave.pop(0)[1])
            trainer.send(M.Train(m.step, m.rollouts, sync_weights=False))
        for _, staging in resave:
            self._save(staging)
        trainer.send(M.PushWeights())
        if in_flight is not None:
            trainer.send(in_flight)
        state.trainer_busy = in_flight is not None or bool(self.resave)
        self.resave = []
        self._note("trainer", "ready", replayed=len(replay) - (in_flight is not None))

    def _save(self, staging: str) -> None:
        self.backend.trainer.send(M.Save(staging, background=self.checkpoints.background))

    def booted(self, worker: str) -> None:
        """A replaced engine has loaded its model (``WorkerBooted``)."""
        if worker in self.booting:
            self.booting.discard(worker)
            self._note(worker, "ready")

    def relay(self, msg: M.RelayedNotice) -> None:
        self.backend.engines[msg.index].send(msg.notice)

    # ---- checks ------------------------------------------------------------------------------
    def check_workers(self) -> None:
        """``backend.check()``, replacing each dead worker the policy allows."""
        while True:
            try:
                self.backend.check()
                return
            except WorkerDied as e:
                if not self.enabled or e.worker is None:
                    raise
                self.heal(e)

    def poll_scored(self) -> list:
        """``scorer.poll()``, rebuilding the pool once if a scorer worker died."""
        from tokenflow.scoring.pool import ScorerDied

        try:
            return self.scorer.poll()
        except ScorerDied as e:
            if not self.enabled or not hasattr(self.scorer, "restart"):
                raise
            n = self.policy.admit("scorer", e)
            pending = self.scorer.num_pending
            log.warning("%s; a new scorer pool scores its %d pending group(s) again (restart %d of %d)",
                        e, pending, n, self.policy.max_restarts)
            self.scorer.restart()
            self._note("scorer", "replaced", error=str(e), rescored_groups=pending)
            self._write_workers()
            return []

    def heal(self, e: WorkerDied) -> None:
        role = _role(e.worker)
        n = self.policy.admit(role, e)
        log.warning("%s; replacing it (restart %d of %d, step %d)", e, n, self.policy.max_restarts, self.state.step)
        death = {"cause": e.cause, "peak_rss_gb": e.peak_rss_gb}  # heal.jsonl: how it ended (memory_watch)
        if role == "trainer":
            self._replace_trainer(str(e), **death)
        else:
            self._replace_engine(role, n, str(e), **death)
        self._write_workers()

    # ---- replacements ------------------------------------------------------------------------
    def _replace_engine(self, name: str, n: int, error: str, **death) -> None:
        state, backend = self.state, self.backend
        index = backend.replace_engine(name)
        engine = backend.engines[index]
        lost = sum(1 for h, _ in state.group_engine.values() if h is engine)
        backend.trainer.send(M.EngineReplaced(index))  # its notices reach the new queue through us
        resend_after_restart(state, backend, self.heldout, M.WorkerRestarted(name, n))
        self.checkpoints.engine_gone(name)  # a checkpoint waiting on its in-flight report goes on
        self.booting.add(name)
        self._note(name, "replaced", error=error, pid=engine.pid, resent_groups=lost, **death)

    def _replace_trainer(self, error: str, **death) -> None:
        state, backend = self.state, self.backend
        ckpt = state.run_dir.latest_checkpoint()
        start = backend.trainer_start_step
        restored = max(int(ckpt.name.split("_")[-1]) if ckpt is not None else start, start)
        replay = [m for m in self.sent if m.step > restored]
        want = list(range(restored + 1, state.step + 1 + (state.pending_batch is not None)))
        if [m.step for m in replay] != want:
            raise RunFailed(f"{error}; not replaced: the batches of steps {want[0]}..{want[-1]} since the last "
                            f"checkpoint are not all kept (have {[m.step for m in replay]})")
        self.resave = []  # a trainer that died before its replacement was ready: collected afresh
        for p in self.checkpoints.pending:
            if p.written is None:  # the dead trainer was writing it (maybe in the background): again
                self.resave.append((p.step, str(p.staging)))
                p.trainer_free = False  # the new trainer answers Saved for it
        self._release_sync(state.sync_spec)
        state.sync_spec, state.sync_broken = None, None
        state.trainer_busy, state.trainer_ready = True, False
        for name in backend.locked_engines():  # killed mid-write into it: new queues (not counted)
            self._replace_engine(name, self.policy.counts[name], "the dead trainer left its command queue locked")
        # The new trainer loads on its own threads. After the queues a dead writer left locked are
        # replaced: a message into one of those would never leave.
        backend.lend_trainer_threads(False)
        backend.replace_trainer(ckpt if ckpt is not None and restored > start else None)
        state.last_msg_from[backend.trainer.name] = time.monotonic()
        self.replay = replay
        self._note("trainer", "replaced", error=error, pid=backend.trainer.pid, restored_step=restored,
                   replay_steps=len(replay), **death)

    @staticmethod
    def _release_sync(spec) -> None:
        """The dead trainer's shared-memory weight slots: unlinked now (engines that mapped them
        keep their mapping until they attach to the new trainer's)."""
        if spec is None or spec.transport != "shared_memory":
            return
        for name in [*spec.options["slots"], spec.options["control"]]:
            try:
                os.unlink(f"/dev/shm/{name}")
            except FileNotFoundError:
                pass

    # ---- records -----------------------------------------------------------------------------
    def _checkpoint_step(self) -> int:
        cps = self.state.run_dir.complete_checkpoints()
        return int(cps[-1].name.split("_")[-1]) if cps else -1

    def _note(self, worker: str, event: str, **fields) -> None:
        """One line of ``heal.jsonl``: what was replaced, when, at which step."""
        row = {"worker": worker, "event": event, "time": time.time(), "step": self.state.step, **fields}
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def _write_workers(self) -> None:
        """``workers.json`` names the live processes (tools that watch a run read it)."""
        workers = self.state.run_dir.workers
        pids = {"orchestrator": os.getpid(), **{w.name: w.pid for w in self.backend.all_workers},
                **{f"scorer{i}": pid for i, pid in enumerate(self.scorer.worker_pids())}}
        tmp = workers.with_suffix(".tmp")
        tmp.write_text(json.dumps(pids, indent=2))
        os.replace(tmp, workers)

"""Engines that join and leave a running job (Ray backend): `tokenflow engines add|remove` and
``runtime.elastic``.

    control/requests/*.json ─┐
    runtime.elastic (autoscale: who waited on whom) ─┴─► queue ─► one change at a time:

    add:    spawn actor ─placed─► loop starts, model loads (WorkerBooted) ─► joins the engine list,
            not routed to ─► trainer: ResizeSync ─SyncReformed(v)─► every engine AttachSync(min_version=v)
            ─► the new engine's first WeightsLoaded (≥ v) ─► given work
    remove: out of routing ─► its in-flight groups re-sent to the others, same seeds ─► trainer:
            ResizeSync ─SyncReformed─► Shutdown, actor killed after a grace

Why this order. A new engine is built from the run's first weights; it attaches with
``min_version`` = the trainer's version, so it generates nothing before it holds those (its
tokens carry the versions it really loaded) and gets no group before its first load. A removed
engine stays attached to the weight sync until the sync no longer counts it: a broadcast cannot
finish without every member, and a shared-memory slot is not rewritten before every reader has
released it. Its groups are re-sent at once, and anything it still sends is dropped here, so a
group it finishes anyway is not counted twice (the orchestrator forgets a group only when its
``Generated`` arrives). No step is dispatched between ``ResizeSync`` and ``SyncReformed``: every
engine then attaches to the new sync before the trainer sends any notice through it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass, field

from tokenflow.metrics.safe_files import open_text, write_atomic
from tokenflow.runtime.backends.protocol import Backend
from tokenflow.runtime.orchestrator.autoscale import AutoScale, reading
from tokenflow.runtime.orchestrator.checkpoints import Checkpointer
from tokenflow.runtime.orchestrator.heldout import HeldOutEval
from tokenflow.runtime.orchestrator.routing import readmit
from tokenflow.runtime.orchestrator.run_state import RunFailed, RunState
from tokenflow.runtime.run.control import ControlInbox
from tokenflow.runtime.workers import messages as M

log = logging.getLogger(__name__)

POLL_EVERY_S = 0.5


@dataclass
class Change:
    op: str  # "add" | "remove"
    request: str | None  # the control request it answers (None: runtime.elastic decided)
    why: str
    name: str | None = None  # remove: the engine named by the request
    engine: object = None
    stage: str = "queued"
    since: float = field(default_factory=time.monotonic)
    spec: object = None  # the sync spec ResizeSync was sent under; a new one means it is done
    version: int = 0  # the version SyncReformed promised


class Elastic:
    def __init__(self, state: RunState, backend: Backend, *, checkpoints: Checkpointer, heldout: HeldOutEval) -> None:
        self.state, self.backend, self.checkpoints, self.heldout = state, backend, checkpoints, heldout
        cfg = state.cfg.runtime
        self.scaler = None
        if cfg.backend == "ray":
            from tokenflow.runtime.backends.ray.elastic import RayEngineScaler

            self.scaler = RayEngineScaler(backend)
        self.control = ControlInbox(state.run_dir.root)
        self.queue: collections.deque[Change] = collections.deque()
        self.change: Change | None = None
        self.retired: set[str] = set()
        self.loads: dict[str, list[int]] = {}  # the versions each engine reported loaded, in order
        self.added: list[str] = []
        self.removed: list[str] = []
        self.readmitted = 0
        self.requests_left: dict[str, int] = {}  # control request → changes still to finish
        self.policy = (AutoScale(cfg.min_engines, cfg.max_engines, cfg.elastic_idle_frac, cfg.elastic_patience)
                       if cfg.elastic else None)
        self._window = None  # (step, wall, trainer busy, engine wall, engine busy) at the last reading
        self._next_poll = 0.0
        self._status = None
        self.events = open_text(state.run_dir.engines_log, "a")

    # ---- what the orchestrator asks ------------------------------------------------------
    def admits(self, env) -> bool:
        """Whether ``env`` goes on to the inbox: nothing from a removed engine does (its groups
        were re-sent; its counters are kept). Loads and re-formed syncs are noted on the way."""
        msg = env.message
        if env.worker in self.retired:
            if isinstance(msg, M.EngineStatus):
                self.state.engine_totals.update(env.worker, msg)
            return False
        if isinstance(msg, M.WeightsLoaded):
            self.loads.setdefault(env.worker, []).append(msg.version)
            self._event("loaded", env.worker, version=msg.version)
        elif isinstance(msg, M.SyncReformed) and self.change is not None and self.change.stage == "resizing":
            self.change.version = msg.version
        elif isinstance(msg, M.WorkerFailed) and self._joining(env.worker):
            self._fail(self.change, f"{env.worker} failed while starting: {msg.error}")
            return False
        return True

    def holds_dispatch(self) -> bool:
        """No step while the weight sync is being rebuilt (see the module's docstring)."""
        return self.change is not None and self.change.stage == "resizing"

    def tick(self) -> None:
        state, now = self.state, time.monotonic()
        if now >= self._next_poll:
            self._next_poll = now + POLL_EVERY_S
            for req in self.control.poll():
                self._request(req)
        if self.scaler is not None:
            self.scaler.tick()
        if self.change is not None:
            self._advance(self.change, now)
        if self.change is None and self.queue and self._can_change():
            self.change = self.queue.popleft()
            self._begin(self.change)
        self._autoscale()
        self._write_status()
        if state.step >= state.cfg.run.steps:
            self._finish_window()

    def close(self) -> None:
        self._finish_window()
        for req in self.control.poll():  # placed after the last step: answered, not left waiting
            self.control.reply(req.id, "failed", "the run is finishing; nothing is changed")
        c = self.change
        if c is not None and c.op == "remove" and c.stage == "resizing":  # out of the list already
            self.scaler.retire(c.engine)
            self.removed.append(c.engine.name)
            self._event("removed", c.engine.name, version=c.version, why=c.why, at_run_end=True)
            self._done(c, f"removed {c.engine.name} as the run ended")
        if self.scaler is not None:
            self.scaler.close()
        self._write_status()
        self.events.close()

    def summary(self) -> dict:
        return {"added": self.added, "removed": self.removed, "readmitted_groups": self.readmitted,
                "final": [e.name for e in self.backend.engines]}

    # ---- requests ------------------------------------------------------------------------
    def _request(self, req) -> None:
        state, rt = self.state, self.state.cfg.runtime
        if self.scaler is None:
            return self.control.reply(req.id, "failed", 'engines join and leave a run on the Ray backend only '
                                      '(runtime.backend = "ray"); this run uses the local backend')
        if state.step >= state.cfg.run.steps:
            return self.control.reply(req.id, "failed", "the run is finishing; nothing is changed")
        after = self._planned() + (req.count if req.op == "add" else -req.count)
        if req.op == "add" and rt.max_engines is not None and after > rt.max_engines:
            return self.control.reply(req.id, "failed", f"that would make {after} engines; runtime.max_engines "
                                      f"is {rt.max_engines}")
        if req.op == "remove":
            if after < rt.min_engines:
                return self.control.reply(req.id, "failed", f"that would leave {after} engine(s); "
                                          f"runtime.min_engines is {rt.min_engines}")
            names = [e.name for e in self.backend.engines]
            if req.engine is not None and req.engine not in names:
                return self.control.reply(req.id, "failed", f"no engine {req.engine!r} runs now (the engines: "
                                          f"{', '.join(names)})")
        for _ in range(req.count):
            self.queue.append(Change(req.op, req.id, "command", name=req.engine))
        self.requests_left[req.id] = req.count
        self._event("requested", req.engine, op=req.op, count=req.count, request=req.id)
        self.control.reply(req.id, "accepted", f"{req.op} {req.count} engine(s): queued")

    def _planned(self) -> int:
        """Engines once every queued and running change is done."""
        n = len(self.backend.engines)
        for c in [*self.queue, *([self.change] if self.change is not None else [])]:
            if c.op == "add" and c.stage in ("queued", "placing", "booting"):
                n += 1
            elif c.op == "remove" and c.stage == "queued":
                n -= 1
        return n

    def _can_change(self) -> bool:
        state = self.state
        return state.sync_spec is not None and state.sync_broken is None and state.step < state.cfg.run.steps

    # ---- one change ----------------------------------------------------------------------
    def _begin(self, c: Change) -> None:
        c.since = time.monotonic()
        if c.op == "add":
            c.engine = self.scaler.spawn()
            c.stage = "placing"
            log.info("adding %s (%s)", c.engine.name, c.why)
            return
        engines = [e for e in self.backend.engines if e.accepting]
        if c.name is not None:
            chosen = next((e for e in engines if e.name == c.name), None)
        else:  # the least loaded; of equals, the newest
            chosen = min(reversed(engines), key=lambda e: e.load) if engines else None
        if chosen is None or len(engines) < 2:
            return self._fail(c, f"cannot remove {c.name or 'an engine'}: " + (
                "it does not run (or has not loaded weights yet)" if chosen is None else
                "it is the only engine holding weights"))
        c.engine = chosen
        self._remove(c)

    def _advance(self, c: Change, now: float) -> None:
        state, w = self.state, c.engine
        if c.stage == "placing":
            try:
                if self.scaler.started(w):
                    c.stage, c.since = "booting", now
                    self._event("placed", w.name, node=self.scaler.node_of(w), pid=w.pid)
            except Exception as e:  # noqa: BLE001 - Ray could not place it: the run goes on without it
                self._fail(c, str(e).splitlines()[0])
        elif c.stage == "booting":
            if w.name in state.booted:
                self._join(c)
            elif now - c.since > state.cfg.runtime.worker_timeout_s:
                self._fail(c, f"{w.name} did not load its model within {state.cfg.runtime.worker_timeout_s:g}s "
                              "(runtime.worker_timeout_s)")
        elif c.stage == "resizing":
            if state.sync_spec is not c.spec:  # attach_reformed ran: every engine attaches to the new sync
                if c.op == "remove":
                    self.scaler.retire(w)
                    self.removed.append(w.name)
                    self._event("removed", w.name, version=c.version, why=c.why)
                    return self._done(c, f"removed {w.name}")
                c.stage = "loading"
            elif now - c.since > state.cfg.sync.timeout_s + state.cfg.runtime.worker_timeout_s:
                raise RunFailed(f"the weight sync was not rebuilt for {w.name} within "
                                f"{state.cfg.sync.timeout_s + state.cfg.runtime.worker_timeout_s:g}s")
        if c.stage == "loading" and any(v >= c.version for v in self.loads.get(w.name, [])):
            w.accepting = True
            self.added.append(w.name)
            self._record_pid(w)
            self._event("joined", w.name, version=c.version, node=self.scaler.node_of(w), why=c.why)
            self._done(c, f"{w.name} joined with version {c.version}")

    def _join(self, c: Change) -> None:
        state, w = self.state, c.engine
        self.scaler.join(w)
        state.last_msg_from[w.name] = time.monotonic()
        if state.blocking and state.trainer_busy:
            w.send(M.SetPaused(True))
        self._resize(c)

    def _remove(self, c: Change) -> None:
        state, w = self.state, c.engine
        self.scaler.detach(w)
        self.retired.add(w.name)
        w.send(M.AbortKind("train"))
        w.send(M.AbortKind("eval"))
        state.engine_versions.pop(w.name, None)
        state.last_msg_from.pop(w.name, None)
        state.buffer.set_engine_version(min(state.engine_versions.values(), default=state.step))
        last = state.engine_totals.per_engine.get(w.name)
        if last is not None:  # its counts stay in the totals; it runs nothing any more
            state.engine_totals.per_engine[w.name] = dataclasses.replace(last, running=0, waiting=0)
        lost = sorted(gid for gid, (h, _) in state.group_engine.items() if h is w)
        log.info("removing %s (%s); re-sending its in-flight groups %s", w.name, c.why, lost)
        self.readmitted += len(lost)
        self._event("readmitted", w.name, groups=lost)
        readmit(self.state, self.backend, self.heldout, lost)
        self.checkpoints.engine_gone(w.name)  # a checkpoint waiting on its in-flight report goes on
        self._resize(c)

    def _resize(self, c: Change) -> None:
        c.spec, c.stage, c.since = self.state.sync_spec, "resizing", time.monotonic()
        self.backend.trainer.send(M.ResizeSync(self.scaler.inboxes(), c.engine.name))

    def _done(self, c: Change, message: str) -> None:
        log.info("%s", message)
        self.change = None
        if self.policy is not None:
            self.policy.restart()
            self._window = None
        if c.request is not None:
            self.requests_left[c.request] -= 1
            if self.requests_left[c.request] == 0:
                self.control.reply(c.request, "done", message, engines=[e.name for e in self.backend.engines])
            else:
                self.control.reply(c.request, "accepted", message)

    def _fail(self, c: Change, why: str) -> None:
        log.warning("engine change failed: %s; the run goes on with %d engine(s)", why, len(self.backend.engines))
        if c.op == "add" and c.engine is not None:
            self.scaler.discard(c.engine)
        self._event("failed", getattr(c.engine, "name", c.name), op=c.op, error=why)
        if c is self.change:
            self.change = None
        if c.request is not None:
            self.requests_left.pop(c.request, None)
            self.queue = collections.deque(q for q in self.queue if q.request != c.request)
            self.control.reply(c.request, "failed", why)

    def _joining(self, name: str) -> bool:
        c = self.change
        return c is not None and c.op == "add" and c.engine is not None and c.engine.name == name \
            and c.stage in ("placing", "booting")

    def _finish_window(self) -> None:
        """The training window is over: queued changes are refused, an engine not yet in the
        list is let go (one already in the list finishes joining on its own)."""
        c = self.change
        if c is not None and c.stage in ("placing", "booting"):
            self._fail(c, "the run finished before the engine joined")
        for q in list(self.queue):
            if q.request is not None and q.request in self.requests_left:
                self._fail(q, "the run finished first")
        self.queue.clear()

    # ---- runtime.elastic -----------------------------------------------------------------
    def _autoscale(self) -> None:
        state = self.state
        if self.policy is None or state.t_train0 is None:
            return
        point = (state.step, state.wall_s(), state.idle.trainer_busy_s, state.engine_totals.total("wall_s"),
                 state.engine_totals.total("busy_s"))
        if self._window is None or self.change is not None or self.queue:
            self._window = point
            return
        if point[0] == self._window[0]:
            return
        r = reading(*(a - b for a, b in zip(point[1:], self._window[1:])))
        self._window = point
        decision = self.policy.observe(r, len(self.backend.engines), steps_left=state.cfg.run.steps - state.step)
        if decision:
            why = ("the trainer waited on generation {:.0%} of the time".format(r.trainer_wait) if decision > 0 else
                   "the engines waited on the trainer {:.0%} of the time".format(r.engine_wait))
            self.queue.append(Change("add" if decision > 0 else "remove", None, why))
            self._event("decided", None, op="add" if decision > 0 else "remove", why=why)

    # ---- records -------------------------------------------------------------------------
    def _event(self, event: str, engine: str | None, **fields) -> None:
        row = {"event": event, "engine": engine, "step": self.state.step, "wall_s": round(self.state.wall_s(), 3),
               **fields}
        self.events.write(json.dumps(row) + "\n")
        self.events.flush()

    def _record_pid(self, w) -> None:
        """``workers.json`` names every worker process of the run, a joined engine's too."""
        path = self.state.run_dir.workers
        try:
            pids = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pids = {}
        pids[w.name] = w.pid
        write_atomic(path, json.dumps(pids, indent=2))

    def _write_status(self) -> None:
        state = self.state
        c = self.change
        status = {
            "pid": os.getpid(), "backend": state.cfg.runtime.backend, "step": state.step,
            "elastic": state.cfg.runtime.elastic, "min_engines": state.cfg.runtime.min_engines,
            "max_engines": state.cfg.runtime.max_engines,
            "engines": [{"name": e.name, "node": getattr(e, "node", None),
                         "version": state.engine_versions.get(e.name),
                         "accepting": e.accepting} for e in self.backend.engines],
            "changing": None if c is None else f"{c.op} {getattr(c.engine, 'name', c.name or '')} ({c.stage})".replace(
                "  ", " "),
            "queued": [q.op for q in self.queue], "removed": self.removed,
        }
        if status != self._status:
            self._status = status
            self.control.status(status)


"""Trace events only the orchestrator can see: buffer waits, trainer idle, flow counters.

The workers trace their own work (engine prefill/decode and weight swaps, trainer forward /
backward / optimizer, sync phases, scorer calls). Waiting is different: the trainer does not know
it is idle for lack of a batch, and the engine does not know admission is holding prompts back.
The orchestrator does, so it calls :meth:`RunTracer.tick` on every loop turn (after dispatching
and after reading messages) and this module turns what changed since the last call into events:

* ``buffer/batch_wait``: the trainer was free but the buffer held less than one step of groups;
* ``buffer/admission_blocked``: the staleness budget was full, so no prompt could be admitted;
* ``trainer/idle``: from a ``Trained`` (or ``Saved``) reply to the next ``Train``, drawn on the
  trainer's own process track; a trainer still starting when the window opens (the engines do
  not wait for it) is idle from the window's start to its first ``Train``, as the runtime's
  idle clock counts it;
* counters ``buffer/fill`` (admitted-but-unconsumed fraction and ready groups) and
  ``perf/tokens_per_s`` (engine generation rate and trainer consumption rate).

Buffer waits are resolved to one orchestrator turn (at most ~20 ms); trainer idle is exact. With tracing off,
:func:`run_tracer` returns an object whose ``tick`` does nothing.
"""

from __future__ import annotations

import os
import time

from tokenflow.metrics import trace
from tokenflow.runtime.backends.protocol import Backend
from tokenflow.runtime.orchestrator.run_state import RunState

WAIT_TID = 1  # the orchestrator's "buffer waits" track
IDLE_TID = 1  # the trainer's "idle" track (a separate track in the trainer's process)


class _Off:
    def tick(self) -> None:
        return None


class RunTracer:
    def __init__(self, state: RunState, backend: Backend) -> None:
        self.state, self.backend = state, backend
        self.pid = os.getpid()
        self.trainer_pid = backend.trainer.pid or self.pid
        stats = state.buffer.stats
        self.admission_wait_s = stats.admission_wait_s
        self.batch_wait_s = stats.batch_wait_s
        self.trainer_free_since: float | None = None
        self.t0 = time.time()  # idle before the training window is not the loop's business
        self.fill: tuple[float, int] | None = None
        self.engine_clock: dict[str, tuple[float, float]] = {}  # engine -> (tokens, wall_s)
        self.engine_rates: dict[str, float] = {}
        self.trainer_rate = 0.0
        self.trained = (len(state.calibration.trainer_steps), time.time())
        trace.name_thread(self.pid, WAIT_TID, "buffer waits")
        trace.name_thread(self.trainer_pid, IDLE_TID, "idle (orchestrator's view)")

    def tick(self) -> None:
        t0 = time.perf_counter()
        now = time.time()
        self._waits(now)
        self._trainer_idle(now)
        self._counters(now)
        trace.add_self_time(time.perf_counter() - t0)

    def _waits(self, now: float) -> None:
        stats = self.state.buffer.stats
        # The buffer adds a wait to its totals when the wait ends, i.e. during this turn.
        if stats.admission_wait_s > self.admission_wait_s:
            d = stats.admission_wait_s - self.admission_wait_s
            trace.record_on("buffer/admission_blocked", now - d, d, self.pid, WAIT_TID)
            self.admission_wait_s = stats.admission_wait_s
        if stats.batch_wait_s > self.batch_wait_s:
            d = stats.batch_wait_s - self.batch_wait_s
            trace.record_on("buffer/batch_wait", now - d, d, self.pid, WAIT_TID)
            self.batch_wait_s = stats.batch_wait_s

    def _trainer_idle(self, now: float) -> None:
        # The orchestrator stamps the trainer's entry in last_msg_from when a reply arrives and
        # when it sends a Train, so both ends of an idle span are exact, not a turn late.
        state = self.state
        stamp = state.last_msg_from.get(self.backend.trainer.name)
        at = now - (time.monotonic() - stamp) if stamp is not None else now
        idle = not state.trainer_busy or not state.trainer_ready  # starting: not training
        if idle and self.trainer_free_since is None:
            self.trainer_free_since = max(at, self.t0)
        elif not idle and self.trainer_free_since is not None:
            start, self.trainer_free_since = self.trainer_free_since, None
            trace.record_on("trainer/idle", start, max(0.0, at - start), self.trainer_pid, IDLE_TID,
                            step=state.step)

    def _counters(self, now: float) -> None:
        buf = self.state.buffer
        fill = (round(buf.fill, 4), buf.num_ready)
        if fill != self.fill:
            self.fill = fill
            trace.counter("buffer/fill", fill=fill[0], ready_groups=fill[1])
        changed = False
        for name, status in self.state.engine_totals.per_engine.items():
            last = self.engine_clock.get(name)
            if last is not None and status.wall_s < last[1]:  # a restarted engine: new clocks
                last = None
            if last is not None and status.wall_s > last[1]:
                self.engine_rates[name] = (status.tokens - last[0]) / (status.wall_s - last[1])
                changed = True
            if last is None or status.wall_s > last[1]:
                self.engine_clock[name] = (status.tokens, status.wall_s)
        steps = self.state.calibration.trainer_steps  # [tokens, train_s] per optimizer step
        n, t = self.trained
        if len(steps) > n:
            tokens = sum(s[0] for s in steps[n:])
            self.trainer_rate = tokens / max(now - t, 1e-6)
            self.trained = (len(steps), now)
            changed = True
        if changed:
            trace.counter("perf/tokens_per_s", engine=sum(self.engine_rates.values()),
                          trainer=self.trainer_rate)


def run_tracer(state: RunState, backend: Backend) -> RunTracer | _Off:
    """A tracer for the orchestrator's loop, or a no-op when tracing is off."""
    return RunTracer(state, backend) if trace.enabled() else _Off()

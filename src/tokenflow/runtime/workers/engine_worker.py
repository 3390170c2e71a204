"""The engine process: generation that never waits for the trainer.

Each turn of the loop: read commands (without blocking while there is work), load new weights
if a sync has landed (between two decode steps), run one engine step, send finished groups.
Weight updates follow ``engine.update_mode``: ``inflight`` swaps at once, ``abort`` returns
running samples as partial rollouts that this worker resubmits at once (prefix resume, so the
group comes back whole), ``drain`` lets the running samples finish first. ``blocking`` is the
runtime's turn-taking mode: the orchestrator pauses generation while the trainer steps.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import time
from dataclasses import dataclass, field

from tokenflow.host_memory import release_freed_memory
from tokenflow.metrics import trace
from tokenflow.rollout import Rollout
from tokenflow.runtime.workers.messages import (
    AbortKind, AttachSync, EngineStatus, Envelope, Generate, Generated, ReportInFlight, SetPaused,
    SetThreads, Shutdown, WeightsLoaded, WorkerBooted,
)
from tokenflow.runtime.workers import inflight
from tokenflow.sync.base import owns
from tokenflow.runtime.workers.process import ParentWatch, worker_main

log = logging.getLogger(__name__)

STATUS_EVERY_S = 1.0


@dataclass
class _Group:
    msg: Generate
    rollouts: dict[int, Rollout] = field(default_factory=dict)


class EngineWorker:
    def __init__(self, model_path: str, engine_config, out_q, cmd_q, name: str = "engine",
                 trace_dir: str | None = None, attach_first: bool = True) -> None:
        from tokenflow.engine.factory import make_engine
        from tokenflow.metrics import phases

        phases.mark(f"{name}/imported")
        trace.configure(trace_dir, name)
        self.name = name
        self.out_q = out_q
        self.cmd_q = cmd_q
        self.engine = make_engine(model_path, engine_config)
        phases.mark(f"{name}/loaded")
        out_q.put(Envelope(name, WorkerBooted(name, phases.worker_marks(name))))
        self.mode = engine_config.update_mode
        self.receiver = None
        self.pending_weights = []  # WeightsReady notices not yet loaded, oldest first
        self.receiving = False  # pending_weights[0] has been begun on the receiver
        self.min_version = 0  # generate nothing before weights this new are loaded (AttachSync)
        self._retired = []  # receivers of replaced broadcast groups whose receive may still run
        self.loading = None  # the notice whose weights the engine is applying (drain)
        self.groups: dict[str, _Group] = {}
        self.paused = False
        self.t_start = time.perf_counter()
        self.busy_s = 0.0
        self.pauses: list[float] = []
        self.aborted = 0  # samples the last abort-mode swap stopped
        self.decode_samples: list[tuple[int, float]] = []
        self.prefill_samples: list[tuple[int, float]] = []
        self.last_status = 0.0
        self._reported_tokens = 0
        self._trimmed_tokens = 0  # tokens generated when the heap was last handed back
        self.running = True
        self.parent = ParentWatch()
        self.episodes = None  # an EpisodeDriver, made on the first environment request
        self.agents = None  # an AgentDriver (training sessions), made on the first agent request
        # Generate nothing before the trainer's sync spec is attached (a restarted engine must
        # first load the newest weights). False for a first start: the engine holds the run's
        # starting weights already, so the held-out evaluation and the first training groups
        # need not wait for the trainer to load.
        self.attach_first = attach_first

    # ---- commands ------------------------------------------------------------------------
    def handle(self, msg) -> None:
        from tokenflow.sync.base import WeightsReady
        from tokenflow.sync.factory import make_receiver

        if isinstance(msg, Generate):
            rid = f"{msg.kind}-{msg.group_id}"
            if rid in self.groups:  # re-sent after a restart, and also delivered from before it
                return
            if msg.episode is not None and getattr(msg.episode, "agent", None):
                if self.agents is None:
                    from tokenflow.runtime.drivers.agents import AgentDriver

                    self.agents = AgentDriver(self.engine)
                self.agents.start(rid, msg.episode, msg.params, msg.group_id, msg.prompt_id)
            elif msg.episode is not None:
                if self.episodes is None:
                    from tokenflow.runtime.drivers.episodes import EpisodeDriver

                    self.episodes = EpisodeDriver(self.engine)
                self.episodes.start(rid, msg.episode, msg.params, msg.group_id, msg.prompt_id)
            elif msg.kept:  # a resumed run: what the checkpoint kept of this group
                group = self.groups[rid] = _Group(msg)
                inflight.submit_kept(self.engine, msg, rid, group.rollouts)
                self._send_if_whole(rid)
                return
            else:
                self.engine.add_request(msg.prompt_ids, msg.params, request_id=rid,
                                        group_id=msg.group_id, prompt_id=msg.prompt_id)
            self.groups[rid] = _Group(msg)
        elif isinstance(msg, ReportInFlight):
            self.out_q.put(Envelope(self.name, inflight.report(self.groups, self.engine, msg)))
        elif isinstance(msg, WeightsReady):
            self.pending_weights.append(msg)
            self._begin_next()
        elif isinstance(msg, AttachSync):
            if self.receiver is not None:  # a re-formed group, or contact lost: start over
                self.receiver.close()
                # Kept, not dropped: its receive may still be blocked in the old group, and a
                # process group's destructor waits for that (dropped once the thread is done).
                self._retired = [r for r in self._retired if r.busy()] + [self.receiver]
                self.receiving = False
                # Notices of the old group (or the old process) name transfers that will not come.
                self.pending_weights = []
            self.min_version = msg.min_version
            self.receiver = make_receiver(msg.spec, receiver_index=msg.receiver_index)
            self.receiver.connect()
            # A restarted engine attaches mid-run: start from the newest weights the transport
            # still holds rather than the ones it was built with.
            newest = self.receiver.latest(self.engine.version)
            if newest is not None:
                self.pending_weights.insert(0, newest)
            self._begin_next()
        elif isinstance(msg, SetPaused):
            self.paused = msg.paused
        elif isinstance(msg, SetThreads):
            import torch

            torch.set_num_threads(msg.threads)
            trace.record("engine/threads", time.time(), 0.0, threads=torch.get_num_threads())
        elif isinstance(msg, AbortKind):
            for rid, g in list(self.groups.items()):
                if g.msg.kind == msg.kind:
                    if self.episodes is not None and self.episodes.owns(rid):
                        self.episodes.abort(rid)
                    elif self.agents is not None and self.agents.owns(rid):
                        self.agents.abort(rid)
                    else:
                        self.engine.abort(rid)
                    del self.groups[rid]
        elif isinstance(msg, Shutdown):
            self.running = False
        else:
            raise TypeError(f"engine worker got an unknown message {type(msg).__name__}")

    def read_commands(self, block: bool, timeout: float = 0.05) -> None:
        try:
            msg = self.cmd_q.get(timeout=timeout) if block else self.cmd_q.get_nowait()
        except queue.Empty:
            return
        self.handle(msg)
        while True:
            try:
                self.handle(self.cmd_q.get_nowait())
            except queue.Empty:
                return

    # ---- weights -------------------------------------------------------------------------
    def _begin_next(self) -> None:
        """Start receiving the oldest pending update, unless one is under way or there is no
        receiver yet (notices can arrive before the sync spec). Notices no newer than the
        loaded weights are dropped (a restarted engine may have loaded past them), except under
        a collective transport: there every receiver takes part in every broadcast, or the
        sender waits for it, and discards the update after receiving it."""
        if self.receiver is None or self.receiving or self.loading is not None:
            return
        collective = self.receiver.collective
        keep = []
        for m in self.pending_weights:
            if not owns(self.receiver.spec, m):
                # A notice of a group this engine left (a failed push to the engine it replaces,
                # delivered after it attached to the re-formed group): no transfer will match it,
                # and receiving for it would pair every later broadcast with the wrong version.
                log.info("%s: dropped a weight notice (version %d) of another sync group", self.name, m.version)
            elif collective or m.version > self.engine.version:
                keep.append(m)
            else:  # nothing to load, but the sender waits for every receiver to release the slot
                self.receiver.done(m)
        self.pending_weights = sorted(keep, key=lambda m: m.version)
        if self.pending_weights:
            try:
                self.receiver.begin(self.pending_weights[0])
            except RuntimeError as e:
                if collective:
                    raise
                # A notice of a replaced trainer's new weight sync, ahead of its AttachSync (they
                # come from two processes): the attach loads the newest version itself.
                log.debug("%s: dropped a weight notice for another sync (%s)", self.name, e)
                self.pending_weights.pop(0)
                return self._begin_next()
            self.receiving = True

    def maybe_load_weights(self) -> None:
        if self.loading is not None:
            if self.engine.version >= self.loading.version:  # a drain finished
                self._finish_load(self.loading)
            return
        if not self.receiving or not self.receiver.ready():
            return
        msg = self.pending_weights.pop(0)
        self.receiving = False
        if msg.version <= self.engine.version:  # received only to keep the collective whole
            self.receiver.done(msg)
            self._begin_next()
            return
        t0 = time.perf_counter()
        with trace.span("sync/apply", version=msg.version, mode=self.mode):
            # Blocking: generation is paused while the trainer steps, so swap at once (a drain
            # would wait for paused sequences forever).
            mode = "inflight" if self.mode == "blocking" else self.mode
            report = self.engine.update_weights(self.receiver.tensors(), msg.version, mode=mode,
                                                checksum=msg.checksum)
        # The pause: decoding stops only for this call (a drain's swap happens later, in step()).
        self.pauses.append(time.perf_counter() - t0)
        # Samples an abort-mode swap stopped (each is resubmitted from its prefix by collect()).
        self.aborted = int(report.get("aborted", 0)) if isinstance(report, dict) else 0
        self.loading = msg
        self.load_started = t0
        if self.engine.version >= msg.version:
            self._finish_load(msg)

    def _finish_load(self, msg) -> None:
        timings = self.receiver.done(msg)
        self.loading = None
        self.out_q.put(Envelope(self.name, WeightsLoaded(msg.version, {
            **timings, "sync/engine_pause_s": self.pauses[-1] if self.pauses else 0.0,
            "sync/aborted_samples": float(self.aborted),
            "sync/apply_wait_s": time.perf_counter() - self.load_started,
            "sync/latency_s": time.time() - msg.sent_at})))
        # Once a step: the free holes decoding leaves in the heap (sampler and attention
        # temporaries of every batch size) go back, or they add up (0.5 GB for SmolLM2 in three
        # batches of 64 samples; the call took 46 ms there, under one decode step)
        with trace.span("host/release_memory"):
            release_freed_memory()
        self._trimmed_tokens = self.engine.stats.tokens_generated
        self._begin_next()

    # ---- generation ----------------------------------------------------------------------
    def step(self) -> None:
        st = self.engine.stats
        steps_before, prefill_tokens_before = st.decode_steps + st.prefill_steps, st.prefill_tokens
        t0 = time.perf_counter()
        finished = self.engine.step()
        if self.agents is not None:  # session calls' results go to their HTTP handlers
            finished = self.agents.dispatch(finished)
        self.busy_s += time.perf_counter() - t0
        if st.decode_steps + st.prefill_steps > steps_before:  # a forward pass ran
            if st.last_step_kind == "decode":
                self.decode_samples.append((st.last_step_num_seqs, st.last_step_seconds))
            else:
                self.prefill_samples.append((st.prefill_tokens - prefill_tokens_before, st.last_step_seconds))
        if self.episodes is not None:  # episodes' turns continue or end their episodes
            finished = self.episodes.dispatch(finished)
        for r in finished:
            self.collect(r)

    def poll_episodes(self) -> None:
        """Environment results that landed: continue episodes, and send the groups whose
        episodes (or agents) have all ended (a group of a multi-row episode holds more than n
        rows)."""
        finished = []
        if self.episodes is not None:
            finished += self.episodes.poll()
        if self.agents is not None:
            finished += self.agents.poll()
        for rid, rows in finished:
            group = self.groups.pop(rid, None)
            if group is not None:
                self.out_q.put(Envelope(self.name, Generated(group.msg.group_id, group.msg.kind, rows)))

    def collect(self, r: Rollout) -> None:
        group = self.groups.get(r.request_id)
        if group is None:  # aborted by AbortKind
            return
        if r.finish_reason == "abort":
            # Weights changed under us in abort mode: continue this sample from its prefix.
            params = dataclasses.replace(group.msg.params, n=1)
            self.engine.add_request(group.msg.prompt_ids, params, request_id=r.request_id, resume=r)
            return
        group.rollouts[r.sample_index] = r
        self._send_if_whole(r.request_id)

    def _send_if_whole(self, rid: str) -> None:
        group = self.groups[rid]
        if len(group.rollouts) == group.msg.params.n:
            del self.groups[rid]
            rollouts = [group.rollouts[i] for i in range(group.msg.params.n)]
            self.out_q.put(Envelope(self.name, Generated(group.msg.group_id, group.msg.kind, rollouts)))

    def send_status(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self.last_status < STATUS_EVERY_S:
            return
        self.last_status = now
        s = self.engine.stats
        self._reported_tokens = s.tokens_generated
        self.out_q.put(Envelope(self.name, EngineStatus(
            version=self.engine.version, busy_s=self.busy_s, wall_s=now - self.t_start,
            tokens=s.tokens_generated, decode_steps=s.decode_steps, decode_s=s.decode_seconds,
            prefill_tokens=s.prefill_tokens, prefill_s=s.prefill_seconds,
            running=self.engine.num_running, waiting=self.engine.num_waiting,
            pauses=self.pauses, decode_samples=self.decode_samples,
            prefill_samples=self.prefill_samples)))
        self.pauses, self.decode_samples, self.prefill_samples = [], [], []
        trace.counter("engine/running", seqs=self.engine.num_running)

    def can_step(self) -> bool:
        # Never before the weights it must start from; with attach_first, never before the sync
        # is attached either (a restarted engine first loads the newest weights).
        return (self.engine.has_unfinished() and not self.paused
                and (self.receiver is not None or not self.attach_first)
                and self.engine.version >= self.min_version)

    def trim_when_idle(self) -> None:
        """Out of work (waiting for the trainer's next weights or prompts): hand back the heap's
        free pages now, if it decoded since the last time, rather than hold what decoding freed
        until the next load (`_finish_load`). A trainer-bound run's engine waits through most of
        each step, while the trainer holds its peak: SmolLM2 on examples/laptop_math, the
        engine's heap before a load was 1.4-1.5 GB against 1.0-1.1 after its trim."""
        generated = self.engine.stats.tokens_generated
        if self.engine.has_unfinished() or generated == self._trimmed_tokens:
            return
        self._trimmed_tokens = generated
        with trace.span("host/release_memory_idle"):
            release_freed_memory()

    def loop(self) -> None:
        while self.running:
            waiting_on_env = ((self.episodes is not None and self.episodes.waiting_on_env)
                              or (self.agents is not None and self.agents.active))
            self.read_commands(block=not self.can_step() and self.loading is None and not self.receiving,
                               timeout=0.002 if waiting_on_env else 0.05)
            self.poll_episodes()
            if self.agents is not None:
                self.agents.pump()  # calls agents made since the last step join the batch
            if self.receiver is not None:
                self.maybe_load_weights()
            if self.can_step():
                self.step()
            # When work runs out, report at once rather than up to a second later: what the
            # parent sums at the end of a run (tokens, busy time) must include the last tokens.
            self.send_status(force=not self.engine.has_unfinished()
                             and self.engine.stats.tokens_generated != self._reported_tokens)
            self.trim_when_idle()
            if self.parent.orphaned():
                log.warning("%s: the orchestrator is gone; exiting", self.name)
                break
        self.send_status(force=True)
        if self.episodes is not None:
            self.episodes.close()
        if self.agents is not None:
            self.agents.close()
        if self.receiver is not None:
            self.receiver.close()
        self.engine.close()
        trace.flush()


def run_engine_worker(model_path, engine_config, out_q, cmd_q, name="engine", trace_dir=None,
                      attach_first=True) -> None:
    """Process entry point (spawned)."""
    worker_main(name, out_q, lambda: EngineWorker(model_path, engine_config, out_q, cmd_q, name, trace_dir,
                                                  attach_first).loop())

"""The orchestrator: the main process that keeps tokens flowing.

    task ──prompts──► admit ──Generate──► engine(s) ──Generated──► scorer pool ──► RolloutBuffer
                        ▲                     ▲                                        │
                        │ capacity            │ WeightsReady (trainer → engine)        │ take_batch
                        │                     │                                        ▼
                        └──── WeightsLoaded ◄─┴───────────── trainer ◄────── Train ────┘

Backpressure comes from one place: the buffer's admission rule (see ``tokenflow.buffer``). The
engine is fed as long as the staleness budget allows; the trainer gets a batch as soon as one
step's groups are scored. Neither waits for the other otherwise. With ``max_staleness = 0`` the
same loop is synchronous training: admit one step, generate, score, train, sync, repeat.

The orchestrator never blocks on one worker: it multiplexes every worker's messages through one
inbox and checks on each turn that all workers are alive, so a failure surfaces at once.
"""

from __future__ import annotations

import json
import logging
import time

from tokenflow.buffer import DynamicSampling, RolloutBuffer
from tokenflow.config.sync import sync_due
from tokenflow.tasks.prompts import prompt_encoder
from tokenflow.metrics import phases, trace
from tokenflow.metrics.safe_files import open_text
from tokenflow.runtime.backends.protocol import Backend
from tokenflow.runtime.orchestrator import routing, run_state
from tokenflow.runtime.orchestrator.checkpoints import Checkpointer, resume_kept
from tokenflow.runtime.orchestrator.elastic import Elastic
from tokenflow.runtime.orchestrator.healing import Healer
from tokenflow.runtime.orchestrator.heldout import HeldOutEval
from tokenflow.runtime.orchestrator.inbox import Inbox
from tokenflow.runtime.orchestrator.learning_signal import SignalWatch
from tokenflow.runtime.orchestrator.run_state import RunFailed, RunState
from tokenflow.runtime.orchestrator.run_trace import run_tracer
from tokenflow.runtime.orchestrator.step_metrics import (
    EngineClock, LiveFigures, batch_metrics, engine_metrics, sync_metrics,
)
from tokenflow.runtime.run.run_dir import RunDir
from tokenflow.runtime.run.samples import SampleLog
from tokenflow.runtime.view.progress import Progress
from tokenflow.runtime.view.summary import older_than
from tokenflow.runtime.workers import messages as M
from tokenflow.runtime.workers.memory_watch import peaks_gb
from tokenflow.scoring.overlong import shape_overlong

__all__ = ["Orchestrator", "RunFailed", "RunState"]

log = logging.getLogger(__name__)


class Orchestrator:
    """The loop: admit, collect scored groups, dispatch a step, end a step, evaluate. Its shared
    state is one `RunState` (``self.state``); the helpers get that state and the backend."""

    def __init__(self, cfg, run_dir: RunDir, backend: Backend, task, tokenizer, scorer, logger,
                 resume_state: tuple[dict, dict] | None = None) -> None:
        from tokenflow.engine import SamplingParams

        r, s, alg = cfg.rollout, cfg.sampling, cfg.algorithm
        dynamic = DynamicSampling(alg.dynamic_sampling_max_batches * r.prompts_per_step) if alg.dynamic_sampling else None
        self.state = state = RunState(
            cfg=cfg, run_dir=run_dir, task=task,
            buffer=RolloutBuffer(r.prompts_per_step, r.group_size, r.max_staleness, alg.max_token_age, dynamic,
                                 r.batch_order),
            encode=prompt_encoder(tokenizer, cfg.task),
            train_params=SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                        max_tokens=s.max_tokens, stop=tuple(s.stop), n=r.group_size),
            blocking=cfg.engine.update_mode == "blocking",
            engine_versions={h.name: 0 for h in backend.engines},
            last_msg_from={h.name: time.monotonic() for h in backend.all_workers},
        )
        self.cfg, self.backend, self.task, self.scorer, self.logger = cfg, backend, task, scorer, logger
        eval_params = SamplingParams(temperature=0.0, max_tokens=s.max_tokens, stop=tuple(s.stop))
        self.heldout = HeldOutEval(task, cfg.run.eval_limit, eval_params, self._send, scorer)
        self.samples = SampleLog(run_dir.samples, tokenizer, cfg.run.samples_per_step)  # samples.jsonl
        self.checkpoints = Checkpointer(state, backend)
        self.healer = Healer(state, backend, scorer=scorer, checkpoints=self.checkpoints, heldout=self.heldout)
        self.inbox = Inbox(state, backend, scorer=scorer, heldout=self.heldout, checkpoints=self.checkpoints,
                           healer=self.healer, on_trained=self.on_trained, on_status=self.show_live)
        self.elastic: Elastic | None = None  # made by run(): it opens the control folder
        self.live = LiveFigures()
        self.engine_clock = EngineClock()  # each step's generation rate, on the engines' clocks
        self.signal = SignalWatch(cfg)
        self.progress: Progress | None = None
        self.ledger = None  # prompts.jsonl, open while run() runs
        self.evaluated_at = -1  # the step of the last periodic evaluation
        self.baseline_pending = False  # the starting model's evaluation runs beside training
        if resume_state is not None:
            run_state.restore(state, *resume_state)
            state.kept = resume_kept(state, *resume_state[0].get("kept", ({}, [], "inflight.safetensors")))

    @property
    def worker_marks(self) -> dict[str, float]:
        """Start-up marks the workers sent (``tokenflow bench startup``)."""
        return self.state.worker_marks

    def _send(self, gid: int, prompt, kind: str, params, kept: tuple = ()) -> None:
        routing.send_generate(self.state, self.backend, gid, prompt, kind, params, kept)

    # ---- admission -------------------------------------------------------------------------
    def groups_needed(self) -> int:
        return self.cfg.run.steps * self.cfg.rollout.prompts_per_step

    def admit(self) -> None:
        s = self.state
        while (s.buffer.rollouts_admitted // self.cfg.rollout.group_size < self.groups_needed()
               and s.buffer.can_admit()):
            prompt = self.task.train_prompt(s.cursor)
            gid = s.next_group_id
            s.cursor += 1
            s.next_group_id += 1
            s.buffer.admit(gid, prompt.id)
            s.prompts[gid] = prompt
            self._send(gid, prompt, "train", routing.train_params_for(s, prompt))

    # ---- message handling ------------------------------------------------------------------
    def pump(self, timeout: float) -> None:
        env = self.backend.recv(timeout)
        while env is not None:
            if self.elastic.admits(env):  # nothing from an engine that was removed
                self.state.last_msg_from[env.worker] = time.monotonic()
                self.inbox.handle(env.worker, env.message)
            env = self.backend.recv(0)
        self.healer.check_workers()  # backend.check(), replacing the dead the policy allows
        self.checkpoints.poll()
        self.inbox.check_timeouts()

    def show_live(self) -> None:
        s = self.state
        figures = self.live.sample(time.monotonic(), s.idle.trainer_busy_s, s.engine_totals)
        s.live_figures = figures
        if self.progress is not None:
            self.progress.set(**figures)

    def collect_scored(self) -> None:
        s = self.state
        for group, meta in self.healer.poll_scored():
            gid = meta["group_id"]
            if self.heldout.on_scored(gid, group):
                continue
            s.scoring.pop(gid, None)
            alg = self.cfg.algorithm
            if alg.overlong_buffer_tokens is not None:
                shape_overlong(group, self.cfg.sampling.max_tokens, alg.overlong_buffer_tokens, alg.overlong_penalty)
            if not s.buffer.put(group):  # dynamic sampling dropped it; admission refills its slot
                s.prompts.pop(gid, None)
                s.dropped_prompt_ids.append(group[0].prompt_id)

    # ---- training --------------------------------------------------------------------------
    def maybe_dispatch(self) -> None:
        s = self.state
        # Held while the starting model's evaluation is generated and scored: step 1's weights
        # must not reach an engine that still generates it, and it is logged at step 0.
        if s.trainer_busy or s.step >= self.cfg.run.steps or self.baseline_pending \
                or self.elastic.holds_dispatch():
            return
        s.buffer.mark_trainer_waiting()
        batch = s.buffer.take_batch(s.step)
        if batch is None:
            return
        step = s.step + 1
        rollouts = [r for g in batch for r in g]
        if all(r.failed for r in rollouts):
            # Nothing to learn from, and the next batch will be no different: stop instead of
            # "training" on nothing to the end and exiting 0.
            if getattr(self.cfg.task, "env", None):
                why = rollouts[0].info.get("env_error") or rollouts[0].info.get("score_error", "unknown")
                raise RunFailed(f"every episode of step {step} failed (first error: {why}); fix the "
                                f"environment {self.cfg.task.env!r} or its rubric, then resume")
            why = rollouts[0].info.get("score_error", "unknown")
            raise RunFailed(f"every sample of step {step} failed scoring (first error: {why}); "
                            f"fix the reward function {self.task.reward_spec!r}, then resume")
        sync = sync_due(step, self.cfg.sync.every, self.cfg.run.steps)
        prompt_ids = [g[0].prompt_id for g in batch]
        self.samples.train(step, batch, s.prompts, s.step)
        for g in batch:
            s.prompts.pop(g[0].group_id, None)
        dropped, s.dropped_prompt_ids = s.dropped_prompt_ids, []
        s.pending_batch = (prompt_ids, dropped, batch_metrics(
            batch, dropped_groups=len(dropped) if s.buffer.dynamic_sampling is not None else None))
        if self.cfg.run.save_rollouts:
            s.run_dir.append_rollouts(step, rollouts)
        if s.blocking:
            self.backend.broadcast(M.SetPaused(True))
        s.trainer_busy = True
        s.last_msg_from[self.backend.trainer.name] = time.monotonic()
        if step == 1:
            phases.mark("step1_dispatched")
        self.backend.lend_trainer_threads(False)  # before it trains: the engines give its threads back
        train = M.Train(step, rollouts, sync_weights=sync)
        self.healer.train_sent(train)  # kept until a checkpoint covers it: a new trainer replays it
        self.backend.trainer.send(train)

    def on_trained(self, msg: M.Trained) -> None:
        """A step ended (``Trained``): its metrics row, the ledger, the live view, maybe a checkpoint."""
        s = self.state
        s.step = msg.step
        s.trainer_busy = False
        s.idle.trainer_busy_s += msg.train_s + msg.sync_s
        s.calibration.trainer_step(msg)
        prompt_ids, dropped, bmetrics = s.pending_batch
        s.pending_batch = None
        timings, s.sync_timings = s.sync_timings, []
        s.calibration.sync(timings)
        rate = self.engine_clock.step(s.engine_totals, fallback=s.live_figures.get("tokens_per_s", 0.0))
        metrics = {**msg.metrics, **bmetrics, **s.buffer.metrics(), **sync_metrics(timings),
                   **self.checkpoints.take_metrics(),
                   **engine_metrics(s.engine_totals, rate, min(s.engine_versions.values()))}
        wall = s.wall_s()
        metrics.update({"time/wall_s": wall, "time/step_s": wall - s.last_step_wall,
                        "perf/trainer_idle_frac": s.idle.trainer_idle(wall - s.wall_offset),
                        "perf/engine_idle_frac": s.idle.engine_idle(s.engine_totals),
                        "policy/version": float(msg.version)})
        metrics.update({f"perf/peak_rss_gb/{w}": gb for w, gb in peaks_gb(self.backend.all_workers).items()})
        s.last_step_wall = wall
        if s.blocking and not sync_due(msg.step, self.cfg.sync.every, self.cfg.run.steps):
            self.backend.broadcast(M.SetPaused(False))  # no push this step: nothing to wait for
        else:
            routing.maybe_unpause(s, self.backend)  # the engines may have loaded this step's push before we read it
        self.logger.log(s.step, metrics)
        self.signal.observe(s.step, metrics)
        entry = {"step": s.step, "prompt_ids": prompt_ids}
        if s.buffer.dynamic_sampling is not None:
            entry["dropped_prompt_ids"] = dropped  # scored, equal rewards, not trained
        self.ledger.write(json.dumps(entry) + "\n")
        self.ledger.flush()
        s.last_progress = {"reward": metrics.get("reward/mean"),
                           "age_mean": metrics.get("offpolicy/token_age_mean", 0.0),
                           "age_max": metrics.get("offpolicy/token_age_max", 0.0),
                           "over_k": older_than(s.buffer.stats.age_histogram, self.cfg.rollout.max_staleness)}
        self.show_live()
        self.progress.update(s.step, s.last_progress)
        every = self.cfg.run.checkpoint_every
        if every and s.step % every == 0 and s.step < self.cfg.run.steps:
            self.checkpoints.begin()

    def wait_for(self, condition, what: str, timeout_s: float | None = None) -> None:
        deadline = time.monotonic() + (timeout_s or self.cfg.runtime.worker_timeout_s)
        while not condition():
            if time.monotonic() > deadline:
                raise RunFailed(f"timed out waiting for {what}")
            self.collect_scored()
            self.pump(0.02)

    # ---- evaluation ------------------------------------------------------------------------
    def evaluate(self) -> float:
        """Held-out greedy accuracy with the weights the engines hold now."""
        self.heldout.start()
        self.wait_for(self.heldout.done, "the held-out evaluation")
        return self._eval_result()

    def _eval_result(self) -> float:
        self.samples.heldout(self.state.step, self.heldout.prompts, self.heldout.scored)
        self.state.last_eval = acc = self.heldout.finish()
        self.progress.set(accuracy=(acc, self.state.step))
        return acc

    def _poll_baseline(self) -> bool:
        """The starting model's evaluation runs beside the first training groups (the engines
        hold version 0 until step 1's weights, which are not sent before it is all generated);
        once scored it is logged at step 0, before step 1 can be."""
        s = self.state
        if self.baseline_pending and self.heldout.done():
            self.baseline_pending = False
            s.baseline_accuracy = self._eval_result()
            phases.mark("baseline_eval_end")
            self.logger.log(s.step, {"eval/accuracy": s.baseline_accuracy})
            log.info("baseline held-out accuracy %.3f", s.baseline_accuracy)
            self.progress.status(None)
        return not self.baseline_pending

    def _engines_ready(self) -> bool:
        return all(h.name in self.state.booted for h in self.backend.engines)

    # ---- the run ---------------------------------------------------------------------------
    def run(self) -> dict:
        cfg, s = self.cfg, self.state
        self.ledger = open_text(s.run_dir.ledger, "a")
        # Engines joining and leaving (Ray); the control folder.
        self.elastic = Elastic(s, self.backend, checkpoints=self.checkpoints, heldout=self.heldout)
        self.progress = Progress(cfg.run.steps, start=s.step, enabled=cfg.metrics.progress)
        t_start = s.t_start = time.monotonic()
        try:
            self.progress.status("starting workers")
            if self.backend.engines_start_unattached:
                # The engines generate with the weights they loaded (version 0, or the
                # checkpoint's) without waiting for the trainer, which loads meanwhile: the
                # training window opens as soon as they are up.
                self.wait_for(self._engines_ready, "the engines to load", 600)
            else:
                self.wait_for(lambda: not s.trainer_busy, "the trainer to load", 600)
            if hasattr(self.scorer, "ready"):  # token scorers (a teacher) load their models first
                self.wait_for(self.scorer.ready, "the token scorers to load", 600)
            if s.baseline_accuracy is None and cfg.run.baseline_eval:
                self.progress.status("evaluating the starting model")
                phases.mark("baseline_eval_start")
                self.heldout.start()
                self.baseline_pending = True
            else:
                self.progress.status(None)
            s.t_train0 = time.monotonic()
            trace.record("orchestrator/window_start", phases.mark("window_start"), 0.0)  # the report's zero
            s.last_step_wall = s.wall_offset
            self.engine_clock.reset(s.engine_totals)
            s.idle.start(s.engine_totals)
            run_trace = run_tracer(s, self.backend)  # buffer waits, trainer idle, counters (no-op when off)
            for gid, prompt in sorted(s.prompts.items()):  # resumed in-flight groups
                if gid not in s.buffer.ready:
                    self._send(gid, prompt, "train", routing.train_params_for(s, prompt), kept=s.kept.pop(gid, ()))
            while s.step < cfg.run.steps or self.checkpoints.busy:
                self.admit()
                self.collect_scored()
                self._poll_baseline()
                self.maybe_dispatch()
                if cfg.runtime.lend_trainer_threads and s.trainer_ready and not s.trainer_busy:
                    self.backend.lend_trainer_threads()  # it waits for a batch: its threads generate
                self.elastic.tick()
                run_trace.tick()
                self.pump(0.005 if self.scorer.num_pending else 0.02)
                run_trace.tick()
                if cfg.run.eval_every and s.step and s.step % cfg.run.eval_every == 0 \
                        and s.step < cfg.run.steps and self.evaluated_at != s.step:
                    self.evaluated_at = s.step
                    self.progress.status(f"evaluating at step {s.step}")
                    self.logger.log(s.step, {"eval/accuracy": self.evaluate()})
                    self.progress.status(None)
            self.wait_for(self._poll_baseline, "the held-out evaluation")  # done unless nothing trained
            train_wall = s.wall_s()
            phases.mark("window_end")
            # The trainer is idle from here: it writes the final checkpoint while the engines load
            # the last weights and the held-out evaluation runs. A smoke run may skip it
            # (run.final_checkpoint = false: a resume starts from the last periodic one).
            # First it hands back the heap it kept for a next step (trainer.keep_host_memory), so
            # the checkpoint's write and the evaluation start from a trimmed heap.
            self.backend.trainer.send(M.ReleaseHostMemory())
            if cfg.run.final_checkpoint:
                self.checkpoints.begin()
            self.wait_for(lambda: min(s.engine_versions.values()) >= s.step, "the final weights")
            phases.mark("final_weights_loaded")
            self.backend.broadcast(M.AbortKind("train"))
            s.group_engine.clear()
            self.backend.lend_trainer_threads()  # the trainer is idle for the rest of the run
            self.progress.status("evaluating the trained model")
            final = self.evaluate()
            phases.mark("final_eval_end")
            self.logger.log(s.step, {"eval/accuracy": final})
            self.progress.status("writing the final checkpoint")
            self.wait_for(lambda: not self.checkpoints.busy, "the final checkpoint")
            phases.mark("final_checkpoint_end")
            self.progress.status(None)
            summary = run_state.summary(s, final, train_wall, time.monotonic() - t_start, self.checkpoints.summary())
            summary["engines"] = self.elastic.summary()
            summary["peak_rss_gb"] = peaks_gb(self.backend.all_workers)  # each worker's, sampled (memory_watch)
            s.calibration.write(s.run_dir.calibration, cfg, summary)
            return summary
        finally:
            self.elastic.close()
            self.checkpoints.close()
            self.progress.close()
            self.ledger.close()

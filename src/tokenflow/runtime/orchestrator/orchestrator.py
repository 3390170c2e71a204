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

import dataclasses
import json
import logging
import time

from tokenflow.buffer import DynamicSampling, RolloutBuffer
from tokenflow.evaluation import prompt_encoder
from tokenflow.metrics import phases, trace
from tokenflow.metrics.run_trace import run_tracer
from tokenflow.runtime.orchestrator import inbox, run_state
from tokenflow.runtime.orchestrator.calibration_log import CalibrationLog
from tokenflow.runtime.orchestrator.elastic import Elastic
from tokenflow.runtime.orchestrator.healing import Healer
from tokenflow.runtime.orchestrator.checkpoints import Checkpointer, resume_kept
from tokenflow.runtime.orchestrator.heldout import HeldOutEval
from tokenflow.runtime.orchestrator.learning_signal import SignalWatch
from tokenflow.runtime.orchestrator.run_state import RunFailed
from tokenflow.runtime.orchestrator.seeds import request_seed
from tokenflow.runtime.orchestrator.step_metrics import (
    EngineClock, EngineTotals, IdleClock, LiveFigures, batch_metrics, engine_metrics, sync_metrics,
)
from tokenflow.runtime.run.run_dir import RunDir
from tokenflow.runtime.view.progress import Progress
from tokenflow.runtime.workers import messages as M
from tokenflow.scoring.shaping import shape_overlong

__all__ = ["Orchestrator", "RunFailed"]

log = logging.getLogger(__name__)




class Orchestrator:
    def __init__(self, cfg, run_dir: RunDir, backend, task, tokenizer, scorer, logger,
                 resume_state: tuple[dict, dict] | None = None) -> None:
        from tokenflow.engine import SamplingParams

        self.cfg, self.run_dir, self.backend, self.task = cfg, run_dir, backend, task
        self.tokenizer, self.scorer, self.logger = tokenizer, scorer, logger
        self._encode = prompt_encoder(tokenizer, cfg.task)
        r, s = cfg.rollout, cfg.sampling
        self.train_params = SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                           max_tokens=s.max_tokens, stop=tuple(s.stop), n=r.group_size)
        eval_params = SamplingParams(temperature=0.0, max_tokens=s.max_tokens, stop=tuple(s.stop))
        self.heldout = HeldOutEval(task, cfg.run.eval_limit, eval_params, self._send_generate, scorer)
        alg = cfg.algorithm
        dynamic = DynamicSampling(alg.dynamic_sampling_max_batches * r.prompts_per_step) if alg.dynamic_sampling else None
        self.buffer = RolloutBuffer(r.prompts_per_step, r.group_size, r.max_staleness, alg.max_token_age, dynamic,
                                    r.batch_order)
        self.dropped_prompt_ids: list[int] = []  # dropped by dynamic sampling since the last batch
        self.blocking = cfg.engine.update_mode == "blocking"
        self.step = 0
        self.cursor = 0
        self.next_group_id = 0
        self.baseline_accuracy: float | None = None
        self.wall_offset = 0.0
        # What earlier invocations of this run did (up to the checkpoint resumed from), so that
        # summary.json covers the whole run, not only the last call.
        self.elapsed_offset = 0.0
        self.tokens_offset = 0
        self.t_start = time.monotonic()
        self.prompts: dict[int, object] = {}  # group id -> Prompt, for in-flight groups
        self.trainer_busy = True  # until TrainerReady
        self.trainer_ready = False  # TrainerReady came (it may come after the window opens)
        self.sync_spec = None  # from TrainerReady; re-sent to an engine that restarts
        self.sync_broken: tuple[float, M.SyncBroken] | None = None  # a failed push awaiting a re-formed group
        self.pending_batch: tuple[list[int], list[int], dict] | None = None  # prompt ids, dropped ids, metrics
        self.engine_versions = {h.name: 0 for h in backend.engines}
        self.engine_totals = EngineTotals()
        self.idle = IdleClock()
        self.live = LiveFigures()
        self.live_figures: dict[str, float] = {}
        self.engine_clock = EngineClock()  # each step's generation rate, on the engines' clocks
        self.signal = SignalWatch(cfg)
        self.progress: Progress | None = None
        self.calibration = CalibrationLog()
        self.sync_timings: list[dict] = []
        self.last_eval: float | None = None
        self.last_progress: dict = {}
        self.last_msg_from = {h.name: time.monotonic() for h in backend.all_workers}
        self.t_train0: float | None = None
        self._evaluated_at = -1
        self.worker_marks: dict[str, float] = {}  # start-up marks the workers sent (WorkerBooted)
        self.booted: set[str] = set()  # workers that sent WorkerBooted
        self._baseline_pending = False  # the starting model's evaluation runs beside training
        self.healer = Healer(self)  # replaces dead workers (runtime.max_worker_restarts)
        self.scoring: dict[int, list] = {}  # group id -> rollouts, for training groups being scored
        self.kept: dict[int, tuple] = {}  # group id -> rollouts a checkpoint kept (resume)
        self.resume_counts: dict[str, int] | None = None
        self.checkpoints = Checkpointer(self)
        if resume_state is not None:
            run_state.restore(self, *resume_state)
            self.kept = resume_kept(self, *resume_state[0].get("kept", ({}, [], "inflight.safetensors")))

    def wall_s(self) -> float:
        return self.wall_offset + (time.monotonic() - self.t_train0 if self.t_train0 is not None else 0.0)

    # ---- admission -------------------------------------------------------------------------
    def groups_needed(self) -> int:
        return self.cfg.run.steps * self.cfg.rollout.prompts_per_step

    def _send_generate(self, gid: int, prompt, kind: str, params, kept: tuple = ()) -> None:
        episode = self.episode_spec(prompt)
        ids = [] if episode is not None else self.encode(prompt.text)  # an episode's reset gives its prompt
        # An engine that is joining takes no work before it holds the current weights.
        engine = min((h for h in self.backend.engines if getattr(h, "accepting", True)), key=lambda h: h.load)
        engine.load += params.n
        self.group_engine[gid] = (engine, params.n)
        engine.send(M.Generate(gid, prompt.id, ids, params, kind, episode=episode, kept=kept))

    def episode_spec(self, prompt):
        """An environment task's episode for ``prompt`` (None for single-turn tasks)."""
        if not getattr(self.cfg.task, "env", None):
            return None
        from tokenflow.runtime.drivers.episodes import EpisodeSpec

        e = self.cfg.episode
        return EpisodeSpec(self.cfg.task.env, prompt.example, e.max_turns, e.max_total_tokens, e.step_timeout_s,
                           agent=self.cfg.task.agent, agent_timeout_s=e.agent_timeout_s)

    def encode(self, text: str) -> list[int]:
        """A prompt's ids (``task.chat_template``: through the template), as everywhere else."""
        return self._encode(text)

    def admit(self) -> None:
        while (self.buffer.rollouts_admitted // self.cfg.rollout.group_size < self.groups_needed()
               and self.buffer.can_admit()):
            prompt = self.task.train_prompt(self.cursor)
            gid = self.next_group_id
            self.cursor += 1
            self.next_group_id += 1
            self.buffer.admit(gid, prompt.id)
            self.prompts[gid] = prompt
            seed = request_seed(self.cfg.run.seed, prompt.id)
            self._send_generate(gid, prompt, "train", dataclasses.replace(self.train_params, seed=seed))

    # ---- message handling ------------------------------------------------------------------
    def pump(self, timeout: float) -> None:
        env = self.backend.recv(timeout)
        while env is not None:
            if self.elastic.admits(env):  # nothing from an engine that was removed
                self.last_msg_from[env.worker] = time.monotonic()
                inbox.handle(self, env.worker, env.message)
            env = self.backend.recv(0)
        self.healer.check_workers()  # backend.check(), replacing the dead the policy allows
        self.checkpoints.poll()
        inbox.check_timeouts(self)

    def _show_live(self) -> None:
        figures = self.live.sample(time.monotonic(), self.idle.trainer_busy_s, self.engine_totals)
        self.live_figures = figures
        if self.progress is not None:
            self.progress.set(**figures)

    def collect_scored(self) -> None:
        for group, meta in self.healer.poll_scored():
            gid = meta["group_id"]
            if self.heldout.on_scored(gid, group):
                continue
            self.scoring.pop(gid, None)
            alg = self.cfg.algorithm
            if alg.overlong_buffer_tokens is not None:
                shape_overlong(group, self.cfg.sampling.max_tokens, alg.overlong_buffer_tokens, alg.overlong_penalty)
            if not self.buffer.put(group):  # dynamic sampling dropped it; admission refills its slot
                self.prompts.pop(gid, None)
                self.dropped_prompt_ids.append(group[0].prompt_id)

    # ---- training --------------------------------------------------------------------------
    def maybe_dispatch(self) -> None:
        # Held while the starting model's evaluation is generated and scored: step 1's weights
        # must not reach an engine that still generates it, and it is logged at step 0.
        if self.trainer_busy or self.step >= self.cfg.run.steps or self._baseline_pending \
                or self.elastic.holds_dispatch():
            return
        self.buffer.mark_trainer_waiting()
        batch = self.buffer.take_batch(self.step)
        if batch is None:
            return
        step = self.step + 1
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
        sync = step % self.cfg.sync.every == 0 or step == self.cfg.run.steps
        prompt_ids = [g[0].prompt_id for g in batch]
        for g in batch:
            self.prompts.pop(g[0].group_id, None)
        dropped, self.dropped_prompt_ids = self.dropped_prompt_ids, []
        self.pending_batch = (prompt_ids, dropped, batch_metrics(
            batch, dropped_groups=len(dropped) if self.buffer.dynamic_sampling is not None else None))
        if self.cfg.run.save_rollouts:
            self.run_dir.append_rollouts(step, rollouts)
        if self.blocking:
            self.backend.broadcast(M.SetPaused(True))
        self.trainer_busy = True
        self.last_msg_from[self.backend.trainer.name] = time.monotonic()
        if step == 1:
            phases.mark("step1_dispatched")
        train = M.Train(step, rollouts, sync_weights=sync)
        self.healer.train_sent(train)  # kept until a checkpoint covers it: a new trainer replays it
        self.backend.trainer.send(train)

    def _maybe_unpause(self) -> None:
        """Blocking mode: resume generation once the trainer is idle and the engines hold the
        latest weights. Checked when a load lands and when a step ends, since either may come
        first; never while a step runs (a load landing after the next dispatch would otherwise
        let the engine generate during training)."""
        if self.blocking and not self.trainer_busy and min(self.engine_versions.values()) >= self.step:
            self.backend.broadcast(M.SetPaused(False))

    def _on_trained(self, msg: M.Trained) -> None:
        self.step = msg.step
        self.trainer_busy = False
        self.idle.trainer_busy_s += msg.train_s + msg.sync_s
        self.calibration.trainer_step(msg)
        prompt_ids, dropped, bmetrics = self.pending_batch
        self.pending_batch = None
        timings, self.sync_timings = self.sync_timings, []
        self.calibration.sync(timings)
        rate = self.engine_clock.step(self.engine_totals, fallback=self.live_figures.get("tokens_per_s", 0.0))
        metrics = {**msg.metrics, **bmetrics, **self.buffer.metrics(), **sync_metrics(timings),
                   **self.checkpoints.take_metrics(),
                   **engine_metrics(self.engine_totals, rate, min(self.engine_versions.values()))}
        wall = self.wall_s()
        metrics.update({"time/wall_s": wall, "time/step_s": wall - self.last_step_wall,
                        "perf/trainer_idle_frac": self.idle.trainer_idle(wall - self.wall_offset),
                        "perf/engine_idle_frac": self.idle.engine_idle(self.engine_totals),
                        "policy/version": float(msg.version)})
        self.last_step_wall = wall
        if self.blocking and not (msg.step % self.cfg.sync.every == 0 or msg.step == self.cfg.run.steps):
            self.backend.broadcast(M.SetPaused(False))  # no push this step: nothing to wait for
        else:
            self._maybe_unpause()  # the engines may have loaded this step's push before we read it
        self.logger.log(self.step, metrics)
        self.signal.observe(self.step, metrics)
        entry = {"step": self.step, "prompt_ids": prompt_ids}
        if self.buffer.dynamic_sampling is not None:
            entry["dropped_prompt_ids"] = dropped  # scored, equal rewards, not trained
        self.ledger.write(json.dumps(entry) + "\n")
        self.ledger.flush()
        self.last_progress = {"reward": metrics.get("reward/mean"),
                              "age_mean": metrics.get("offpolicy/token_age_mean", 0.0),
                              "age_max": metrics.get("offpolicy/token_age_max", 0.0)}
        self._show_live()
        self.progress.update(self.step, self.last_progress)
        every = self.cfg.run.checkpoint_every
        if every and self.step % every == 0 and self.step < self.cfg.run.steps:
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
        self.last_eval = acc = self.heldout.finish()
        self.progress.set(accuracy=(acc, self.step))
        return acc

    def _poll_baseline(self) -> bool:
        """The starting model's evaluation runs beside the first training groups (the engines
        hold version 0 until step 1's weights, which are not sent before it is all generated);
        once scored it is logged at step 0, before step 1 can be."""
        if self._baseline_pending and self.heldout.done():
            self._baseline_pending = False
            self.baseline_accuracy = self._eval_result()
            phases.mark("baseline_eval_end")
            self.logger.log(self.step, {"eval/accuracy": self.baseline_accuracy})
            log.info("baseline held-out accuracy %.3f", self.baseline_accuracy)
            self.progress.status(None)
        return not self._baseline_pending

    def _engines_ready(self) -> bool:
        return all(h.name in self.booted for h in self.backend.engines)

    # ---- the run ---------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        self.group_engine: dict[int, object] = {}
        self.ledger = open(self.run_dir.ledger, "a", encoding="utf-8")
        self.elastic = Elastic(self)  # engines joining and leaving (Ray); the control folder
        self.progress = Progress(cfg.run.steps, start=self.step, enabled=cfg.metrics.progress)
        t_start = self.t_start = time.monotonic()
        try:
            self.progress.status("starting workers")
            if getattr(self.backend, "engines_start_unattached", False):
                # The engines generate with the weights they loaded (version 0, or the
                # checkpoint's) without waiting for the trainer, which loads meanwhile: the
                # training window opens as soon as they are up.
                self.wait_for(self._engines_ready, "the engines to load", 600)
            else:
                self.wait_for(lambda: not self.trainer_busy, "the trainer to load", 600)
            if hasattr(self.scorer, "ready"):  # token scorers (a teacher) load their models first
                self.wait_for(self.scorer.ready, "the token scorers to load", 600)
            if self.baseline_accuracy is None:
                self.progress.status("evaluating the starting model")
                phases.mark("baseline_eval_start")
                self.heldout.start()
                self._baseline_pending = True
            else:
                self.progress.status(None)
            self.t_train0 = time.monotonic()
            trace.record("orchestrator/window_start", phases.mark("window_start"), 0.0)  # the report's zero
            self.last_step_wall = self.wall_offset
            self.engine_clock.reset(self.engine_totals)
            self.idle.start(self.engine_totals)
            run_trace = run_tracer(self)  # buffer waits, trainer idle, counters (no-op when off)
            for gid, prompt in sorted(self.prompts.items()):  # resumed in-flight groups
                if gid not in self.buffer.ready:
                    seed = request_seed(cfg.run.seed, prompt.id)
                    self._send_generate(gid, prompt, "train", dataclasses.replace(self.train_params, seed=seed),
                                        kept=self.kept.pop(gid, ()))
            while self.step < cfg.run.steps or self.checkpoints.busy:
                self.admit()
                self.collect_scored()
                self._poll_baseline()
                self.maybe_dispatch()
                self.elastic.tick()
                run_trace.tick()
                self.pump(0.005 if self.scorer.num_pending else 0.02)
                run_trace.tick()
                if cfg.run.eval_every and self.step and self.step % cfg.run.eval_every == 0 \
                        and self.step < cfg.run.steps and self._evaluated_at != self.step:
                    self._evaluated_at = self.step
                    self.progress.status(f"evaluating at step {self.step}")
                    self.logger.log(self.step, {"eval/accuracy": self.evaluate()})
                    self.progress.status(None)
            self.wait_for(self._poll_baseline, "the held-out evaluation")  # done unless nothing trained
            train_wall = self.wall_s()
            phases.mark("window_end")
            # The trainer is idle from here: it writes the final checkpoint while the engines load
            # the last weights and the held-out evaluation runs.
            self.checkpoints.begin()
            self.wait_for(lambda: min(self.engine_versions.values()) >= self.step, "the final weights")
            phases.mark("final_weights_loaded")
            self.backend.broadcast(M.AbortKind("train"))
            self.group_engine.clear()
            self.backend.lend_trainer_threads()  # the trainer is idle for the rest of the run
            self.progress.status("evaluating the trained model")
            final = self.evaluate()
            phases.mark("final_eval_end")
            self.logger.log(self.step, {"eval/accuracy": final})
            self.progress.status("writing the final checkpoint")
            self.wait_for(lambda: not self.checkpoints.busy, "the final checkpoint")
            phases.mark("final_checkpoint_end")
            self.progress.status(None)
            summary = run_state.summary(self, final, train_wall, time.monotonic() - t_start)
            summary["engines"] = self.elastic.summary()
            self.calibration.write(self.run_dir.calibration, cfg, summary)
            return summary
        finally:
            self.elastic.close()
            self.checkpoints.close()
            self.progress.close()
            self.ledger.close()

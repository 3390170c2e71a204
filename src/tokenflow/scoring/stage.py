"""The scoring stage: the task's outcome reward plus token-shaped scorers, one group at a time.

    Generated group ──► outcome pool (reward fn: per sample / per group) ──┐
                   └──► token pool per scorer (teacher, PRM, user fn) ─────┴─► group done
                        (own worker process each; one call per group)

A group leaves the stage when the outcome reward and every token scorer are done with it, with
``Rollout.token_rewards`` = Σ coef · scorer rewards (:func:`apply_token_scores`). Everything runs
in worker processes, so scoring overlaps generation and training like the reward function does;
each call is bounded by n × ``runtime.score_timeout_s`` and a scorer that fails or times out
fails its group's samples, not the run. Evaluation groups (``kind="eval"``) get the outcome
reward only.

``ScoringStage`` offers the orchestrator the same ``submit``/``poll``/``close`` as
``ScorerPool``; with no token scorer configured, :func:`build_scoring` returns the pool itself.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from tokenflow.metrics import trace
from tokenflow.rollout import Rollout
from tokenflow.scoring.token_scorer_specs import (
    SampleView, TokenScorerSpec, apply_token_scores, build_token_scorer, token_scorer_specs,
)

log = logging.getLogger(__name__)

_scorer = None


def _init_token_worker(spec: TokenScorerSpec, trace_dir: str | None = None) -> None:
    global _scorer
    trace.configure(trace_dir, f"scorer-{spec.name}", flush_every=256, flush_interval_s=1.0)
    _scorer = build_token_scorer(spec)


def _ready() -> bool:
    """A no-op task: done once the worker has started and built its scorer."""
    return _scorer is not None


def _score_tokens(jobs: list[tuple[str, list[SampleView], dict]]) -> list:
    """Score several groups in one call: batched (one forward pass) where the scorer can."""
    with trace.span(f"scorer/{_scorer.name}", groups=len(jobs), n=sum(len(j[1]) for j in jobs)):
        many = getattr(_scorer, "score_many", None)
        out = many(jobs) if many is not None else [_scorer.score(*job) for job in jobs]
    trace.flush()
    return out


@dataclass
class _Entry:
    group: list[Rollout]
    meta: dict
    results: list
    """Per token scorer: None while waiting, then its TokenScores or the error that stopped it."""
    outcome_done: bool = False


@dataclass
class _TokenWorkers:
    """One token scorer's pool, the groups queued for it and the calls in flight."""

    spec: TokenScorerSpec
    pool: object
    queue: list = field(default_factory=list)
    in_flight: list = field(default_factory=list)  # (future, [keys], samples)


class ScoringStage:
    """Outcome pool + one worker pool per token scorer; see the module docstring.

    Groups wait in a queue per token scorer and go to its worker together when the worker is
    free (at most ``max_groups_per_call``), so a model scorer batches as many groups as arrived
    while it was busy into one forward pass: its throughput grows with the load.
    """

    def __init__(self, outcome, specs: list[TokenScorerSpec], timeout_s: float, workers: int = 1,
                 max_groups_per_call: int = 16) -> None:
        from pebble import ProcessPool

        self.outcome, self.specs, self.timeout_s = outcome, specs, timeout_s
        self.workers, self.max_groups_per_call = workers, max_groups_per_call
        tdir = trace.trace_dir()
        # spawn: the parent holds torch threads; forking it can deadlock OpenMP in the child.
        self._token = [_TokenWorkers(spec, ProcessPool(max_workers=workers, initializer=_init_token_worker,
                                                       initargs=(spec, str(tdir) if tdir else None),
                                                       context=mp.get_context("spawn"))) for spec in specs]
        # Start every worker now (loading a teacher takes a while) rather than on the first group.
        self._warmups = [(tw.spec, tw.pool.schedule(_ready)) for tw in self._token]
        self._waiting: dict[int, _Entry] = {}
        self._jobs: dict[int, tuple] = {}
        self._keys = itertools.count()
        self.token_failed = 0
        self.token_busy_s = {spec.name: 0.0 for spec in specs}

    @property
    def shape(self) -> str:
        return self.outcome.shape

    def worker_pids(self) -> list[int]:
        """The outcome pool's worker pids and the token scorers' (for the run's workers.json)."""
        pids = list(self.outcome.worker_pids())
        for tw in self._token:
            manager = getattr(tw.pool, "_pool_manager", None)
            pids += sorted(getattr(getattr(manager, "worker_manager", None), "workers", None) or {})
        return pids

    def ready(self) -> bool:
        """Whether every token scorer's worker has loaded its scorer; raises if one failed to."""
        for spec, f in self._warmups:
            if f.done() and f.exception() is not None:
                raise RuntimeError(f"the {spec.name} scorer failed to start: {f.exception()}")
        return all(f.done() for _, f in self._warmups)

    def submit(self, group: list[Rollout], prompt_text: str, example: dict, **meta) -> None:
        key = next(self._keys)
        self.outcome.submit(group, prompt_text, example, _stage_key=key, **meta)
        scored = meta.get("kind") != "eval"
        self._waiting[key] = _Entry(group, meta, [None] * len(self._token) if scored else [])
        if scored:
            self._jobs[key] = (prompt_text, [SampleView.of(r) for r in group], example)
            for tw in self._token:
                tw.queue.append(key)
            self._dispatch()

    def _dispatch(self) -> None:
        for tw in self._token:
            while tw.queue and len(tw.in_flight) < self.workers:
                keys = tw.queue[:self.max_groups_per_call]
                del tw.queue[:len(keys)]
                jobs = [self._jobs[k] for k in keys]
                n = sum(len(j[1]) for j in jobs)
                future = tw.pool.schedule(_score_tokens, args=(jobs,), timeout=self.timeout_s * n)
                tw.in_flight.append((future, keys, n))

    @property
    def num_pending(self) -> int:
        return len(self._waiting)

    def poll(self) -> list[tuple[list[Rollout], dict]]:
        for _, meta in self.outcome.poll():
            self._waiting[meta.pop("_stage_key")].outcome_done = True
        for i, tw in enumerate(self._token):
            still = []
            for future, keys, n in tw.in_flight:
                if not future.done():
                    still.append((future, keys, n))
                    continue
                for key, res in zip(keys, self._results(tw.spec, future, keys, n)):
                    self._waiting[key].results[i] = res
            tw.in_flight = still
        self._dispatch()
        done = []
        for key, e in list(self._waiting.items()):
            if not e.outcome_done or any(r is None for r in e.results):
                continue
            apply_token_scores(e.group, list(zip(self.specs, e.results)))
            del self._waiting[key]
            self._jobs.pop(key, None)
            done.append((e.group, e.meta))
        return done

    def _results(self, spec: TokenScorerSpec, future, keys: list[int], n: int) -> list:
        try:
            res = future.result()
        except FutureTimeout:
            res = f"exceeded {self.timeout_s * n:g}s for {n} samples (runtime.score_timeout_s × n)"
        except Exception as e:  # noqa: BLE001 - a scorer (or its worker) may fail in any way
            res = f"{type(e).__name__}: {e}"
        if isinstance(res, str):
            self.token_failed += len(keys)
            if self.token_failed <= 5 or self.token_failed % 100 == 0:
                log.warning("the %s scorer failed on %d group(s): %s (%d failures so far)", spec.name,
                            len(keys), res, self.token_failed)
            return [res] * len(keys)
        self.token_busy_s[spec.name] += sum(float(r.metrics.get("time_s", 0.0)) for r in res)
        return res

    def restart(self) -> None:
        """The outcome pool died (`ScorerPool.restart`); the token scorers' pools keep theirs."""
        self.outcome.restart()

    # The outcome pool's counters, for the callers that read them.
    @property
    def failed(self) -> int:
        return self.outcome.failed

    @property
    def timeouts(self) -> int:
        return self.outcome.timeouts

    @property
    def scored(self) -> int:
        return self.outcome.scored

    def close(self) -> None:
        self.outcome.close()
        for tw in self._token:
            tw.pool.stop()
            tw.pool.join(timeout=5)


def check_token_scorers(cfg, student_model: str) -> list[TokenScorerSpec]:
    """The configured token scorers, with what can be refused at start refused now."""
    specs = token_scorer_specs(cfg.scorer)
    for spec in specs:
        if spec.kind == "teacher":
            from tokenflow.scoring.teacher import check_same_tokenizer

            check_same_tokenizer(student_model, spec.config["model"])
    if cfg.scorer.token is not None:
        from tokenflow.scoring.token_scorer_specs import FunctionTokenScorer

        FunctionTokenScorer(cfg.scorer.token)  # importable and marked as a token scorer
    return specs


def build_scoring(outcome, cfg, student_model: str):
    """``outcome`` (a scorer pool) alone, or a :class:`ScoringStage` when token scorers are set."""
    if not cfg.scorer.any_token_scorer:
        return outcome
    specs = check_token_scorers(cfg, student_model)
    return ScoringStage(outcome, specs, cfg.runtime.score_timeout_s)

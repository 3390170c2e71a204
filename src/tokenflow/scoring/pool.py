"""Scoring in a pool of worker processes with a per-sample timeout.

A group is scored as one task in a `pebble` process pool (one round trip for its n samples).
If that task runs past n × the per-sample timeout, its worker is killed and replaced and the
group is scored again one sample per task, each with the per-sample timeout, so a reward
function that hangs fails only its own sample. A reward function that raises marks its sample
failed with the error kept in ``rollout.info``. Either way the run goes on; failures are
counted and logged.

A worker process that dies (killed, out of memory, a reward that calls ``os._exit`` or
segfaults) is different: pebble cannot tell which samples it took down with it, and a pool whose
idle worker died refuses new work. :meth:`ScorerPool.check`, called on every turn of the
orchestrator's loop, raises :class:`ScorerDied` naming the process; the orchestrator then
either stops the run with a resume command, or (``runtime.max_worker_restarts``) calls
:meth:`ScorerPool.restart`, which builds a new pool and scores every pending group again.

Workers load the reward function themselves from its ``module:function`` name (the pool's
initializer), so nothing but strings and small dicts crosses the process boundary.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import numbers
import time
from concurrent.futures import TimeoutError as FutureTimeout

from pebble import ProcessExpired
from dataclasses import dataclass, field

from tokenflow.metrics import trace
from tokenflow.rollout import Rollout
from tokenflow.errors import WorkerDied
from tokenflow.scoring.scorer_shapes import normalise_group, shape_of

log = logging.getLogger(__name__)

_reward_fn = None


def _init_worker(reward_spec: str, trace_dir: str | None = None) -> None:
    global _reward_fn
    from tokenflow.tasks.reward_loading import load_reward_fn

    # Each scored group is flushed before its result goes back (a group is a few events); the
    # limits below only bound what a task that never returns can hold.
    trace.configure(trace_dir, "scorer", flush_every=256, flush_interval_s=1.0)
    _reward_fn = load_reward_fn(reward_spec)


def _score_one(prompt: str, completion: str, example: dict) -> dict[str, float]:
    with trace.span("scorer/score"):
        out = _reward_fn(prompt, completion, example)
    return normalise_reward(out)


def _score_group(prompt: str, completions: list[str], example: dict) -> list:
    """Rewards of every completion; an exception becomes its message (that sample fails, or
    every sample for a per-group scorer)."""
    if shape_of(_reward_fn) == "group":
        try:
            with trace.span("scorer/score_group", n=len(completions)):
                out = [normalise_reward(r) for r in normalise_group(_reward_fn(prompt, completions, example),
                                                                     len(completions))]
        except Exception as e:  # noqa: BLE001 - the user's reward function may raise anything
            out = [f"{type(e).__name__}: {e}"] * len(completions)
        trace.flush()
        return out
    out = []
    for c in completions:
        try:
            out.append(_score_one(prompt, c, example))
        except Exception as e:  # noqa: BLE001 - the user's reward function may raise anything
            out.append(f"{type(e).__name__}: {e}")
    # On disk before the result is: a worker may be stopped (SIGTERM, then SIGKILL after pebble's
    # grace period) or killed on a timeout at any moment after it, losing what is buffered.
    trace.flush()
    return out


def scored_text(r: Rollout):
    """What the reward function reads for ``r``: its completion text, or for a multi-turn
    episode the episode's summary (`tokenflow.scoring.episodes`)."""
    episode = r.info.get("episode")
    if episode is not None:
        return {**episode, "sample_index": r.sample_index}
    return r.text or ""


class ScorerDied(WorkerDied):
    pass


def _number(value, what: str) -> float:
    # float("1.0") would succeed: a string is refused so a reward that returns text is caught
    # instead of silently read as a number.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} is {type(value).__name__} {value!r}; a reward function must return a "
                        "float (or a dict of floats with a 'reward' entry)")
    if not math.isfinite(value):  # NaN/inf would poison every advantage of the group
        raise ValueError(f"{what} is {float(value)!r}; a reward must be a finite number (the sample is "
                         "counted as failed: reward/failed_frac)")
    return float(value)


def normalise_reward(out) -> dict[str, float]:
    """A reward function's return value as ``{"reward": float, other components...}``."""
    if isinstance(out, dict):
        if "reward" not in out:
            raise ValueError(f"reward dict needs a 'reward' entry, got keys {sorted(out)}")
        return {str(k): _number(v, f"reward component {k!r}") for k, v in out.items()}
    return {"reward": _number(out, "the reward")}


@dataclass
class _Pending:
    group: list[Rollout]
    futures: list
    started: float
    prompt: str
    example: dict
    meta: dict = field(default_factory=dict)
    per_sample: bool = False


class ScorerPool:
    """Scores whole groups; ``poll()`` returns the groups whose every sample is done."""

    _broken: ScorerDied | None = None  # a submit found the pool broken; check() reports it

    shape = "sample"
    """The reward function's shape: "sample" or "group" (a group that runs out of time has no
    per-sample retry and fails whole)."""

    def __init__(self, reward_spec: str, workers: int = 1, timeout_s: float = 10.0) -> None:
        from pebble import ProcessPool

        from tokenflow.tasks.reward_loading import load_reward_fn

        self.shape = shape_of(load_reward_fn(reward_spec))
        if self.shape == "token":
            raise ValueError(f"task.reward {reward_spec!r} is a token scorer; name it in scorer.token "
                             "and give the task an outcome reward (per sample or per group)")
        self.timeout_s = timeout_s
        tdir = trace.trace_dir()  # scorer processes trace into the run's folder too
        # spawn: the parent holds torch threads; forking it can deadlock OpenMP in the child.
        self._new_pool = lambda: ProcessPool(max_workers=workers, initializer=_init_worker,
                                             initargs=(reward_spec, str(tdir) if tdir else None),
                                             context=mp.get_context("spawn"))
        self._pool = self._new_pool()
        self._pool.active  # noqa: B018 - starts the workers now (pebble starts them on first use)
        self._pending: list[_Pending] = []
        self._pids: dict[int, object] = {}  # worker pid -> its process, as last seen alive
        self.failed = 0
        self.timeouts = 0
        self.scored = 0

    def worker_pids(self) -> list[int]:
        """The pids of the live worker processes (pebble's own table; empty if it changed shape)."""
        manager = getattr(self._pool, "_pool_manager", None)
        workers = getattr(getattr(manager, "worker_manager", None), "workers", None) or {}
        return sorted(workers)

    def _watch(self) -> None:
        manager = getattr(self._pool, "_pool_manager", None)
        workers = getattr(getattr(manager, "worker_manager", None), "workers", None) or {}
        # Processes pebble retired on purpose (a timed-out task) drop out; live ones are kept so
        # that one found dead on a later turn can be named.
        self._pids = {pid: p for pid, p in {**self._pids, **workers}.items() if getattr(p, "exitcode", 0) is None}

    def _died(self, why: str) -> ScorerDied:
        dead = [(pid, getattr(p, "exitcode", None)) for pid, p in self._pids.items()
                if getattr(p, "exitcode", None) not in (None, 0)]
        who = ", ".join(f"pid {pid}, exit code {code}" for pid, code in dead) or "pid unknown"
        return ScorerDied(f"the scorer worker process ({who}) died: {why}")

    def check(self) -> None:
        """Raise ``ScorerDied`` if a worker process died (the pool cannot go on without it)."""
        if self._broken is not None:
            raise self._broken
        if not self._pool.active:
            raise self._died("the scorer pool stopped accepting work")
        self._watch()
        for p in self._pending:
            for f in p.futures:
                if f.done() and isinstance(f.exception(), ProcessExpired):
                    e = f.exception()
                    self._pids.setdefault(e.pid, None)
                    raise ScorerDied(f"the scorer worker process (pid {e.pid}, exit code {e.exitcode}) died "
                                     f"while scoring group {p.meta.get('group_id')} ({e})")

    def _schedule(self, fn, args: tuple, timeout: float):
        try:
            return self._pool.schedule(fn, args=args, timeout=timeout)
        except RuntimeError as e:  # pebble: "Unexpected error within the Pool" after a worker died
            raise self._died(str(e)) from None

    def submit(self, group: list[Rollout], prompt_text: str, example: dict, **meta) -> None:
        """Queue ``group`` for scoring. A broken pool does not raise here: the group waits, and the
        next ``check`` (or ``poll``) reports the death."""
        texts = [scored_text(r) for r in group]
        try:
            futures = [self._schedule(_score_group, (prompt_text, texts, example), self.timeout_s * len(group))]
        except ScorerDied as e:
            self._broken, futures = e, []
        self._pending.append(_Pending(group, futures, time.time(), prompt_text, example, meta))

    def restart(self) -> None:
        """A new pool in place of one a dead worker broke. Every pending group is scored again
        from the start: pebble cannot say which samples the dead worker took with it, and a
        reward function is a pure function of its inputs."""
        try:
            self._pool.stop()
            self._pool.join(timeout=5)
        except Exception as e:  # noqa: BLE001 - a broken pool may fail to stop; its workers are gone or killed
            log.debug("stopping the broken scorer pool: %s", e)
        self._pool, self._pids, self._broken = self._new_pool(), {}, None
        self._pool.active  # noqa: B018 - start the workers now
        pending, self._pending = self._pending, []
        for p in pending:
            self.submit(p.group, p.prompt, p.example, **p.meta)

    def _rescore_per_sample(self, p: _Pending) -> None:
        """The group task timed out: find the hanging sample(s), one task per sample."""
        p.futures = [self._schedule(_score_one, (p.prompt, scored_text(r), p.example), self.timeout_s)
                     for r in p.group]
        p.per_sample = True

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def poll(self) -> list[tuple[list[Rollout], dict]]:
        self.check()
        done, still = [], []
        for p in self._pending:
            if not all(f.done() for f in p.futures):
                still.append(p)
                continue
            if not p.per_sample and isinstance(p.futures[0].exception(), FutureTimeout) \
                    and self.shape == "sample":
                self._rescore_per_sample(p)
                still.append(p)
                continue
            self._finish(p)
            done.append((p.group, p.meta))
        self._pending = still
        return done

    def _finish(self, p: _Pending) -> None:
        if p.per_sample:
            results = []
            for f in p.futures:
                try:
                    results.append(f.result())
                except FutureTimeout:
                    results.append(None)
                except Exception as e:  # noqa: BLE001 - the user's reward function may raise anything
                    results.append(f"{type(e).__name__}: {e}")
        else:
            try:
                results = p.futures[0].result()
            except FutureTimeout:  # a per-group scorer ran out of its n × timeout
                results = [None] * len(p.group)
            except Exception as e:  # noqa: BLE001 - the group task itself failed (check() caught deaths)
                results = [f"{type(e).__name__}: {e}"] * len(p.group)
        for r, res in zip(p.group, results):
            if res is None:
                self._fail(r, f"reward function exceeded {self.timeout_s:g}s")
                self.timeouts += 1
            elif isinstance(res, str):
                self._fail(r, res)
            else:
                r.rewards = res
                r.reward = res["reward"]
                # Scored again (a resume's kept group, a restarted pool): an earlier scoring failure
                # is gone. An episode its environment failed stays failed (``env_error``).
                if r.info.pop("score_error", None) is not None and "env_error" not in r.info:
                    r.failed = False
            self.scored += 1
        trace.record("scorer/group", p.started, time.time() - p.started, n=len(p.group))

    def _fail(self, r: Rollout, why: str) -> None:
        r.failed = True
        r.reward = None
        r.info["score_error"] = why
        self.failed += 1
        if self.failed <= 5 or self.failed % 100 == 0:
            log.warning("scoring failed for prompt %d sample %d: %s (%d failures so far)",
                        r.prompt_id, r.sample_index, why, self.failed)

    def close(self) -> None:
        self._pool.stop()
        self._pool.join(timeout=5)

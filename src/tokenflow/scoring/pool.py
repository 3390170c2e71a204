"""Scoring in a pool of worker processes with a per-sample timeout.

Each sample is one task in a `pebble` process pool: a reward function that hangs past the
timeout has its worker killed and replaced, and that sample alone is marked failed. A reward
function that raises marks its sample failed with the error kept in ``rollout.info``. Either
way the run goes on; failures are counted and logged.

Workers load the reward function themselves from its ``module:function`` name (the pool's
initializer), so nothing but strings and small dicts crosses the process boundary.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from tokenflow.metrics import trace
from tokenflow.rollout import Rollout

log = logging.getLogger(__name__)

_reward_fn = None


def _init_worker(reward_spec: str) -> None:
    global _reward_fn
    from tokenflow.tasks.reward_loading import load_reward_fn

    _reward_fn = load_reward_fn(reward_spec)


def _score_one(prompt: str, completion: str, example: dict) -> dict[str, float]:
    out = _reward_fn(prompt, completion, example)
    return normalise_reward(out)


def normalise_reward(out) -> dict[str, float]:
    """A reward function's return value as ``{"reward": float, other components...}``."""
    if isinstance(out, dict):
        if "reward" not in out:
            raise ValueError(f"reward dict needs a 'reward' entry, got keys {sorted(out)}")
        return {k: float(v) for k, v in out.items()}
    return {"reward": float(out)}


@dataclass
class _Pending:
    group: list[Rollout]
    futures: list
    started: float
    meta: dict = field(default_factory=dict)


class ScorerPool:
    """Scores whole groups; ``poll()`` returns the groups whose every sample is done."""

    def __init__(self, reward_spec: str, workers: int = 1, timeout_s: float = 10.0) -> None:
        from pebble import ProcessPool

        self.timeout_s = timeout_s
        # spawn: the parent holds torch threads; forking it can deadlock OpenMP in the child.
        self._pool = ProcessPool(max_workers=workers, initializer=_init_worker,
                                 initargs=(reward_spec,), context=mp.get_context("spawn"))
        self._pending: list[_Pending] = []
        self.failed = 0
        self.timeouts = 0
        self.scored = 0

    def submit(self, group: list[Rollout], prompt_text: str, example: dict, **meta) -> None:
        futures = [self._pool.schedule(_score_one, args=(prompt_text, r.text or "", example),
                                       timeout=self.timeout_s) for r in group]
        self._pending.append(_Pending(group, futures, time.time(), meta))

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def poll(self) -> list[tuple[list[Rollout], dict]]:
        done, still = [], []
        for p in self._pending:
            if all(f.done() for f in p.futures):
                self._finish(p)
                done.append((p.group, p.meta))
            else:
                still.append(p)
        self._pending = still
        return done

    def _finish(self, p: _Pending) -> None:
        for r, f in zip(p.group, p.futures):
            try:
                rewards = f.result()
                r.rewards = rewards
                r.reward = rewards["reward"]
            except FutureTimeout:
                self._fail(r, f"reward function exceeded {self.timeout_s:g}s")
                self.timeouts += 1
            except Exception as e:  # noqa: BLE001 - the user's reward function may raise anything
                self._fail(r, f"{type(e).__name__}: {e}")
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

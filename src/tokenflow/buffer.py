"""The bounded rollout buffer between generation and training.

    orchestrator ──admit(group)──► [in flight: engine, scorer] ──put(group)──► [ready] ──take_batch()──► trainer
          ▲                                                                                     │
          └──────────── capacity frees when the trainer's new weights reach the engine ◄────────┘

Admission control is where backpressure comes from. A group may be admitted only while

    rollouts admitted so far + group_size ≤ (engine_version + max_staleness + 1) × rollouts_per_step

``engine_version`` is the policy version whose weights the engine has loaded. Groups are
consumed ``prompts_per_step`` at a time, oldest admission first, so a rollout admitted under
version ``v`` is consumed by a step no later than ``v + max_staleness`` unless a straggler is
overtaken by younger groups — which is what version rejection (``max_token_age``) and the
trainer's importance-sampling corrections are for. ``batch_order`` says whether that may happen:
"ready" takes the oldest groups already scored (a straggler is overtaken), "admission" takes the
``prompts_per_step`` oldest admitted groups and waits until they are all scored (none is, and no
token is older than ``max_staleness``). In other words the usual rule "at most
(K + 1) × rollouts-per-step admitted and not yet consumed" holds, where a slot is freed only
once the trainer has consumed its rollout *and* the weights produced by that step are live in
the engine — so with ``max_staleness = 0`` nothing is generated before the new weights arrive:
synchronous training through the same code path.

**Dynamic sampling** (DAPO, optional): a scored group whose samples are all correct or all wrong
(``0 < #correct < G`` fails, correct meaning task reward ≥ ``CORRECT_REWARD``, the threshold of
held-out accuracy, before any shaping) is dropped at ``put`` instead of becoming ready, and its
rollouts leave the admitted count, so the slot it held is free again and admission refills it
with the next prompt. A cap on the drops between two batches keeps a run whose every group is
uninformative moving (see :class:`DynamicSampling`).

The buffer is plain Python with no locks: the orchestrator owns it and calls it from one thread.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import numpy as np

from tokenflow.rollout import CORRECT_REWARD, Rollout, task_reward

log = logging.getLogger(__name__)


@dataclass
class BufferStats:
    groups_admitted: int = 0
    groups_ready: int = 0
    groups_consumed: int = 0
    groups_dropped: int = 0
    """Groups dynamic sampling dropped (all correct or all wrong), over the run."""
    flat_groups_kept: int = 0
    """All-correct or all-wrong groups dynamic sampling kept because its cap was reached."""
    rollouts_failed: int = 0
    tokens_rejected: int = 0
    admission_wait_s: float = 0.0
    """Time generation could not be fed because the staleness budget was full (backpressure)."""
    batch_wait_s: float = 0.0
    """Time the trainer was ready but the buffer held fewer than one step's groups."""
    age_histogram: Counter = field(default_factory=Counter)
    """Token age at consumption (trainer version − token version) → token count."""


def admission_capacity(engine_version: int, max_staleness: int, rollouts_per_step: int,
                       rollouts_admitted: int) -> int:
    """The admission rule (the module docstring): rollouts that may still be admitted when
    ``rollouts_admitted`` have been (and not dropped) and the engines have loaded
    ``engine_version``, under a staleness budget of ``max_staleness``. A group of G rollouts is
    admitted when this is at least G. The buffer and the capacity simulator
    (``tokenflow.sim.buffer``) both admit by it."""
    return (engine_version + max_staleness + 1) * rollouts_per_step - rollouts_admitted


def uninformative(group: list[Rollout]) -> bool:
    """DAPO's test: whether the group's scored samples (at least one) are all correct or all
    wrong, i.e. not 0 < #correct < #scored. Correct is a task reward ≥ ``CORRECT_REWARD``
    before shaping (:func:`tokenflow.rollout.task_reward`), so an all-wrong group whose shaped
    rewards differ only by the overlong penalty is dropped, and a group with a correct sample
    is kept. A group whose every sample failed is not uninformative (the run must see it)."""
    rewards = [task_reward(r) for r in group]
    scored = [x for x in rewards if x is not None]
    correct = sum(x >= CORRECT_REWARD for x in scored)
    return bool(scored) and correct in (0, len(scored))


class DynamicSampling:
    """DAPO's filter with a guard: drop all-correct and all-wrong groups, at most ``max_drops``
    of them between two consecutive batches; past that, keep them (the trainer skips those whose
    advantage is 0, as it skips every zero-advantage sequence) and warn once per run, so that a
    task the model has solved, or cannot solve at all, slows the run down instead of stalling it."""

    def __init__(self, max_drops: int) -> None:
        self.max_drops = max_drops
        self.since_batch = 0
        self.warned = False

    def drop(self, group: list[Rollout]) -> bool:
        if not uninformative(group):
            return False
        if self.since_batch < self.max_drops:
            self.since_batch += 1
            return True
        if not self.warned:
            self.warned = True
            log.warning(
                "dynamic sampling dropped %d all-correct or all-wrong groups since the last batch (the cap, "
                "algorithm.dynamic_sampling_max_batches × rollout.prompts_per_step); such groups are "
                "kept until the next batch so the run goes on. When every group is all correct or all "
                "wrong the task is solved or too hard for the model: see "
                "docs/howto/doesnt-learn.md. Counted as buffer/flat_groups_kept.", self.since_batch)
        return False

    def batch_taken(self) -> int:
        """A batch left the buffer: return the groups dropped while it filled, and start again."""
        n, self.since_batch = self.since_batch, 0
        return n


class RolloutBuffer:
    """Bounded, version-aware buffer of scored rollout groups. See the module docstring."""

    def __init__(self, prompts_per_step: int, group_size: int, max_staleness: int,
                 max_token_age: int | None = None, dynamic_sampling: DynamicSampling | None = None,
                 batch_order: str = "ready") -> None:
        if batch_order not in ("admission", "ready"):
            raise ValueError(f"batch_order must be 'admission' or 'ready', not {batch_order!r}")
        self.batch_order = batch_order
        self.prompts_per_step = prompts_per_step
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.max_token_age = max_token_age
        self.engine_version = 0
        self.rollouts_admitted = 0
        self.in_flight: OrderedDict[int, int] = OrderedDict()  # group_id -> prompt_id
        self.ready: dict[int, list[Rollout]] = {}
        self.stats = BufferStats()
        self.dynamic_sampling = dynamic_sampling
        self.last_batch_dropped = 0
        """Groups dynamic sampling dropped while the last batch taken was filling."""
        self._blocked_since: float | None = None
        self._starved_since: float | None = None

    # ---- admission -------------------------------------------------------------------------
    @property
    def rollouts_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    def capacity(self) -> int:
        """Rollouts that may be admitted now without exceeding the staleness budget."""
        return admission_capacity(self.engine_version, self.max_staleness, self.rollouts_per_step,
                                  self.rollouts_admitted)

    def can_admit(self, now: float | None = None) -> bool:
        ok = self.capacity() >= self.group_size
        now = time.monotonic() if now is None else now
        if ok and self._blocked_since is not None:
            self.stats.admission_wait_s += now - self._blocked_since
            self._blocked_since = None
        elif not ok and self._blocked_since is None:
            self._blocked_since = now
        return ok

    def admit(self, group_id: int, prompt_id: int) -> None:
        if self.capacity() < self.group_size:
            raise RuntimeError("admit() past the staleness budget; call can_admit() first")
        self.in_flight[group_id] = prompt_id
        self.rollouts_admitted += self.group_size
        self.stats.groups_admitted += 1

    def set_engine_version(self, version: int) -> None:
        """The engine has loaded the weights of ``version``: capacity grows accordingly."""
        self.engine_version = max(self.engine_version, version)

    # ---- completion ------------------------------------------------------------------------
    def put(self, group: list[Rollout]) -> bool:
        """A scored (and shaped) group, all samples of one prompt, is ready for training; False when
        dynamic sampling dropped it instead (its slot is free for a new prompt)."""
        gid = group[0].group_id
        if gid not in self.in_flight:
            raise KeyError(f"group {gid} was not admitted (or was already put)")
        if self.dynamic_sampling is not None:
            if self.dynamic_sampling.drop(group):
                del self.in_flight[gid]
                self.rollouts_admitted -= self.group_size
                self.stats.groups_dropped += 1
                return False
            if uninformative(group):
                self.stats.flat_groups_kept += 1
        self.ready[gid] = group
        self.stats.groups_ready += 1
        self.stats.rollouts_failed += sum(r.failed for r in group)
        return True

    @property
    def num_ready(self) -> int:
        return len(self.ready)

    @property
    def fill(self) -> float:
        """Admitted-but-unconsumed rollouts as a fraction of the budget (K + 1) × rollouts per step."""
        return len(self.in_flight) * self.group_size / ((self.max_staleness + 1) * self.rollouts_per_step)

    # ---- consumption -----------------------------------------------------------------------
    def take_batch(self, trainer_version: int, now: float | None = None) -> list[list[Rollout]] | None:
        """The next ``prompts_per_step`` ready groups, oldest admission first, or None.

        Records token ages at consumption (relative to ``trainer_version``) and counts tokens
        older than ``max_token_age``; the trainer drops those tokens from the loss.
        """
        now = time.monotonic() if now is None else now
        if not self._batch_ready():
            if self._starved_since is None:
                self._starved_since = now
            return None
        if self._starved_since is not None:
            self.stats.batch_wait_s += now - self._starved_since
            self._starved_since = None
        # Oldest admissions first so stragglers are not overtaken more than necessary.
        order = [gid for gid in self.in_flight if gid in self.ready][: self.prompts_per_step]
        batch = []
        for gid in order:
            group = self.ready.pop(gid)
            del self.in_flight[gid]
            batch.append(group)
            for r in group:
                # Generated tokens only: environment tokens (loss mask 0) were never sampled.
                ages = trainer_version - r.versions[r.loss_mask > 0]
                vals, counts = np.unique(ages, return_counts=True)
                for a, c in zip(vals.tolist(), counts.tolist()):
                    self.stats.age_histogram[int(a)] += int(c)
                if self.max_token_age is not None:
                    self.stats.tokens_rejected += int((ages > self.max_token_age).sum())
        self.stats.groups_consumed += len(batch)
        if self.dynamic_sampling is not None:
            self.last_batch_dropped = self.dynamic_sampling.batch_taken()
        return batch

    def _batch_ready(self) -> bool:
        """Whether a batch can be taken now: ``prompts_per_step`` ready groups ("ready"), or the
        ``prompts_per_step`` oldest admitted groups all ready ("admission")."""
        if len(self.ready) < self.prompts_per_step:
            return False
        if self.batch_order == "ready":
            return True
        oldest = list(itertools.islice(self.in_flight, self.prompts_per_step))
        return all(gid in self.ready for gid in oldest)

    def mark_trainer_waiting(self, now: float | None = None) -> None:
        """The trainer is idle: start counting batch wait if the buffer cannot serve it."""
        if not self._batch_ready() and self._starved_since is None:
            self._starved_since = time.monotonic() if now is None else now

    # ---- reporting and checkpoints ---------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        hist = self.stats.age_histogram
        total = sum(hist.values())
        mean_age = sum(a * c for a, c in hist.items()) / total if total else 0.0
        return {
            "buffer/fill": self.fill,
            "buffer/ready_groups": float(len(self.ready)),
            "buffer/in_flight_groups": float(len(self.in_flight)),
            "buffer/admission_wait_s": self.stats.admission_wait_s,
            "buffer/batch_wait_s": self.stats.batch_wait_s,
            "buffer/groups_dropped": float(self.stats.groups_dropped),
            "buffer/flat_groups_kept": float(self.stats.flat_groups_kept),
            "buffer/rollouts_failed": float(self.stats.rollouts_failed),
            "buffer/tokens_rejected": float(self.stats.tokens_rejected),
            "buffer/token_age_mean": mean_age,
            "buffer/token_age_max": float(max(hist) if hist else 0),
        }

    def state_dict(self) -> dict:
        """What a checkpoint needs: in-flight prompt ids (to regenerate) and ready groups."""
        return {
            "engine_version": self.engine_version,
            "rollouts_admitted": self.rollouts_admitted,
            "in_flight": list(self.in_flight.items()),
            "ready": {gid: g for gid, g in self.ready.items()},
            "age_histogram": dict(self.stats.age_histogram),
            "groups_dropped": self.stats.groups_dropped,
            "flat_groups_kept": self.stats.flat_groups_kept,
        }

    def load_state_dict(self, state: dict) -> None:
        self.engine_version = state["engine_version"]
        self.rollouts_admitted = state["rollouts_admitted"]
        self.in_flight = OrderedDict((int(g), int(p)) for g, p in state["in_flight"])
        self.ready = {int(g): v for g, v in state["ready"].items()}
        self.stats.age_histogram = Counter({int(k): v for k, v in state["age_histogram"].items()})
        self.stats.groups_dropped = int(state.get("groups_dropped", 0))
        self.stats.flat_groups_kept = int(state.get("flat_groups_kept", 0))

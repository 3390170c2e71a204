"""One round of held-out evaluation: the task's held-out prompts, generated greedily by the
engines and scored by the scorer pool, as the orchestrator's loop turns.

The orchestrator owns the loop; this owns the round's state. Held-out groups use negative group
ids (prompt *i* is group ``-(i + 1)``), so the same Generate/Generated/scorer path carries them
apart from training groups, and an engine restart can re-send one (:meth:`prompt`).
"""

from __future__ import annotations

import time

from tokenflow.metrics import trace
from tokenflow.rollout import CORRECT_REWARD


class HeldOutEval:
    def __init__(self, task, limit: int | None, params, send, scorer) -> None:
        """``send(group_id, prompt, kind, params)`` hands a prompt to an engine; ``scorer`` is
        the run's scorer pool (``submit`` and, through the orchestrator, ``poll``)."""
        self.task, self.limit, self.params = task, limit, params
        self._send, self._scorer = send, scorer
        self.prompts: list = []
        self.generated: dict[int, list] = {}  # group id -> rollouts, not yet submitted for scoring
        self.scored: dict[int, object] = {}  # group id -> scored group (None until it comes back)
        self._t0 = 0.0

    @staticmethod
    def is_heldout(group_id: int) -> bool:
        return group_id < 0

    def prompt(self, group_id: int):
        return self.task.eval_prompts()[-group_id - 1]

    def start(self) -> None:
        """Send every held-out prompt; the result is for the weights the engines hold while they
        generate it."""
        self.prompts = self.task.eval_prompts()[: self.limit]
        self.generated, self.scored = {}, {}
        self._t0 = time.time()
        for i, p in enumerate(self.prompts):
            gid = -(i + 1)
            self.scored[gid] = None
            self._send(gid, p, "eval", self.params)

    def on_generated(self, group_id: int, rollouts: list) -> None:
        self.generated[group_id] = rollouts

    def on_scored(self, group_id: int, group) -> bool:
        """Take a scored group if it belongs to this round (False: a training group)."""
        if group_id not in self.scored:
            return False
        self.scored[group_id] = group
        return True

    def done(self) -> bool:
        """Submit the groups that came back for scoring; True once every one is scored."""
        for gid, rollouts in self.generated.items():
            p = self.prompts[-gid - 1]
            self._scorer.submit(rollouts, p.text, p.example, group_id=gid, kind="eval")
        self.generated = {}
        return all(v is not None for v in self.scored.values())

    def finish(self) -> float:
        """The round's accuracy: the share of prompts whose greedy completion scored ≥ ``CORRECT_REWARD`` (a
        failed score counts as wrong)."""
        rewards = [g[0].reward if not g[0].failed else 0.0 for g in self.scored.values()]
        trace.record("orchestrator/eval", self._t0, time.time() - self._t0, n=len(self.prompts))
        self.scored = {}
        return sum(r >= CORRECT_REWARD for r in rewards) / max(1, len(rewards))

"""``samples.jsonl``: what the model wrote, decoded, a few samples per training step and every
held-out sample of each evaluation (``tokenflow samples RUN`` prints them).

One JSON object per sample::

    {"step": 3, "kind": "train", "group_id": 9, "prompt_id": 9, "sample_index": 0,
     "prompt": "347+85=", "completion": "7+5=12,...>432", "reward": 1.0, "components": {...},
     "failed": false, "error": null, "finish_reason": "stop", "tokens": 21,
     "versions": [1, 2], "token_age_mean": 0.4, "token_age_max": 1}

``step`` is the step a training sample trains (its batch is step's) or the step an evaluation
ran at (0: the starting model); ``versions`` the policy versions its tokens came from; a token's
age is the trainer's version minus the token's (generated tokens only), as in
``offpolicy/token_age_*``. The text is the engine's decoded completion; a rollout without one
(continued after a resume, or a multi-turn episode) is decoded here with the run's tokenizer,
which the orchestrator holds already. The rows are a handful per step and are written through
the run folder's link-safe helpers.
"""

from __future__ import annotations

import json
import logging

import numpy as np

from tokenflow.metrics.safe_files import open_text

log = logging.getLogger("tokenflow")

SHOW_ZERO_REWARD_STEPS = 3
"""In its first steps, a run whose every reward is 0 shows one completion (what the model
wrote is the first thing to look at: an answer in the wrong form scores 0 however right)."""


def pick(rollouts: list, k: int) -> list:
    """``k`` of a batch's rollouts, spread over its groups (the batch is groups one after another)."""
    if k <= 0 or not rollouts:
        return []
    stride = max(1, len(rollouts) // k)
    return rollouts[::stride][:k]


class SampleLog:
    """Appends rows to ``path``; ``tokenizer`` (the orchestrator's, or None) decodes a rollout
    that carries no text; ``per_step`` training samples per step (``run.samples_per_step``)."""

    def __init__(self, path, tokenizer, per_step: int) -> None:
        self.path, self.tokenizer, self.per_step = path, tokenizer, per_step

    def _completion(self, r) -> str:
        if r.text is not None or self.tokenizer is None:
            return r.text or ""
        return self.tokenizer.decode(r.completion_ids.tolist(), skip_special_tokens=True)

    def row(self, step: int, kind: str, prompt: str, r, trainer_version: int) -> dict:
        ages = trainer_version - r.versions[r.loss_mask > 0]  # generated tokens only
        return {
            "step": step, "kind": kind, "group_id": r.group_id, "prompt_id": r.prompt_id,
            "sample_index": r.sample_index, "prompt": prompt, "completion": self._completion(r),
            "reward": r.reward, "components": {k: v for k, v in r.rewards.items() if k != "reward"},
            "failed": r.failed, "error": r.info.get("score_error") or r.info.get("env_error"),
            "finish_reason": r.finish_reason, "tokens": int(len(r.completion_ids)),
            "versions": sorted({int(v) for v in np.unique(r.versions)}),
            "token_age_mean": float(ages.mean()) if len(ages) else 0.0,
            "token_age_max": int(ages.max()) if len(ages) else 0,
        }

    def _write(self, rows: list[dict]) -> None:
        if rows:
            with open_text(self.path, "a") as f:
                f.write("".join(json.dumps(row) + "\n" for row in rows))

    def train(self, step: int, batch: list[list], prompts: dict, trainer_version: int) -> None:
        """A few of the batch that trains ``step``; ``prompts``: group id → the task's Prompt."""
        rollouts = [r for g in batch for r in g]
        chosen = pick(rollouts, self.per_step)
        rows = [self.row(step, "train", getattr(prompts.get(r.group_id), "text", ""), r, trainer_version)
                for r in chosen]
        self._write(rows)
        if step <= SHOW_ZERO_REWARD_STEPS and rollouts and all(not r.reward for r in rollouts):
            shown = rows[0] if rows else self.row(step, "train", "", rollouts[0], trainer_version)
            log.info("every reward of step %d is 0; what the model wrote (tokenflow samples %s):\n  %s", step,
                     self.path.parent, one_line(shown["completion"]))

    def heldout(self, step: int, prompts: list, scored: dict) -> None:
        """Every sample of an evaluation round: ``scored`` maps group id ``-(i + 1)`` to the
        scored group of ``prompts[i]``."""
        rows = []
        for gid, group in sorted(scored.items(), reverse=True):
            for r in group or ():
                rows.append(self.row(step, "eval", prompts[-gid - 1].text, r, step))
        self._write(rows)


def one_line(text: str, limit: int = 300) -> str:
    """A completion on one line (newlines shown as ⏎), cut at ``limit`` characters."""
    flat = text.replace("\n", " ⏎ ").strip()
    return flat if len(flat) <= limit else flat[:limit] + " …"

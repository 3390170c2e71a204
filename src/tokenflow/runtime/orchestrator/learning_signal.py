"""Loud warnings when a run cannot learn, each naming the likely causes and the knobs.

Three conditions, each warned once per run, from the per-step metrics:

* **No reward variance**: for ``metrics.no_signal_warn_steps`` consecutive steps every group's
  samples got the same reward (``reward/zero_signal_group_frac`` = 1). Group-relative advantages
  are then all zero and the policy gets no gradient.
* **Every sample failed scoring** (``reward/failed_frac`` = 1) in a step: nothing is learned
  from it. Warned at once.
* **Entropy collapse**: the policy's mean per-token entropy stayed below
  ``ENTROPY_COLLAPSE_RATIO`` × its first step's value for ``no_signal_warn_steps`` steps; the
  samples of a group become near copies, so groups stop carrying signal.

The docs page "My run doesn't learn" (docs/howto/doesnt-learn.md) expands on each.
"""

from __future__ import annotations

import logging

log = logging.getLogger("tokenflow")

ENTROPY_COLLAPSE_RATIO = 0.1
"""Entropy below this fraction of its first step's value counts as collapsed."""


class SignalWatch:
    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.patience = cfg.metrics.no_signal_warn_steps
        self.flat_steps = 0
        self.low_entropy_steps = 0
        self.first_entropy: float | None = None
        self.warned: set[str] = set()

    def observe(self, step: int, metrics: dict) -> list[str]:
        """Check one step's metrics; log (and return) the warnings raised now."""
        if not self.patience:
            return []
        out = []
        failed = metrics.get("reward/failed_frac", 0.0)
        if failed >= 1.0:
            out.append(self._warn("failed", self._failed(step)))
        flat = metrics.get("reward/zero_signal_group_frac")
        self.flat_steps = self.flat_steps + 1 if flat is not None and flat >= 1.0 else 0
        if self.flat_steps >= self.patience:
            out.append(self._warn("flat", self._flat(metrics)))
        entropy = metrics.get("policy/entropy")
        # A step that trained no sequence (all skipped: every advantage was 0) measured no entropy.
        if entropy is not None and metrics.get("perf/sequences", 1.0) > 0:
            if self.first_entropy is None:
                self.first_entropy = entropy
            low = self.first_entropy > 0 and entropy < ENTROPY_COLLAPSE_RATIO * self.first_entropy
            self.low_entropy_steps = self.low_entropy_steps + 1 if low else 0
            if self.low_entropy_steps >= self.patience:
                out.append(self._warn("entropy", self._entropy(entropy)))
        return [w for w in out if w]

    def _warn(self, kind: str, text: str) -> str:
        if kind in self.warned:
            return ""
        self.warned.add(kind)
        log.warning(text)
        return text

    def _failed(self, step: int) -> str:
        rt = self.cfg.runtime
        return (f"THE RUN CANNOT LEARN: every sample of step {step} failed scoring (reward/failed_frac = 1). "
                f"The reward function {self.cfg.task.reward or self.cfg.task.name!r} raised, returned no number, "
                f"or ran past runtime.score_timeout_s = {rt.score_timeout_s:g} s. Call it by hand on one completion "
                "to see the error; raise runtime.score_timeout_s for a slow verifier. "
                "See docs/howto/doesnt-learn.md.")

    def _flat(self, metrics: dict) -> str:
        mean = metrics.get("reward/mean")
        where = "" if mean is None else f" (mean reward {mean:.3f})"
        return (f"THE RUN CANNOT LEARN: for {self.flat_steps} steps every group's samples got the same reward"
                f"{where}, so every advantage is 0 and nothing is learned. If all rewards are 0 the task is too "
                "hard or the reward too strict for this model: give partial credit (a shaped reward, "
                "task.reward), or easier prompts. If all are the best reward, the task is solved or too easy. "
                f"Knobs: rollout.group_size (now {self.cfg.rollout.group_size}; more samples per prompt find a "
                f"different one more often), sampling.temperature (now {self.cfg.sampling.temperature:g}). "
                "See docs/howto/doesnt-learn.md.")

    def _entropy(self, entropy: float) -> str:
        return (f"THE RUN MAY STOP LEARNING: the policy's entropy collapsed to {entropy:.4f} nats per token "
                f"(first step: {self.first_entropy:.4f}) for {self.low_entropy_steps} steps; the samples of a "
                "group become near copies and stop carrying signal. Knobs: a lower trainer.lr (now "
                f"{self.cfg.trainer.lr:g}), a higher algorithm.clip_high (clip-higher, now "
                f"{self.cfg.algorithm.clip_high:g}), algorithm.entropy_coef (now {self.cfg.algorithm.entropy_coef:g}), "
                f"sampling.temperature (now {self.cfg.sampling.temperature:g}). If held-out accuracy is already "
                "high, the task may simply be solved. See docs/howto/doesnt-learn.md.")

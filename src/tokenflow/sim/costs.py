"""Rate model: how long each piece of work takes, in seconds.

* decode step of one engine with n running sequences: ``t(n) = a + b n``; every running
  sequence gains one token per step, so the engine emits ``n / t(n)`` tokens/s.
* prefill call: ``c0 + c * tokens`` (prompt tokens, once per group with prefix sharing; an
  aborted rollout re-prefills its partial completion too).
* optimizer step over ``tokens`` (prompt + completion): ``T = o + s * tokens / training_gpus``,
  or a measured constant.
* weight update: the trainer sends for ``S_t = bytes / bandwidth + messages * latency +
  overhead``; each engine then pauses ``S_e = bytes / swap bandwidth + overhead`` to swap.
* contention: a decode step while the trainer computes takes ``(1 + e) t(n)``; an optimizer step
  that starts while an engine decodes takes ``(1 + r) T``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenflow.config.sim import SimConfig


@dataclass(frozen=True)
class Costs:
    decode_base_s: float
    decode_per_seq_s: float
    prefill_s_per_token: float
    prefill_overhead_s: float
    train_s_per_token: float
    train_overhead_s: float
    train_step_s: float | None
    training_gpus: int
    sync_s: float
    """Trainer seconds per weight update (S_t)."""
    swap_s: float
    """Engine pause per weight swap (S_e)."""
    engine_slowdown: float
    trainer_slowdown: float

    @classmethod
    def from_config(cls, cfg: SimConfig) -> Costs:
        hw = cfg.hardware
        return cls(
            decode_base_s=hw.decode_step_base_s,
            decode_per_seq_s=hw.decode_step_per_seq_s,
            prefill_s_per_token=hw.prefill_s_per_token,
            prefill_overhead_s=hw.prefill_overhead_s,
            train_s_per_token=hw.train_s_per_token,
            train_overhead_s=hw.train_step_overhead_s,
            train_step_s=hw.train_step_s,
            training_gpus=hw.training_pool,
            sync_s=cfg.sync_send_s(),
            swap_s=cfg.swap_s(),
            engine_slowdown=hw.engine_slowdown_when_training,
            trainer_slowdown=hw.trainer_slowdown_when_generating,
        )

    def decode_step(self, running: int, trainer_busy: bool = False) -> float:
        """Seconds of one decode step with ``running`` sequences."""
        t = self.decode_base_s + self.decode_per_seq_s * running
        return t * (1.0 + self.engine_slowdown) if trainer_busy else t

    def decode_tokens_per_s(self, running: int) -> float:
        """Output tokens/s of one engine with ``running`` sequences (no contention)."""
        return running / self.decode_step(running)

    def prefill(self, tokens: int) -> float:
        """Seconds of one prefill call over ``tokens`` prompt (or resumed prefix) tokens."""
        return self.prefill_overhead_s + self.prefill_s_per_token * tokens

    def train_step(self, tokens: int, engines_busy: bool = False) -> float:
        """Seconds of one optimizer step over ``tokens`` tokens (prompt + completion)."""
        if self.train_step_s is not None:
            t = self.train_step_s
        else:
            t = self.train_overhead_s + self.train_s_per_token * tokens / self.training_gpus
        return t * (1.0 + self.trainer_slowdown) if engines_busy else t

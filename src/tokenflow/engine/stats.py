"""`EngineStats`: counters the engine keeps about its own work."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class EngineStats:
    tokens_generated: int = 0
    """Tokens sampled (one per sequence per step, the first one from the prefill included)."""
    prefill_tokens: int = 0
    """Prompt tokens prefilled (a shared prefill counts once for its n samples)."""
    prefill_steps: int = 0
    decode_steps: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    last_step_seconds: float = 0.0
    last_step_kind: str = ""
    last_step_num_seqs: int = 0
    weight_swaps: int = 0
    last_weight_swap_seconds: float = 0.0

    @property
    def mean_decode_step_seconds(self) -> float:
        return self.decode_seconds / self.decode_steps if self.decode_steps else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "mean_decode_step_seconds": self.mean_decode_step_seconds}

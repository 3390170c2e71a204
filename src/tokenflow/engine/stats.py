"""`EngineStats`: counters the engine keeps about its own work."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class EngineStats:
    tokens_generated: int = 0
    """Tokens sampled (one per sequence per step, the first one from the prefill included)."""
    prefill_tokens: int = 0
    """Tokens forwarded by prefills (a shared prefill counts once for its n samples; a
    continuation served from parked KV counts only its new tokens)."""
    reused_prefix_tokens: int = 0
    """Tokens of continuations served from parked KV instead of being prefilled again."""
    parked_hits: int = 0
    """Continuations admitted whose prefix KV was parked here."""
    parked_misses: int = 0
    """Continuations admitted with no usable parked KV (prefilled whole)."""
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

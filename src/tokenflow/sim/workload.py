"""Length distributions of prompts and completions.

A lognormal is fixed by its median m and 90th percentile p: ``mu = ln m`` and
``sigma = ln(p / m) / z_0.9`` with ``z_0.9 = 1.2816`` the standard normal 90th percentile, so
``P(L <= p) = 0.9``. p = m gives fixed lengths. An empirical list is resampled uniformly with
replacement, or replayed in order (``empirical_order = "replay"``). Every draw is rounded to whole tokens, at least 1 and at most ``max_tokens``.
"""

from __future__ import annotations

import math

import numpy as np

from tokenflow.config.sim import WorkloadConfig

Z90 = 1.2815515655446004  # standard normal quantile at 0.9


def lognormal_params(median: float, p90: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this median and 90th percentile (tokens)."""
    return math.log(median), math.log(p90 / median) / Z90


class LengthSampler:
    """Draws completion and prompt lengths (tokens) for whole prompt groups."""

    def __init__(self, workload: WorkloadConfig, seed: int) -> None:
        self.w = workload
        self.rng = np.random.default_rng(seed)
        self.mu, self.sigma = lognormal_params(workload.completion_median, workload.completion_p90)
        self._completions = (np.asarray(workload.completion_lengths, dtype=np.int64)
                             if workload.completion_lengths else None)
        self._prompts = (np.asarray(workload.prompt_lengths, dtype=np.int64)
                         if workload.prompt_lengths else None)
        self._replay = workload.empirical_order == "replay"
        self._next_completion = 0
        self._next_prompt = 0

    def _take(self, values: np.ndarray, n: int, which: str) -> np.ndarray:
        """The next ``n`` values of ``values`` in order, cycling."""
        start = getattr(self, which)
        setattr(self, which, start + n)
        return values[np.arange(start, start + n) % len(values)]

    def completions(self, n: int) -> list[int]:
        """``n`` completion lengths in tokens."""
        if self._completions is not None and self._replay:
            draws = self._take(self._completions, n, "_next_completion")
        elif self._completions is not None:
            draws = self.rng.choice(self._completions, size=n)
        elif self.sigma == 0.0:
            draws = np.full(n, self.w.completion_median)
        else:
            draws = self.rng.lognormal(self.mu, self.sigma, size=n)
        return np.clip(np.rint(draws), 1, self.w.max_tokens).astype(np.int64).tolist()

    def prompt(self) -> int:
        """One prompt length in tokens."""
        if self._prompts is not None and self._replay:
            return int(self._take(self._prompts, 1, "_next_prompt")[0])
        if self._prompts is not None:
            return int(self.rng.choice(self._prompts))
        return self.w.prompt_length

    def mean_completion(self, samples: int = 200_000) -> float:
        """Mean completion length in tokens, after the cap (estimated by sampling)."""
        if self._completions is not None:
            return float(np.mean(np.clip(self._completions, 1, self.w.max_tokens)))
        rng_state = self.rng.bit_generator.state
        try:
            return float(np.mean(self.completions(samples)))
        finally:
            self.rng.bit_generator.state = rng_state

"""Running sums, minima and maxima of one optimizer step's statistics across micro-batches.

Micro-batch code adds raw sums and counts; the trainer turns them into means once the step is
done, so a mean over tokens is exact however the tokens were split into micro-batches.
"""

from __future__ import annotations

import math
from collections import defaultdict


class Accumulator:
    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.mins: dict[str, float] = {}
        self.maxs: dict[str, float] = {}

    def add(self, name: str, value: float) -> None:
        self.sums[name] += float(value)

    def lo(self, name: str, value: float) -> None:
        self.mins[name] = min(self.mins.get(name, math.inf), float(value))

    def hi(self, name: str, value: float) -> None:
        self.maxs[name] = max(self.maxs.get(name, -math.inf), float(value))

    def get(self, name: str, default: float = 0.0) -> float:
        return self.sums.get(name, default)

    def ratio(self, num: str, den: str, default: float = 0.0) -> float:
        """sums[num] / sums[den], or ``default`` when the denominator is 0 (never NaN)."""
        d = self.sums.get(den, 0.0)
        return self.sums.get(num, 0.0) / d if d else default

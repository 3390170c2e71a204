"""Running sums, minima and maxima of one optimizer step's statistics across micro-batches.

Micro-batch code adds raw sums and counts; the trainer turns them into means once the step is
done, so a mean over tokens is exact however the tokens were split into micro-batches. Values may
be tensors: they stay on their device until read, so recording costs no device synchronisation
per micro-batch.
"""

from __future__ import annotations

import math

import torch

Number = float | int | torch.Tensor


def _detach(v: Number) -> Number:
    return v.detach() if isinstance(v, torch.Tensor) else float(v)


class Accumulator:
    def __init__(self) -> None:
        self._sums: dict[str, Number] = {}
        self._mins: dict[str, Number] = {}
        self._maxs: dict[str, Number] = {}

    def tables(self) -> dict[str, dict[str, Number]]:
        """Its whole state, by how each table combines (``sum``, ``min``, ``max``): the dicts
        themselves, for a reduction across ranks to rewrite in place (``trainer.fsdp``)."""
        return {"sum": self._sums, "min": self._mins, "max": self._maxs}

    def add(self, name: str, value: Number) -> None:
        self._sums[name] = self._sums.get(name, 0.0) + _detach(value)

    def lo(self, name: str, value: Number) -> None:
        v = _detach(value)
        self._mins[name] = v if name not in self._mins else _pairwise(min, torch.minimum, self._mins[name], v)

    def hi(self, name: str, value: Number) -> None:
        v = _detach(value)
        self._maxs[name] = v if name not in self._maxs else _pairwise(max, torch.maximum, self._maxs[name], v)

    def merge(self, other: "Accumulator") -> None:
        """Add ``other``'s sums and fold in its minima and maxima (one optimizer step's
        statistics into its batch's)."""
        for k, v in other._sums.items():
            self.add(k, v)
        for k, v in other._mins.items():
            self.lo(k, v)
        for k, v in other._maxs.items():
            self.hi(k, v)

    def __contains__(self, name: str) -> bool:
        return name in self._sums

    def get(self, name: str, default: float = 0.0) -> float:
        return float(self._sums[name]) if name in self._sums else default

    def min(self, name: str, default: float = math.inf) -> float:
        return float(self._mins[name]) if name in self._mins else default

    def max(self, name: str, default: float = -math.inf) -> float:
        return float(self._maxs[name]) if name in self._maxs else default

    def ratio(self, num: str, den: str, default: float = 0.0) -> float:
        """sums[num] / sums[den], or ``default`` when the denominator is 0 (never NaN)."""
        d = self.get(den)
        return self.get(num) / d if d else default


def _pairwise(py, tf, a: Number, b: Number) -> Number:
    """min/max of two floats with ``py``, or of tensors (or a mix) with ``tf`` on their device."""
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return py(a, b)
    dev = a.device if isinstance(a, torch.Tensor) else b.device
    return tf(torch.as_tensor(a, dtype=torch.float64, device=dev), torch.as_tensor(b, dtype=torch.float64, device=dev))

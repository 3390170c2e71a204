"""Which prompts of a prefill step run together: prompts of similar lengths, so that little of
each forward is padding.

A prefill runs its prompts right-padded to the longest, so every product and norm also runs on
the padding: the bench's 16 prompts of 16-63 tokens took 1,008 rows for 692 tokens. Sorted by
length and cut into a few runs, the same prompts take fewer rows, and each extra forward costs a
fixed amount (its Python and kernel launches, and products over fewer rows). The cut minimises
rows + ``FORWARD_ROWS`` per forward.
"""

from __future__ import annotations

import numpy as np

FORWARD_ROWS = 64
"""What one more forward costs, in padded rows. SmolLM2-135M in float32, two threads (AVX2), the
bench's 16 prompts: one forward 1.88 s, cut in 2 / 4 / 8 / 16 by length 1.34 / 1.24 / 1.33 /
1.67 s; 64 rows picks about four here."""


def length_buckets(lengths: list[int], forward_rows: int = FORWARD_ROWS) -> list[list[int]]:
    """Indices of ``lengths`` in runs of similar length (shortest first), each run padded to its
    longest, cut where ``sum(len(run) * longest(run)) + forward_rows * len(runs)`` is least."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    ordered = np.asarray(lengths)[order]
    n = len(order)
    if n < 2 or ordered[0] == ordered[-1]:  # nothing to cut: one forward, no padding to save
        return [order.tolist()] if n else []
    # best[j]: the least cost of the j shortest prompts; a run (i, j] costs (j - i) * ordered[j-1].
    best = np.zeros(n + 1)
    cut = np.zeros(n + 1, dtype=np.int64)
    starts = np.arange(n)
    for j in range(1, n + 1):
        costs = best[:j] + (j - starts[:j]) * ordered[j - 1] + forward_rows
        cut[j] = int(np.argmin(costs))
        best[j] = costs[cut[j]]
    runs = []
    j = n
    while j > 0:
        runs.append(order[cut[j]:j].tolist())
        j = int(cut[j])
    return runs[::-1]

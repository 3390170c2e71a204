"""The three scorer shapes, and how a reward function says which one it has.

* **per sample** — ``fn(prompt, completion, example) -> float | dict``: every reward function
  written so far, unchanged; the default when a function declares nothing.
* **per group** — ``fn(prompt, completions, example) -> list[float | dict]``: sees all n samples
  of one prompt at once (judges, pairwise or rank-based rewards, one batched model call). Mark it
  with :func:`group_scorer`. Its rewards are the outcome rewards, one per sample, in order.
* **per token** — returns one reward per completion token (teachers, process reward models, a
  user's :func:`token_scorer`). Token rewards enter the returns as r_t beside the outcome reward
  (``docs/algorithms.md``), so they need a token-level advantage (REINFORCE++ or GAE).

All three run off the main process under ``runtime.score_timeout_s`` per sample (a group call
gets n times that), and a scorer that raises or runs out of time fails its samples, not the run.
"""

from __future__ import annotations

from typing import Callable, Literal

import numpy as np

Shape = Literal["sample", "group", "token"]
_ATTR = "tokenflow_scorer_shape"


def group_scorer(fn: Callable) -> Callable:
    """Mark ``fn(prompt, completions, example) -> list`` as a per-group scorer."""
    setattr(fn, _ATTR, "group")
    return fn


def token_scorer(fn: Callable) -> Callable:
    """Mark ``fn(prompt, completions, example, completion_ids) -> list[array]`` as a per-token
    scorer: for each sample, one reward per completion token (batched over the group)."""
    setattr(fn, _ATTR, "token")
    return fn


def shape_of(fn: Callable) -> Shape:
    return getattr(fn, _ATTR, "sample")


def normalise_group(out, n: int) -> list:
    """A group scorer's return value as n per-sample rewards (checked, not trusted)."""
    if not isinstance(out, (list, tuple)) or len(out) != n:
        got = f"{len(out)} values" if isinstance(out, (list, tuple)) else type(out).__name__
        raise ValueError(f"a group scorer must return one reward per sample ({n}), got {got}")
    return list(out)


def normalise_token_rewards(out, lengths: list[int]) -> list[np.ndarray]:
    """A token scorer's return value as one float array per sample, one entry per token."""
    if not isinstance(out, (list, tuple)) or len(out) != len(lengths):
        raise ValueError(f"a token scorer must return one array per sample ({len(lengths)})")
    arrays = []
    for i, (a, n) in enumerate(zip(out, lengths)):
        a = np.asarray(a, dtype=np.float32).reshape(-1)
        if len(a) != n:
            raise ValueError(f"token scorer: sample {i} has {n} completion tokens but {len(a)} rewards")
        if not np.isfinite(a).all():
            raise ValueError(f"token scorer: sample {i} has non-finite rewards")
        arrays.append(a)
    return arrays

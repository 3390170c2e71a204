"""One rollout batch as PPO mini-batch updates: the plan, and what the steps report.

``trainer.mini_batches = M`` splits the batch's trained sequences, in order (groups stay
together as far as the split allows), into M parts; ``trainer.epochs = E`` passes over them E
times: M·E optimizer steps per batch. Each step's loss is normalised over its own part
(:class:`GlobalCounts` of that part, skipped zero-advantage sequences included), as verl,
OpenRLHF and TRL normalise a mini-batch. π_prox, the decoupled objective's anchor, is the policy
before the batch's first step, and V_old (GAE's value clip) is the value head's then; both are
fixed for the batch, so the clip binds from the second step on.

The policy version counts batches, not optimizer steps: one batch is one weight push, so
engines, token ages, staleness and the buffer are exactly as with one step per batch; the LR
schedule also steps once per batch. ``optim/steps`` counts the optimizer steps.

The no-grad passes that give π_prox and V_old are :mod:`tokenflow.trainer.passes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tokenflow.algorithms import GlobalCounts
from tokenflow.trainer.batch import TrainSequence


@dataclass
class MiniBatch:
    """One optimizer step's share of the batch."""

    counts: GlobalCounts
    """The normaliser of this step: loss tokens and sequences of the part, skipped ones included."""
    train: list[TrainSequence]
    """Sequences forwarded (after the zero-advantage skip)."""
    skipped: list[TrainSequence] = field(default_factory=list)


def split(train: list[TrainSequence], parts: int, global_counts: GlobalCounts | None) -> list[tuple[list[TrainSequence], GlobalCounts]]:
    """``train`` (sequences with loss tokens) as ``parts`` contiguous parts of near-equal size,
    each with its counts; empty parts are left out (one empty part when ``train`` is empty).
    ``global_counts`` (a data-parallel caller's counts over every rank) replaces the counts of a
    single part; it cannot be split, so it is refused with several."""
    if global_counts is not None:
        if parts > 1:
            raise ValueError("train_step(global_counts=...) with trainer.mini_batches > 1: counts summed "
                             "over ranks cannot be split into mini-batches; pass whole batches to every "
                             "rank (FSDPTrainer does) or use one mini-batch")
        return [(train, global_counts)]
    chunks = [c for c in np.array_split(np.arange(len(train)), parts) if len(c)] or [np.arange(0)]
    out = []
    for chunk in chunks:
        seqs = [train[i] for i in chunk]
        out.append((seqs, GlobalCounts(sum(s.num_loss_tokens for s in seqs), len(seqs))))
    return out


class StepLog:
    """The batch's optimizer steps: gradient norms, skipped steps, how many."""

    def __init__(self) -> None:
        self.norms: list[float] = []
        self.skipped = 0
        self.lr = 0.0

    def add(self, norm: float, lr: float, skipped: bool) -> None:
        self.norms.append(norm)
        self.skipped += int(skipped)
        self.lr = lr

    @property
    def steps(self) -> int:
        return len(self.norms)

    def metrics(self) -> dict[str, float]:
        """``optim/grad_norm``: mean pre-clip norm over the batch's steps (finite ones; the one
        step's with a single step), ``optim/grad_norm_max``, ``optim/skipped`` (steps with a
        non-finite gradient, left out), ``optim/steps``."""
        finite = [n for n in self.norms if np.isfinite(n)]
        if len(self.norms) == 1:
            mean = self.norms[0]
        else:
            mean = float(np.mean(finite)) if finite else float("nan")
        return {"optim/grad_norm": mean, "optim/grad_norm_max": max(finite, default=mean),
                "optim/lr": self.lr, "optim/skipped": float(self.skipped), "optim/steps": float(self.steps)}

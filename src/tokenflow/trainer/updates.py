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

**No-grad passes** (:class:`NoGradPasses`): π_prox and V_old before a batch's updates, the
reference's log-probs for a KL in the reward, and log-probs on request. A no-grad pass scores
with the policy in eval mode: dropout and router jitter (a stochastic forward,
``Trainer.stochastic``) are off there, so π_prox is the deterministic policy the engines sample
from, the behaviour weight π_prox/μ compares like with like, and two passes over the same weights
agree. The training forward stays in train mode.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from tokenflow.algorithms import GlobalCounts
from tokenflow.metrics.trace import span
from tokenflow.rollout import Rollout
from tokenflow.trainer.batch import TrainSequence, to_train_sequence


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


@contextmanager
def eval_mode(model: torch.nn.Module):
    """``model`` in eval mode for the block, then back to the mode it was in."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


class NoGradPasses:
    """Mixed into :class:`tokenflow.trainer.Trainer` (it supplies the runners, routing replay,
    micro-batching and config)."""

    def _no_grad_pass(self, seqs: list[TrainSequence], n: int, *, want_prox: bool):
        """(π_prox log-probs if ``want_prox``, V_old with a value head), per rollout, from the
        weights before the batch's first optimizer step; (None, None) when neither is wanted."""
        if not want_prox and self.value_head is None:
            return None, None
        with span("trainer/prox_logprobs", seqs=len(seqs)):
            logps, values = self._score(seqs, n, with_values=self.value_head is not None)
        return (logps if want_prox else None), values

    def _kl_rewards(self, live: list[Rollout], seqs: list[TrainSequence]):
        """``algorithm.kl_in_reward``: −kl_coef·(log μ − log π_ref) per generated token of each
        live rollout (μ as the loss sees it: truncated under the Keep Sampling Mask), from a
        no-grad pass of the reference; and the mean KL over those tokens as a metric."""
        alg = self.algorithm
        if not alg.kl_in_reward:
            return None, {}
        with span("trainer/ref_logprobs", seqs=len(seqs)):
            ref, _ = self._score(seqs, len(live), with_values=False, runner=self.ref_runner)
        rewards = [np.zeros(r.num_tokens, dtype=np.float64) for r in live]
        total, count = 0.0, 0
        for s in seqs:
            kl = (s.behaviour.astype(np.float64) - ref[s.index]) * s.loss_mask
            rewards[s.index] = -alg.kl_coef * kl
            total, count = total + float(kl.sum()), count + int(s.loss_mask.sum())
        return rewards, {"kl/reward_kl_mean": total / max(count, 1)}

    @torch.no_grad()
    def _score(self, seqs: list[TrainSequence], n: int, with_values: bool, runner=None):
        """Per-rollout log-probs (and values) without a gradient, from ``runner`` (the policy's
        unless given, e.g. the reference's), with the policy in eval mode."""
        runner = runner or self.runner
        logps = [np.zeros(0, dtype=np.float32)] * n
        values = [np.zeros(0, dtype=np.float32)] * n if with_values else None
        with eval_mode(self.model):
            for mb in self._micro_batches(seqs):
                with self.routing.replaying(mb.routing, mb.routing_has) if runner is self.runner else nullcontext():
                    lp, _, hidden = runner.logprobs(mb, self._keep_mask(mb, runner.vocab_size),
                                                    chunk=self.config.logprob_chunk_tokens, with_entropy=False,
                                                    want_hidden=with_values)
                self.routing.take_counts()  # counted once, in the step's own forward
                v = self.value_head(hidden) if with_values else None
                bounds = np.cumsum([0] + [len(s.targets) for s in mb.seqs])
                for k, s in enumerate(mb.seqs):
                    logps[s.index] = lp[bounds[k]:bounds[k + 1]].float().cpu().numpy()
                    if v is not None:
                        values[s.index] = v[bounds[k]:bounds[k + 1]].float().cpu().numpy()
        return logps, values

    def logprobs(self, rollouts: list[Rollout]) -> list[np.ndarray]:
        """Per-token log-probs of each rollout's completion under the current weights, exactly as
        the loss sees them (temperature, Keep Sampling Mask, packing), in eval mode. No
        gradient, no update."""
        seqs = [to_train_sequence(i, r, self.version, keep_sampling_mask=self.algorithm.keep_sampling_mask,
                                  max_token_age=None) for i, r in enumerate(rollouts)]
        logps, _ = self._score([s for s in seqs if len(s.targets)], len(rollouts), with_values=False)
        return logps

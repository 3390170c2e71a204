"""No-grad passes: π_prox and V_old before a batch's updates, the reference's log-probs for a KL
in the reward, and log-probs on request (``Trainer.logprobs``).

A no-grad pass scores with the policy in eval mode: dropout and router jitter (a stochastic
forward, ``Trainer.stochastic``) are off there, so π_prox is the deterministic policy the engines
sample from, the behaviour weight π_prox/μ compares like with like, and two passes over the same
weights agree. The training forward stays in train mode (:mod:`tokenflow.trainer.stepping`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager, nullcontext

import numpy as np
import torch

from tokenflow.config.algorithm import AlgorithmConfig
from tokenflow.metrics.trace import span
from tokenflow.rollout import Rollout
from tokenflow.trainer.batch import MicroBatch, TrainSequence, to_train_sequence
from tokenflow.trainer.keep_routing import RoutingReplay
from tokenflow.trainer.logprobs import SupportMask
from tokenflow.trainer.model.runner import CausalLMRunner
from tokenflow.trainer.model.value_head import ValueHead


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
    """The trainer's no-grad passes over the policy (and the reference); what they run on is
    given here, the policy version at each call."""

    def __init__(self, *, algorithm: AlgorithmConfig, model: torch.nn.Module, runner: CausalLMRunner,
                 ref_runner, value_head: ValueHead | None, routing: RoutingReplay,
                 batcher: Callable[[list[TrainSequence]], list[MicroBatch]], chunk: int) -> None:
        self.algorithm, self.model, self.runner, self.ref_runner = algorithm, model, runner, ref_runner
        self.value_head, self.routing, self.batcher, self.chunk = value_head, routing, batcher, chunk

    def prox_and_values(self, seqs: list[TrainSequence], n: int, *, want_prox: bool):
        """(π_prox log-probs if ``want_prox``, V_old with a value head), per rollout, from the
        weights before the batch's first optimizer step; (None, None) when neither is wanted."""
        if not want_prox and self.value_head is None:
            return None, None
        with span("trainer/prox_logprobs", seqs=len(seqs)):
            logps, values = self.score(seqs, n, with_values=self.value_head is not None)
        return (logps if want_prox else None), values

    def kl_rewards(self, live: list[Rollout], seqs: list[TrainSequence]):
        """``algorithm.kl_in_reward``: −kl_coef·(log μ − log π_ref) per generated token of each
        live rollout (μ as the loss sees it: truncated under the Keep Sampling Mask), from a
        no-grad pass of the reference; and the mean KL over those tokens as a metric."""
        alg = self.algorithm
        if not alg.kl_in_reward:
            return None, {}
        with span("trainer/ref_logprobs", seqs=len(seqs)):
            ref, _ = self.score(seqs, len(live), with_values=False, runner=self.ref_runner)
        rewards = [np.zeros(r.num_tokens, dtype=np.float64) for r in live]
        total, count = 0.0, 0
        for s in seqs:
            kl = (s.behaviour.astype(np.float64) - ref[s.index]) * s.loss_mask
            rewards[s.index] = -alg.kl_coef * kl
            total, count = total + float(kl.sum()), count + int(s.loss_mask.sum())
        return rewards, {"kl/reward_kl_mean": total / max(count, 1)}

    @torch.no_grad()
    def score(self, seqs: list[TrainSequence], n: int, with_values: bool, runner=None):
        """Per-rollout log-probs (and values) without a gradient, from ``runner`` (the policy's
        unless given, e.g. the reference's), with the policy in eval mode."""
        runner = runner or self.runner
        logps = [np.zeros(0, dtype=np.float32)] * n
        values = [np.zeros(0, dtype=np.float32)] * n if with_values else None
        with eval_mode(self.model):
            for mb in self.batcher(seqs):
                with self.routing.replaying(mb.routing, mb.routing_has) if runner is self.runner else nullcontext():
                    lp, _, hidden = runner.logprobs(mb, SupportMask.for_batch(mb, runner.vocab_size),
                                                    chunk=self.chunk, with_entropy=False, want_hidden=with_values)
                self.routing.take_counts()  # counted once, in the step's own forward
                v = self.value_head(hidden) if with_values else None
                bounds = np.cumsum([0] + [len(s.targets) for s in mb.seqs])
                for k, s in enumerate(mb.seqs):
                    logps[s.index] = lp[bounds[k]:bounds[k + 1]].float().cpu().numpy()
                    if v is not None:
                        values[s.index] = v[bounds[k]:bounds[k + 1]].float().cpu().numpy()
        return logps, values

    def logprobs(self, rollouts: list[Rollout], version: int) -> list[np.ndarray]:
        """Per-token log-probs of each rollout's completion under the current weights (policy
        ``version``), exactly as the loss sees them (temperature, Keep Sampling Mask, packing),
        in eval mode. No gradient, no update."""
        seqs = [to_train_sequence(i, r, version, keep_sampling_mask=self.algorithm.keep_sampling_mask,
                                  max_token_age=None) for i, r in enumerate(rollouts)]
        logps, _ = self.score([s for s in seqs if len(s.targets)], len(rollouts), with_values=False)
        return logps

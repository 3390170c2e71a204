"""One optimizer step's work: forward, loss and backward of each micro-batch, then the step.

``Stepper.accumulate`` runs a micro-batch (under the routing replay of Keep Routing), adds its
loss terms' statistics to the step's accumulator and its gradient to the parameters;
``Stepper.optimizer_step`` clips the gradient norm and steps AdamW. The loss of a micro-batch is
normalised over its whole mini-batch (``GlobalCounts``), so accumulating gives the mini-batch's
gradient exactly. A sharded trainer's stepper (``tokenflow.trainer.fsdp``) runs padding
micro-batches and reduces norms and statistics across ranks.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from tokenflow.algorithms import GlobalCounts, TokenInputs, micro_batch_loss, token_weights
from tokenflow.algorithms.advantages import AdvantageResult
from tokenflow.algorithms.stats import Accumulator
from tokenflow.config.algorithm import AlgorithmConfig
from tokenflow.config.trainer import TrainerConfig
from tokenflow.metrics.trace import span
from tokenflow.trainer.batch import MicroBatch
from tokenflow.trainer.keep_routing import RoutingReplay
from tokenflow.trainer.logprobs import SupportMask
from tokenflow.trainer.model.runner import CausalLMRunner
from tokenflow.trainer.model.value_head import ValueHead

log = logging.getLogger(__name__)


def store_per_seq(per_seq: list[np.ndarray], mb: MicroBatch, values: torch.Tensor) -> None:
    """Write a micro-batch's flat per-target ``values`` back per rollout (``per_token``'s inverse)."""
    bounds = np.cumsum([0] + [len(s.targets) for s in mb.seqs])
    flat = values.float().cpu().numpy()
    for k, s in enumerate(mb.seqs):
        per_seq[s.index] = flat[bounds[k]:bounds[k + 1]]


class Stepper:
    """Forward/backward of micro-batches and the optimizer step, over what it is given."""

    def __init__(self, *, config: TrainerConfig, algorithm: AlgorithmConfig, device: torch.device,
                 runner: CausalLMRunner, ref_runner, value_head: ValueHead | None, routing: RoutingReplay,
                 optimizer: torch.optim.Optimizer) -> None:
        self.config, self.algorithm, self.device = config, algorithm, device
        self.runner, self.ref_runner, self.value_head = runner, ref_runner, value_head
        self.routing, self.optimizer = routing, optimizer

    def accumulate(self, mb: MicroBatch, adv: AdvantageResult, prox, old_values, counts: GlobalCounts,
                   acc: Accumulator, *, version: int, fill_prox: bool = False, at_start: bool = True,
                   record: bool = True) -> None:
        """Forward, loss and backward of one micro-batch, the policy at ``version``. ``fill_prox``:
        this forward is at π_prox's weights and gives π_prox for its tokens (stored in ``prox``
        for later steps when it is a list); ``at_start``: the weights are the batch's starting
        ones (first optimizer step); ``record``: count this token's once-per-batch statistics
        (the first epoch)."""
        # The replay spans the backward too: activation checkpointing re-runs the routers there.
        with self.routing.replaying(mb.routing, mb.routing_has):
            self.forward_backward(mb, adv, prox, old_values, counts, acc, version=version,
                                  fill_prox=fill_prox, at_start=at_start, record=record)
        if mb.routing is not None:
            differ, compared = self.routing.take_counts()
            acc.add("sum/route_differ", differ)
            acc.add("n/route_compared", compared)
            if self.config.routing_probe and self.algorithm.behaviour_logprobs and at_start:
                self._probe_routing(mb, acc, version)

    def _probe_routing(self, mb: MicroBatch, acc: Accumulator, version: int) -> None:
        """The on-policy mismatch had the trainer routed the other way (``trainer.routing_probe``)."""
        same = mb.made_under(version)
        if bool(same.any()):
            logp = self.routing.score_other_way(
                mb, lambda: self.runner.logprobs(mb, SupportMask.for_batch(mb, self.runner.vocab_size),
                                                 chunk=self.config.logprob_chunk_tokens, with_entropy=False)[0])
            other = "unreplayed" if self.routing.replay else "replayed"
            acc.add(f"sum/mismatch_abs_{other}", (logp - mb.behaviour)[same].abs().sum())

    def forward_backward(self, mb: MicroBatch, adv: AdvantageResult, prox, old_values, counts: GlobalCounts,
                         acc: Accumulator, *, version: int, fill_prox: bool, at_start: bool, record: bool) -> None:
        alg = self.algorithm
        with span("trainer/forward", tokens=mb.num_tokens, seqs=mb.num_seqs):
            chunk = self.config.logprob_chunk_tokens
            keep = SupportMask.for_batch(mb, self.runner.vocab_size)
            logp, entropy, hidden = self.runner.logprobs(mb, keep, chunk=chunk, entropy_grad=alg.entropy_coef > 0,
                                                         want_hidden=self.value_head is not None)
            ref = None
            if self.ref_runner is not None and not alg.kl_in_reward:
                with torch.no_grad():
                    ref, _, _ = self.ref_runner.logprobs(mb, keep, chunk=chunk, with_entropy=False)
            seq_tokens = torch.tensor([s.num_loss_tokens for s in mb.seqs], device=self.device)
            weights = token_weights(alg.aggregation, mb.mask, mb.seq_index, seq_tokens, counts,
                                    alg.max_completion_tokens)
            if fill_prox:
                prox_t = logp.detach()  # forwarded with π_prox's weights (deterministic forward)
                if prox is not None:
                    store_per_seq(prox, mb, prox_t)
            else:
                prox_t = mb.per_token(prox) if prox is not None else None
            inputs = TokenInputs(
                logprobs=logp, behaviour=mb.behaviour, advantages=mb.per_token(adv.advantages),
                mask=mb.mask, weights=weights, seq_index=mb.seq_index, num_seqs=mb.num_seqs,
                prox=prox_t, entropy=entropy, ref_logprobs=ref,
                values=self.value_head(hidden) if self.value_head is not None else None,
                old_values=mb.per_token(old_values) if old_values is not None else None,
                returns=mb.per_token(adv.returns) if adv.returns is not None else None,
            )
            terms = micro_batch_loss(alg, inputs, acc)
            # The engine-vs-trainer mismatch needs the batch's starting weights: π_prox where it
            # is known, else this forward when it ran with them; each token once.
            start_logp = prox_t if prox_t is not None else (logp.detach() if at_start else None)
            if alg.behaviour_logprobs and record and start_logp is not None:
                record_mismatch(mb, start_logp, acc, version)
        with span("trainer/backward", tokens=mb.num_tokens):
            terms.total.backward()

    def zero_grads(self) -> None:
        """A zero gradient on every parameter without one (AdamW still steps)."""
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)

    def optimizer_step(self, acc: Accumulator | None = None) -> tuple[float, float, bool]:
        """Clip and step; (pre-clip gradient norm, learning rate, skipped: the norm was not
        finite). ``acc``: this step's statistics, which a sharded stepper sums over ranks."""
        with span("trainer/optimizer"):
            params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
            max_norm = self.config.grad_clip if self.config.grad_clip is not None else float("inf")
            norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
            lr = float(self.optimizer.param_groups[0]["lr"])
            skipped = not np.isfinite(norm)
            if skipped:
                log.warning("train_step: non-finite gradient norm (%s); parameters left unchanged", norm)
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return norm, lr, skipped


def record_mismatch(mb: MicroBatch, logp: torch.Tensor, acc: Accumulator, version: int) -> None:
    """Engine vs trainer on the same weights: loss tokens made, with all before them in their
    sequence, under the trainer's version (`MicroBatch.made_under`)."""
    same = mb.made_under(version)
    if not bool(same.any()):
        return
    d = (logp - mb.behaviour)[same]
    acc.add("n/onpolicy", same.sum())
    acc.add("sum/mismatch_abs", d.abs().sum())
    acc.add("sum/mismatch_ratio", torch.exp(d).sum())

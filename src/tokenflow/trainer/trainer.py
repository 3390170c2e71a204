"""The single-process trainer: a rollout batch in, its optimizer steps out, policy version + 1.

One ``train_step``::

    rollouts ─ drop failed ─► TrainSequences ─► [no-grad pass: π_prox, V_old] ─► advantages
        ─► split into mini-batches (trainer.mini_batches; 1 by default)
        ─► epochs × per mini-batch: pack into micro-batches ─► per micro-batch: forward → loss
           → backward (accumulate) ─► clip grad norm ─► AdamW step
        ─► LR schedule step ─► version += 1

Every loss term is normalised over its mini-batch before any backward (:class:`GlobalCounts`),
so accumulating over micro-batches gives exactly the mini-batch's gradient. A data-parallel
trainer passes counts summed over ranks as ``global_counts``; the per-rank losses then *sum* to
the global loss (reduce gradients with a sum, not a mean). Mini-batches, π_prox and versions:
:mod:`tokenflow.trainer.updates`.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from tokenflow.algorithms import (
    AlgorithmConfig,
    GlobalCounts,
    TokenInputs,
    compute_advantages,
    micro_batch_loss,
    token_weights,
)
from tokenflow.algorithms.advantages import AdvantageResult
from tokenflow.algorithms.stats import Accumulator
from tokenflow.metrics.trace import span
from tokenflow.rollout import Rollout
from tokenflow.trainer.batch import MicroBatch, TrainSequence, micro_batches, to_train_sequence
from tokenflow.trainer.config import TrainerConfig, check_compatible
from tokenflow.trainer.keep_routing import RoutingReplay
from tokenflow.trainer.logprobs import SupportMask
from tokenflow.trainer.metrics import age_stats, step_metrics
from tokenflow.trainer.model import (
    CausalLMRunner,
    enable_checkpointing,
    frozen_copy,
    keep_freed_memory,
    load_causal_lm,
    stochastic_parts,
    use_fp32_lm_head,
)
from tokenflow.trainer.policy_weights import PolicyWeights
from tokenflow.trainer.schedule import build_scheduler
from tokenflow.trainer.updates import MiniBatch, NoGradPasses, StepLog, split
from tokenflow.trainer.value_head import ValueHead

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError('trainer.device = "cuda" but no CUDA device is visible; use "cpu" or "auto"')
    return torch.device(name)


def store_per_seq(per_seq: list[np.ndarray], mb: MicroBatch, values: torch.Tensor) -> None:
    """Write a micro-batch's flat per-target ``values`` back per rollout (``per_token``'s inverse)."""
    bounds = np.cumsum([0] + [len(s.targets) for s in mb.seqs])
    flat = values.float().cpu().numpy()
    for k, s in enumerate(mb.seqs):
        per_seq[s.index] = flat[bounds[k]:bounds[k + 1]]


class Trainer(NoGradPasses, PolicyWeights):
    """Owns the policy (trained in place), optional value head and reference, AdamW and the LR
    schedule. ``version`` counts rollout batches trained (policy versions, one weight push
    each), starting from ``version``; a batch is ``mini_batches × epochs`` optimizer steps."""

    def __init__(self, model, config: TrainerConfig, algorithm: AlgorithmConfig, *,
                 version: int = 0, tokenizer=None) -> None:
        check_compatible(config, algorithm)
        self.config, self.algorithm, self.version, self.tokenizer = config, algorithm, version, tokenizer
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        torch.manual_seed(config.seed)
        self.device = resolve_device(config.device)
        if self.device.type == "cpu" and config.keep_host_memory:
            keep_freed_memory()
        load = dict(trust_remote_code=config.trust_remote_code,
                    attn_implementation=config.attn_implementation, device=self.device)
        self.model = load_causal_lm(model, **load)
        self.is_lora = config.lora_rank is not None
        self.reference = None
        # With LoRA the base model *is* the reference: the policy with its adapters switched off
        # serves it, and no second copy is held.
        if algorithm.kl_coef > 0 and not (self.is_lora and algorithm.reference_model is None):
            ref = algorithm.reference_model
            self.reference = frozen_copy(self.model if ref is None else load_causal_lm(ref, **load))
        for m in filter(None, [self.model, self.reference] if config.fp32_lm_head else []):
            use_fp32_lm_head(m)
        if config.gradient_checkpointing:
            enable_checkpointing(self.model)
        if self.is_lora:
            from tokenflow.trainer.lora import add_lora

            self.model = add_lora(self.model, config)
        self.model.train()
        self.stochastic = stochastic_parts(self.model)
        """What makes the train-mode forward random (dropout, router jitter); empty if nothing."""
        if self.stochastic:
            log.info("the policy's forward is stochastic (%s): π_prox comes from a no-grad pass in eval mode",
                     ", ".join(self.stochastic))
        self._step_acc = None
        # After the reference copy: hooks would be copied along, and the reference routes itself.
        self.routing = RoutingReplay(self.model, replay=config.keep_routing)
        if config.keep_routing and not self.routing:
            raise ValueError("trainer.keep_routing = true but the policy has no mixture-of-experts routers; "
                             "set it to false for a dense model")
        self.value_head = None
        if config.value_head:
            hidden = self.model.get_output_embeddings().in_features
            self.value_head = ValueHead(hidden).to(self.device)
        self.runner = CausalLMRunner(self.model, self.device, config.dtype)
        self.ref_runner = CausalLMRunner(self.reference, self.device, config.dtype) if self.reference else None
        if self.is_lora and algorithm.kl_coef > 0 and self.reference is None:
            from tokenflow.trainer.lora import BaseModelRunner

            self.ref_runner = BaseModelRunner(self.runner)
        self.optimizer = torch.optim.AdamW(self._param_groups(), lr=config.lr, betas=config.betas,
                                           eps=config.adam_eps)
        self.scheduler = build_scheduler(self.optimizer, config)

    def _param_groups(self) -> list[dict]:
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": self.config.weight_decay},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
        if self.value_head is not None:
            lr = self.config.value_lr if self.config.value_lr is not None else self.config.lr
            groups.append({"params": list(self.value_head.parameters()), "lr": lr, "weight_decay": 0.0})
        return [g for g in groups if g["params"]]

    # ----------------------------------------------------------------------------- one batch

    def train_step(self, rollouts: list[Rollout], *, global_counts: GlobalCounts | None = None) -> dict[str, float]:
        """One rollout batch: ``trainer.mini_batches × trainer.epochs`` optimizer steps over
        exactly ``rollouts`` (one by default), then ``version += 1``; returns the batch's metrics.

        Failed rollouts are dropped first (their groups become ragged). ``global_counts``
        replaces the locally counted loss tokens and sequences in the aggregation normaliser; a
        data-parallel caller passes the counts summed over ranks, and then ``loss/*`` are this
        rank's shares of the global loss (one mini-batch only).
        """
        start = time.perf_counter()
        alg, c = self.algorithm, self.config
        live = [r for r in rollouts if not r.failed]
        seqs = self._sequences(live)
        multi = c.mini_batches * c.epochs > 1
        # π_prox, the policy before the batch's first step: from a no-grad pass, except where a
        # forward at those weights gives it exactly (``prox_from_forward``): the first step's
        # forward for its part (and the only step's for all of it).
        fill = alg.needs_prox_pass and self.prox_from_forward
        # GAE needs V_old before the advantages; otherwise π_prox is needed only for the
        # sequences that are trained, which are known once the advantages are.
        values_first = self.value_head is not None
        prox, old_values = None, None
        if values_first:
            prox, old_values = self._no_grad_pass(seqs, len(live), want_prox=alg.needs_prox_pass and (multi or not fill))
        kl_rewards, kl_metrics = self._kl_rewards(live, seqs)
        adv = compute_advantages(live, alg, old_values, kl_rewards)
        train = [s for s in seqs if s.num_loss_tokens > 0]
        # Each normaliser counts every sequence of its part with loss tokens, skipped or not:
        # that keeps each trained token's weight, hence the gradient, what it would be without
        # the skip.
        minis = [MiniBatch(counts, *self._skip_inert(part, adv)) for part, counts in
                 split(train, c.mini_batches, global_counts)]
        if prox is None and alg.needs_prox_pass and (multi or not fill):
            later = [s for m in (minis[1:] if fill else minis) for s in m.train]
            prox = (self._no_grad_pass(later, len(live), want_prox=True)[0] if later
                    else [np.zeros(0, dtype=np.float32)] * len(live))
        acc, log_ = Accumulator(), StepLog()
        forwarded = n_micro = 0
        for epoch in range(c.epochs):
            for k, mini in enumerate(minis):
                step_acc = Accumulator()
                batches = self._micro_batches(mini.train)
                first = epoch == 0 and k == 0
                for mb in batches:
                    self._accumulate(mb, adv, prox, old_values, mini.counts, step_acc,
                                     fill_prox=first and fill, at_start=first, record=epoch == 0)
                if mini.skipped and not batches:
                    self._zero_grads()  # as the full part would have: a zero gradient, and AdamW still steps
                elif not batches and first:
                    log.warning("train_step: no loss tokens among %d rollouts (%d failed); no update",
                                len(rollouts), len(rollouts) - len(live))
                self._step_acc = step_acc  # what a sharded trainer reduces across ranks
                log_.add(*self._optimizer_step())
                acc.merge(step_acc)
                forwarded += sum(mb.num_tokens for mb in batches)
                n_micro += len(batches)
        self.scheduler.step()  # once per batch: the schedule counts policy versions
        metrics = step_metrics(acc, log_.metrics())
        metrics.update(age_stats(seqs, self.version))
        metrics.update(kl_metrics)
        self.version += 1
        elapsed = time.perf_counter() - start
        trained, skipped = [s for m in minis for s in m.train], [s for m in minis for s in m.skipped]
        metrics.update({
            "perf/train_tokens": float(forwarded),
            "perf/loss_tokens": float(sum(m.counts.num_tokens for m in minis)),
            "perf/sequences": float(len(trained)), "perf/failed_rollouts": float(len(rollouts) - len(live)),
            "perf/skipped_sequences": float(len(skipped)),
            "perf/skipped_tokens": float(sum(len(s.input_ids) for s in skipped)),
            "perf/micro_batches": float(n_micro), "perf/tokens_per_s": forwarded / max(elapsed, 1e-9),
            "time/train_s": elapsed,
        })
        return metrics

    def _skip_inert(self, train: list[TrainSequence], adv: AdvantageResult):
        """(sequences to train, sequences skipped). A sequence whose advantage is 0 on every
        token that counts in the loss contributes exactly 0 to the loss and its gradient when
        the objective says so (``AlgorithmConfig.zero_advantage_is_inert``: no KL, entropy or
        value term, and a policy loss that vanishes with the advantage); forwarding it would
        only cost time. ``trainer.skip_zero_advantage = false`` trains on it anyway."""
        if not (self.config.skip_zero_advantage and self.algorithm.zero_advantage_is_inert):
            return train, []
        kept, skipped = [], []
        for s in train:
            (kept if adv.advantages[s.index][s.keep].any() else skipped).append(s)
        return kept, skipped

    def _zero_grads(self) -> None:
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)

    def _micro_batches(self, seqs: list[TrainSequence]) -> list[MicroBatch]:
        c = self.config
        rows_ok = all(r.supports_rows for r in (self.runner, self.ref_runner) if r is not None)
        return micro_batches(seqs, c.micro_batch_tokens, c.pack_sequences, self.device,
                             row_tokens=c.pack_row_tokens, max_rows=None if rows_ok else 1)

    def _sequences(self, live: list[Rollout]) -> list[TrainSequence]:
        alg = self.algorithm
        seqs = [to_train_sequence(i, r, self.version, keep_sampling_mask=alg.keep_sampling_mask,
                                  max_token_age=alg.max_token_age) for i, r in enumerate(live)]
        seqs = [s for s in seqs if len(s.targets) > 0]
        if alg.behaviour_logprobs:
            for s in seqs:
                if not np.isfinite(s.behaviour[s.keep]).all():
                    raise ValueError(f"rollout {s.index} has non-finite behaviour log-probs on loss tokens; "
                                     "if the engine does not record them set algorithm.behaviour_logprobs = false")
        return seqs

    @staticmethod
    def _keep_mask(mb: MicroBatch, vocab: int) -> SupportMask | None:
        if mb.support_rows is None:
            return None
        return SupportMask.build(mb.support_rows, *mb.support_pairs, vocab)

    @property
    def prox_from_forward(self) -> bool:
        """Whether the decoupled objective's π_prox (the policy before the batch's first optimizer
        step) is read off a training forward at those weights (detached) instead of a separate
        no-grad pass: the first step's forward covers its part of the batch (all of it with one
        step per batch), and only when that forward is deterministic. Dropout or router jitter
        (``self.stochastic``) make a train-mode forward differ from the policy; then the pass runs,
        in eval mode."""
        alg = self.algorithm
        return alg.objective == "decoupled" and alg.behaviour_logprobs and not self.stochastic

    def _accumulate(self, mb: MicroBatch, adv: AdvantageResult, prox, old_values, counts, acc, *,
                    fill_prox: bool = False, at_start: bool = True, record: bool = True) -> None:
        """Forward, loss and backward of one micro-batch. ``fill_prox``: this forward is at π_prox's
        weights and gives π_prox for its tokens (stored in ``prox`` for later steps when it is a
        list); ``at_start``: the weights are the batch's starting ones (first optimizer step);
        ``record``: count this token's once-per-batch statistics (the first epoch)."""
        # The replay spans the backward too: activation checkpointing re-runs the routers there.
        with self.routing.replaying(mb.routing, mb.routing_has):
            self._forward_backward(mb, adv, prox, old_values, counts, acc, fill_prox, at_start, record)
        if mb.routing is not None:
            differ, compared = self.routing.take_counts()
            acc.add("sum/route_differ", differ)
            acc.add("n/route_compared", compared)
            if self.config.routing_probe and self.algorithm.behaviour_logprobs and at_start:
                self._probe_routing(mb, acc)

    def _probe_routing(self, mb: MicroBatch, acc: Accumulator) -> None:
        """The on-policy mismatch had the trainer routed the other way (``trainer.routing_probe``)."""
        same = mb.mask & (mb.versions == self.version)
        if bool(same.any()):
            logp = self.routing.score_other_way(
                mb, lambda: self.runner.logprobs(mb, self._keep_mask(mb, self.runner.vocab_size),
                                                 chunk=self.config.logprob_chunk_tokens, with_entropy=False)[0])
            other = "unreplayed" if self.routing.replay else "replayed"
            acc.add(f"sum/mismatch_abs_{other}", (logp - mb.behaviour)[same].abs().sum())

    def _forward_backward(self, mb: MicroBatch, adv: AdvantageResult, prox, old_values, counts, acc,
                          fill_prox: bool, at_start: bool, record: bool) -> None:
        alg = self.algorithm
        with span("trainer/forward", tokens=mb.num_tokens, seqs=mb.num_seqs):
            chunk = self.config.logprob_chunk_tokens
            keep = self._keep_mask(mb, self.runner.vocab_size)
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
                self._record_mismatch(mb, start_logp, acc)
        with span("trainer/backward", tokens=mb.num_tokens):
            terms.total.backward()

    def _record_mismatch(self, mb: MicroBatch, logp: torch.Tensor, acc: Accumulator) -> None:
        """Engine vs trainer on the same weights: loss tokens whose version is the trainer's."""
        same = mb.mask & (mb.versions == self.version)
        if not bool(same.any()):
            return
        d = (logp - mb.behaviour)[same]
        acc.add("n/onpolicy", same.sum())
        acc.add("sum/mismatch_abs", d.abs().sum())
        acc.add("sum/mismatch_ratio", torch.exp(d).sum())

    def _optimizer_step(self) -> tuple[float, float, bool]:
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

"""The single-process trainer: rollouts in, one optimizer step out, policy version + 1.

One ``train_step``::

    rollouts ─ drop failed ─► TrainSequences ─► [no-grad pass: π_prox, V_old] ─► advantages
        ─► pack into micro-batches ─► per micro-batch: forward → loss → backward (accumulate)
        ─► clip grad norm ─► AdamW step ─► LR schedule step ─► version += 1

Every loss term is normalised over the whole step's batch before any backward
(:class:`GlobalCounts`), so accumulating over micro-batches gives exactly the full-batch
gradient. A data-parallel trainer passes counts summed over ranks as ``global_counts``; the
per-rank losses then *sum* to the global loss (reduce gradients with a sum, not a mean).
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext

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
from tokenflow.trainer.model import CausalLMRunner, enable_checkpointing, frozen_copy, load_causal_lm, use_fp32_lm_head
from tokenflow.trainer.policy_weights import PolicyWeights
from tokenflow.trainer.schedule import build_scheduler
from tokenflow.trainer.value_head import ValueHead

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError('trainer.device = "cuda" but no CUDA device is visible; use "cpu" or "auto"')
    return torch.device(name)


class Trainer(PolicyWeights):
    """Owns the policy (trained in place), optional value head and reference, AdamW and the LR
    schedule. ``version`` counts optimizer steps applied, starting from ``version``."""

    def __init__(self, model, config: TrainerConfig, algorithm: AlgorithmConfig, *,
                 version: int = 0, tokenizer=None) -> None:
        check_compatible(config, algorithm)
        self.config, self.algorithm, self.version, self.tokenizer = config, algorithm, version, tokenizer
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        torch.manual_seed(config.seed)
        self.device = resolve_device(config.device)
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

    # ----------------------------------------------------------------------------- one step

    def train_step(self, rollouts: list[Rollout], *, global_counts: GlobalCounts | None = None) -> dict[str, float]:
        """One optimizer step over exactly ``rollouts``; returns the step's metrics.

        Failed rollouts are dropped first (their groups become ragged). ``global_counts``
        replaces the locally counted loss tokens and sequences in the aggregation normaliser; a
        data-parallel caller passes the counts summed over ranks, and then ``loss/*`` are this
        rank's shares of the global loss.
        """
        start = time.perf_counter()
        alg = self.algorithm
        live = [r for r in rollouts if not r.failed]
        seqs = self._sequences(live)
        # GAE needs V_old before the advantages; otherwise π_prox is needed only for the
        # sequences that are trained, which are known once the advantages are.
        values_first = self.value_head is not None
        prox, old_values = self._no_grad_pass(seqs, len(live)) if values_first else (None, None)
        kl_rewards, kl_metrics = self._kl_rewards(live, seqs)
        adv = compute_advantages(live, alg, old_values, kl_rewards)
        train = [s for s in seqs if s.num_loss_tokens > 0]
        # The normaliser counts every sequence with loss tokens, skipped or not: that keeps each
        # trained token's weight, hence the gradient, what it would be without the skip.
        counts = global_counts or GlobalCounts(sum(s.num_loss_tokens for s in train), len(train))
        train, skipped = self._skip_inert(train, adv)
        if not values_first:
            prox, _ = self._no_grad_pass(train, len(live))
        acc = Accumulator()
        batches = self._micro_batches(train)
        for mb in batches:
            self._accumulate(mb, adv, prox, old_values, counts, acc)
        if skipped and not batches:
            self._zero_grads()  # as the full batch would have: a zero gradient, and AdamW still steps
        elif not batches:
            log.warning("train_step: no loss tokens among %d rollouts (%d failed); no update",
                        len(rollouts), len(rollouts) - len(live))
        grad_norm, lr, opt_skipped = self._optimizer_step()
        metrics = step_metrics(acc, grad_norm=grad_norm, lr=lr, skipped=opt_skipped)
        metrics.update(age_stats(seqs, self.version))
        metrics.update(kl_metrics)
        self.version += 1
        elapsed = time.perf_counter() - start
        tokens = sum(mb.num_tokens for mb in batches)
        metrics.update({
            "perf/train_tokens": float(tokens), "perf/loss_tokens": float(counts.num_tokens),
            "perf/sequences": float(len(train)), "perf/failed_rollouts": float(len(rollouts) - len(live)),
            "perf/skipped_sequences": float(len(skipped)),
            "perf/skipped_tokens": float(sum(len(s.input_ids) for s in skipped)),
            "perf/micro_batches": float(len(batches)), "perf/tokens_per_s": tokens / max(elapsed, 1e-9),
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
        """Whether the decoupled objective's π_prox is read off the step's own forward pass
        (detached) instead of a separate no-grad pass. π_prox is the weights at the start of the
        step, and one ``train_step`` is one optimizer step: every micro-batch is forwarded with
        exactly those weights, so the pass would recompute the same numbers. Only a stochastic
        forward (LoRA dropout) makes the two differ; then the pass runs."""
        alg = self.algorithm
        return (alg.objective == "decoupled" and alg.behaviour_logprobs
                and not (self.is_lora and self.config.lora_dropout > 0))

    def _no_grad_pass(self, seqs: list[TrainSequence], n: int):
        """π_prox log-probs (decoupled objective / no behaviour log-probs) and V_old (GAE), per
        rollout, from the weights at the start of the step."""
        want_prox = self.algorithm.needs_prox_pass and not self.prox_from_forward
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
        unless given, e.g. the reference's)."""
        runner = runner or self.runner
        logps = [np.zeros(0, dtype=np.float32)] * n
        values = [np.zeros(0, dtype=np.float32)] * n if with_values else None
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
        the loss sees them (temperature, Keep Sampling Mask, packing). No gradient, no update."""
        seqs = [to_train_sequence(i, r, self.version, keep_sampling_mask=self.algorithm.keep_sampling_mask,
                                  max_token_age=None) for i, r in enumerate(rollouts)]
        logps, _ = self._score([s for s in seqs if len(s.targets)], len(rollouts), with_values=False)
        return logps

    def _accumulate(self, mb: MicroBatch, adv: AdvantageResult, prox, old_values, counts, acc) -> None:
        # The replay spans the backward too: activation checkpointing re-runs the routers there.
        with self.routing.replaying(mb.routing, mb.routing_has):
            self._forward_backward(mb, adv, prox, old_values, counts, acc)
        if mb.routing is not None:
            differ, compared = self.routing.take_counts()
            acc.add("sum/route_differ", differ)
            acc.add("n/route_compared", compared)
            if self.config.routing_probe and self.algorithm.behaviour_logprobs:
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

    def _forward_backward(self, mb: MicroBatch, adv: AdvantageResult, prox, old_values, counts, acc) -> None:
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
            if prox is not None:
                prox_t = mb.per_token(prox)
            elif self.prox_from_forward:
                prox_t = logp.detach()  # the start-of-step weights are the ones forwarded
            else:
                prox_t = None
            inputs = TokenInputs(
                logprobs=logp, behaviour=mb.behaviour, advantages=mb.per_token(adv.advantages),
                mask=mb.mask, weights=weights, seq_index=mb.seq_index, num_seqs=mb.num_seqs,
                prox=prox_t, entropy=entropy, ref_logprobs=ref,
                values=self.value_head(hidden) if self.value_head is not None else None,
                old_values=mb.per_token(old_values) if old_values is not None else None,
                returns=mb.per_token(adv.returns) if adv.returns is not None else None,
            )
            terms = micro_batch_loss(alg, inputs, acc)
            if alg.behaviour_logprobs:
                self._record_mismatch(mb, logp.detach(), acc)
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
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        return norm, lr, skipped

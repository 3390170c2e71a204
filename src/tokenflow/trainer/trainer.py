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
:mod:`tokenflow.trainer.updates`; the no-grad passes: :mod:`tokenflow.trainer.passes`; a
micro-batch's forward/backward and the optimizer step: :mod:`tokenflow.trainer.stepping`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from tokenflow.algorithms import AlgorithmConfig, GlobalCounts, compute_advantages
from tokenflow.algorithms.advantages import AdvantageResult
from tokenflow.algorithms.stats import Accumulator
from tokenflow.config.trainer import TrainerConfig, check_compatible
from tokenflow.rollout import Rollout
from tokenflow.trainer.batch import MicroBatcher, TrainSequence, to_train_sequence
from tokenflow.trainer.checkpointing import TrainingState
from tokenflow.trainer.keep_routing import RoutingReplay
from tokenflow.trainer.metrics import age_stats, step_metrics
from tokenflow.trainer.model.compiled import compile_layers, warm_up
from tokenflow.trainer.model.loading import load_policy, sparse_tied_embedding
from tokenflow.host_memory import limit_onednn_cache, read_status_kb, release_freed_memory
from tokenflow.trainer.model.memory import keep_host_memory
from tokenflow.trainer.model.runner import CausalLMRunner
from tokenflow.trainer.model.value_head import ValueHead
from tokenflow.trainer.passes import NoGradPasses
from tokenflow.trainer.schedule import build_scheduler, staleness_lr_scale
from tokenflow.trainer.stepping import Stepper
from tokenflow.trainer.updates import MiniBatch, StepLog, split
from tokenflow.trainer.weights import PolicyWeights

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError('trainer.device = "cuda" but no CUDA device is visible; use "cpu" or "auto"')
    return torch.device(name)


def fused_adam_supported(groups: list[dict]) -> bool:
    """Whether torch's fused AdamW takes these parameters: floating point, all on one device of a
    type it has the kernel for (CPU and CUDA)."""
    params = [p for g in groups for p in g["params"]]
    devices = {p.device.type for p in params}
    return (len(devices) == 1 and devices <= {"cpu", "cuda"}
            and all(p.dtype in (torch.float32, torch.float16, torch.bfloat16) for p in params))


class Trainer:
    """Owns the policy (trained in place), optional value head and reference, AdamW and the LR
    schedule. ``version`` counts rollout batches trained (policy versions, one weight push
    each), starting from ``version``; a batch is ``mini_batches × epochs`` optimizer steps.

    The work is done by collaborators given what they need (``_assemble``): ``batcher``
    (micro-batches), ``passes`` (no-grad passes), ``stepper`` (forward/backward, optimizer
    step), ``weights`` (weights out) and ``checkpoints`` (state to resume)."""

    keeps_casts = True
    """An optimizer step's micro-batches share one autocast region (`_casts_kept`)."""
    sparse_embedding = True
    """A tied input embedding's gradient is sparse (`loading.sparse_tied_embedding`); not for
    sharded parameters."""

    def __init__(self, model, config: TrainerConfig, algorithm: AlgorithmConfig, *,
                 version: int = 0, tokenizer=None) -> None:
        check_compatible(config, algorithm)
        self.config, self.algorithm, self.version, self.tokenizer = config, algorithm, version, tokenizer
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        torch.manual_seed(config.seed)
        self.device = resolve_device(config.device)
        keep_host_memory(config.keep_host_memory, self.device)
        limit_onednn_cache(config.onednn_cache_capacity, self.device.type)
        # off on a CPU trainer: each step hands its freed memory back (release_freed_memory)
        self.trims_memory = self.device.type == "cpu" and not config.keep_host_memory
        loaded = load_policy(model, config, algorithm, self.device)
        self.model, self.reference, self.is_lora = loaded.model, loaded.reference, loaded.is_lora
        self.stochastic = loaded.stochastic
        """What makes the train-mode forward random (dropout, router jitter); empty if nothing."""
        if self.sparse_embedding:
            sparse_tied_embedding(self.model)
        if self.stochastic:
            log.info("the policy's forward is stochastic (%s): π_prox comes from a no-grad pass in eval mode",
                     ", ".join(self.stochastic))
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
            from tokenflow.trainer.model.lora import BaseModelRunner

            self.ref_runner = BaseModelRunner(self.runner)
        self.shares_prompts = self._shares_prompts()
        """``trainer.share_prompts``, where the models can run shared rows (else said why, once)."""
        compiled = compile_layers(self.model, self.device) if config.compile_layers else 0
        # Compiled layers get the trainer's own mask in every micro-batch, shared or not: one kind
        # of mask, the kind the warm-up compiled (eager layers keep transformers' own where
        # nothing is shared, e.g. sdpa's causal kernel on a single sequence).
        self.own_masks = self.shares_prompts and compiled > 0
        if compiled:
            took = warm_up(self.runner, self.runner.vocab_size, scoring=self._scores_policy(),
                           own_masks=self.own_masks)
            if took is not None:
                log.info("trainer.compile_layers: %d layers compiled in %.1f s", compiled, took)
        groups = self._param_groups()
        self.optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.adam_eps,
                                           fused=config.fused_optimizer and fused_adam_supported(groups) or None)
        self.scheduler = build_scheduler(self.optimizer, config)
        self._assemble()

    def _assemble(self) -> None:
        """Build the collaborators from the parts (a sharded trainer shards first and builds its own)."""
        c = self.config
        rows_ok = all(r.supports_rows for r in (self.runner, self.ref_runner) if r is not None)
        self.batcher = MicroBatcher(c.micro_batch_tokens, c.pack_sequences, self.device,
                                    row_tokens=c.pack_row_tokens, max_rows=None if rows_ok else 1,
                                    share_prompts=self.shares_prompts, own_masks=self.own_masks)
        self.passes = NoGradPasses(algorithm=self.algorithm, model=self.model, runner=self.runner,
                                   ref_runner=self.ref_runner, value_head=self.value_head, routing=self.routing,
                                   batcher=self.batcher, chunk=c.logprob_chunk_tokens)
        self.stepper = Stepper(config=c, algorithm=self.algorithm, device=self.device, runner=self.runner,
                               ref_runner=self.ref_runner, value_head=self.value_head, routing=self.routing,
                               optimizer=self.optimizer)
        self.weights = PolicyWeights(model=self.model, is_lora=self.is_lora, device=self.device,
                                     tokenizer=self.tokenizer)
        self.checkpoints = TrainingState(model=self.model, is_lora=self.is_lora, value_head=self.value_head,
                                         optimizer=self.optimizer, scheduler=self.scheduler)

    def _shares_prompts(self) -> bool:
        runners = [r for r in (self.runner, self.ref_runner) if r is not None]
        blocker = next((r.sharing_blocker for r in runners if r.sharing_blocker), None)
        if self.config.share_prompts and blocker:
            log.info("trainer.share_prompts: off (%s); every sample forwards its prompt", blocker)
        return self.config.share_prompts and blocker is None

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
        rank's shares of the global loss (one mini-batch only). The staleness factor on the lr
        (``trainer.staleness_lr``) is computed from ``rollouts``: such a caller, whose ranks hold
        different rollouts, turns it off or gives the ranks shards of equal mean age.
        """
        start = time.perf_counter()
        alg, c = self.algorithm, self.config
        live = [r for r in rollouts if not r.failed]
        seqs = self._sequences(live)
        # π_prox, the policy before the batch's first step: from a no-grad pass, except where a
        # forward at those weights gives it exactly (``prox_from_forward``): the first step's
        # forward for its part (and the only step's for all of it).
        fill = alg.needs_prox_pass and self.prox_from_forward
        # GAE needs V_old before the advantages; otherwise π_prox is needed only for the
        # sequences that are trained, which are known once the advantages are.
        values_first = self.value_head is not None
        prox, old_values = None, None
        if values_first:
            prox, old_values = self.passes.prox_and_values(seqs, len(live), want_prox=self._prox_pass)
        kl_rewards, kl_metrics = self.passes.kl_rewards(live, seqs)
        adv = compute_advantages(live, alg, old_values, kl_rewards)
        train = [s for s in seqs if s.num_loss_tokens > 0]
        # Each normaliser counts every sequence of its part with loss tokens, skipped or not:
        # that keeps each trained token's weight, hence the gradient, what it would be without
        # the skip.
        minis = [MiniBatch(counts, *self._skip_inert(part, adv)) for part, counts in
                 split(train, c.mini_batches, global_counts)]
        if prox is None and self._prox_pass:
            later = [s for m in (minis[1:] if fill else minis) for s in m.train]
            prox = (self.passes.prox_and_values(later, len(live), want_prox=True)[0] if later
                    else [np.zeros(0, dtype=np.float32)] * len(live))
        acc, log_ = Accumulator(), StepLog()
        forwarded = n_micro = shared = 0
        # Every rank sees the whole batch, so every rank computes the same factor.
        scale = staleness_lr_scale(self._trained_age([s for m in minis for s in m.train]), c)
        scheduled = [g["lr"] for g in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["lr"] *= scale
        for epoch in range(c.epochs):
            for k, mini in enumerate(minis):
                step_acc = Accumulator()
                batches = self.batcher(mini.train)
                first = epoch == 0 and k == 0
                with self._casts_kept(batches):
                    for mb in batches:
                        self.stepper.accumulate(mb, adv, prox, old_values, mini.counts, step_acc, version=self.version,
                                                fill_prox=first and fill, at_start=first, record=epoch == 0)
                if mini.skipped and not batches:
                    self.stepper.zero_grads()  # as the full part would have: a zero gradient, and AdamW still steps
                elif not batches and first:
                    log.warning("train_step: no loss tokens among %d rollouts (%d failed); no update",
                                len(rollouts), len(rollouts) - len(live))
                log_.add(*self.stepper.optimizer_step(step_acc))
                acc.merge(step_acc)
                forwarded += sum(mb.num_tokens for mb in batches)
                shared += sum(mb.shared_tokens for mb in batches)
                n_micro += len(batches)
        for g, lr in zip(self.optimizer.param_groups, scheduled):
            g["lr"] = lr
        self.scheduler.step()  # once per batch: the schedule counts policy versions
        metrics = step_metrics(acc, log_.metrics())
        metrics["optim/staleness_lr_scale"] = scale
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
            "perf/shared_prompt_tokens": float(shared),
            "perf/micro_batches": float(n_micro), "perf/tokens_per_s": forwarded / max(elapsed, 1e-9),
            "time/train_s": elapsed,
        })
        if self.trims_memory:
            release_freed_memory()
        elif self.device.type == "cpu" and self.config.keep_host_memory_gb is not None:
            # the kept heap's bound: its holes go back once fragmentation takes it past it
            resident_kb = read_status_kb(os.getpid(), "VmRSS")
            over = resident_kb is not None and resident_kb * 1024 > self.config.keep_host_memory_gb * 1e9
            metrics["perf/host_memory_released"] = float(over and release_freed_memory())
        return metrics

    def _trained_age(self, train: list[TrainSequence]) -> float:
        """Mean age (this version − token version) of the loss tokens of the sequences trained."""
        ages = [self.version - s.versions[s.keep] for s in train]
        n = sum(len(a) for a in ages)
        return float(sum(a.sum() for a in ages)) / n if n else 0.0

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

    def _casts_kept(self, batches):
        """One autocast region over an optimizer step's micro-batches (``batches``): autocast
        keeps its casts of the float32 weights (the output head's [vocab, hidden] one above all)
        for the region's length, so each is made once a step instead of once a micro-batch. The
        weights do not change inside it (the optimizer steps after it). Only where the casts it
        keeps are ones each micro-batch's backward keeps anyway, so that the step's peak memory
        (what the memory estimate counts) does not grow: not with activations recomputed
        (``gradient_checkpointing``), nor where a micro-batch's log-probs run in recomputed
        chunks (more targets than ``logprob_chunk_tokens``), and not for sharded (FSDP) weights,
        gathered anew each forward (``keeps_casts`` False)."""
        c = self.config
        keeps = self.keeps_casts and not c.gradient_checkpointing and \
            all(len(mb.targets) <= c.logprob_chunk_tokens for mb in batches)
        return self.runner.autocast() if keeps else contextlib.nullcontext()

    def _scores_policy(self) -> bool:
        """Whether ``train_step`` runs no-grad passes through the policy's layers: π_prox where
        no training forward gives it, V_old for a value head, a LoRA policy's base as the KL
        reference."""
        alg = self.algorithm
        base_as_reference = self.is_lora and alg.kl_coef > 0 and self.reference is None
        return self._prox_pass or self.value_head is not None or base_as_reference

    @property
    def _prox_pass(self) -> bool:
        """Whether π_prox needs a no-grad pass: the objective reads it and no training forward
        gives all of it (several optimizer steps a batch, or not ``prox_from_forward``)."""
        c = self.config
        return self.algorithm.needs_prox_pass and (c.mini_batches * c.epochs > 1 or not self.prox_from_forward)

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

    # ----------------------------------------------------------------------------- the rest

    def logprobs(self, rollouts: list[Rollout]) -> list[np.ndarray]:
        """Per-token log-probs of each rollout's completion under the current weights, exactly as
        the loss sees them (temperature, Keep Sampling Mask, packing), in eval mode. No
        gradient, no update."""
        return self.passes.logprobs(rollouts, self.version)

    def named_weights(self, cpu: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's weights under their Hugging Face names (:meth:`PolicyWeights.named_weights`)."""
        return self.weights.named_weights(cpu)

    def place_weights(self, layout) -> int:
        """Lay the weights out as the broadcast's buckets (:meth:`PolicyWeights.place_weights`)."""
        return self.weights.place_weights(layout)

    def save_pretrained(self, directory: str | Path) -> Path:
        """The policy (and tokenizer) as a Hugging Face folder."""
        return self.weights.save_pretrained(directory)

    def state_dict(self) -> dict:
        """Everything needed to resume exactly: weights, optimizer, schedule, version, RNGs."""
        return self.checkpoints.state_dict(self.version)

    def load_state_dict(self, state: dict) -> None:
        self.version = self.checkpoints.load_state_dict(state)

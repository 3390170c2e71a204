"""The trainer sharded over N ranks with PyTorch FSDP2 (``fully_shard``).

Every rank receives the *whole* batch and runs the ordinary ``Trainer.train_step`` on it; only
the forward/backward work is split. Advantages (group- or batch-normalised) and the loss
normaliser (``GlobalCounts``) are therefore computed over the global batch on every rank, with
no extra exchange, and are exactly what one process would compute. The split happens where
micro-batches are built: each rank keeps its share of the sequences (balanced by tokens, see
``distributed.partition``), so the per-rank losses are shares of the global loss and FSDP must
reduce gradients by SUM (the divide factor is set to 1 on every FSDP unit).

FSDP collectives run in every forward and backward, so every rank must run the same number of
them: ranks with fewer micro-batches run padding micro-batches (one token, loss × 0) until all
ranks have run as many as the busiest one. Mini-batches (``trainer.mini_batches``) are split from
the whole batch, the same on every rank, before each rank takes its share of each. Step statistics are summed (minima/maxima reduced)
across ranks before the metrics are formed; the gradient norm used for clipping is global.

Weights leave the trainer through ``named_weights()``, which gathers one full tensor at a time
(``DTensor.full_tensor``, a collective on every rank): the weight sync packs them bucket by
bucket, so no rank ever holds a second full copy of the model.
"""

from __future__ import annotations

import json
import math
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from tokenflow.algorithms.stats import Accumulator
from tokenflow.trainer.batch import MicroBatch, MicroBatcher, TrainSequence, collate
from tokenflow.trainer.checkpointing import TrainingState, set_rng_state
from tokenflow.trainer.distributed import RankGroup, partition
from tokenflow.trainer.model.loading import decoder_layers
from tokenflow.trainer.model.runner import CausalLMRunner
from tokenflow.trainer.passes import NoGradPasses
from tokenflow.trainer.schedule import build_scheduler
from tokenflow.trainer.stepping import Stepper
from tokenflow.trainer.trainer import Trainer
from tokenflow.trainer.weights import PolicyWeights


def shard_model(model: torch.nn.Module, world_size: int, device_type: str) -> None:
    """One FSDP unit per decoder layer plus the root (embeddings, final norm, output head —
    tied weights stay in one unit). Gradients are summed, never averaged, across ranks."""
    mesh = init_device_mesh(device_type, (world_size,))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM/AVG


def _rows_forward(inner):
    """The root's forward around its own ``inner`` forward. FSDP2 gathers the root unit's
    parameters in the root's forward hook, so the rows path (decoder, gather the target
    positions, output head) must run inside it rather than call the decoder directly as
    ``CausalLMRunner`` does."""

    def forward(self, *args, tokenflow_rows: torch.Tensor | None = None, **kwargs):
        if tokenflow_rows is None:
            return inner(*args, **kwargs)
        out = self.get_decoder()(*args, **kwargs)
        hidden = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])[tokenflow_rows]
        return self.get_output_embeddings()(hidden), hidden

    return forward


class ShardedRunner(CausalLMRunner):
    # The output head must run inside the root's forward, where FSDP has gathered it: no chunks.
    chunkable = False

    def __init__(self, model, device, dtype) -> None:
        super().__init__(model, device, dtype)
        model.forward = types.MethodType(_rows_forward(model.forward), model)

    def _rows(self, mb: MicroBatch, want_hidden: bool):
        with self.autocast():
            logits, hidden = self.model(input_ids=mb.input_ids, position_ids=mb.position_ids,
                                        attention_mask=self.attention_mask(mb), use_cache=False,
                                        tokenflow_rows=mb.target_pos)
        return logits, (hidden if want_hidden else None)


def _padding_batch(device) -> MicroBatch:
    one = np.zeros(1, dtype=np.int64)
    seq = TrainSequence(index=-1, input_ids=one, prompt_len=1, targets=one, behaviour=np.zeros(1, np.float32),
                        versions=one, loss_mask=np.zeros(1, bool), keep=np.zeros(1, bool), temperature=1.0,
                        support=None)
    mb = collate([seq], device)
    mb.seqs = []  # writes nothing back (``NoGradPasses.score`` loops over seqs)
    mb.padding = True
    return mb


class ShardedBatcher(MicroBatcher):
    """This rank's share of the sequences (balanced by tokens), as micro-batches, then padding
    micro-batches up to the busiest rank's count."""

    def __init__(self, batcher: MicroBatcher, group: RankGroup) -> None:
        super().__init__(batcher.budget, batcher.packed, batcher.device, batcher.row_tokens, batcher.max_rows,
                         batcher.share_prompts, batcher.own_masks)
        self.group = group

    def __call__(self, seqs: list[TrainSequence]) -> list[MicroBatch]:
        share = set(partition([len(s.input_ids) for s in seqs], self.group.world)[self.group.rank])
        mine = super().__call__([s for k, s in enumerate(seqs) if k in share]) if share else []
        most = self.group.all_reduce(torch.tensor([len(mine)], device=self.device), dist.ReduceOp.MAX)
        return mine + [_padding_batch(self.device) for _ in range(int(most.item()) - len(mine))]


class ShardedPasses(NoGradPasses):
    """No-grad passes over this rank's share; every rank ends with every rollout's numbers."""

    def __init__(self, group: RankGroup, **parts) -> None:
        super().__init__(**parts)
        self.group = group

    def score(self, seqs, n, with_values, runner=None):
        logps, values = super().score(seqs, n, with_values, runner)
        mine = {s.index for s in seqs} & {i for i, lp in enumerate(logps) if len(lp)}
        from safetensors.numpy import load, save

        arrays = {f"{i}.lp": logps[i] for i in mine} | ({f"{i}.v": values[i] for i in mine} if values else {})
        for part in self.group.all_gather_bytes(save(arrays)):
            for key, arr in load(part).items():
                i, kind = key.split(".")
                (logps if kind == "lp" else values)[int(i)] = arr
        return logps, values


class ShardedStepper(Stepper):
    """Padding micro-batches run a zero loss (FSDP's collectives); the optimizer step sums the
    step's statistics over ranks and clips by the global gradient norm."""

    def __init__(self, group: RankGroup, **parts) -> None:
        super().__init__(**parts)
        self.group = group

    def accumulate(self, mb, adv, prox, old_values, counts, acc, **kw) -> None:
        if not getattr(mb, "padding", False):
            return super().accumulate(mb, adv, prox, old_values, counts, acc, **kw)
        logits, hidden = self.runner(mb, want_hidden=self.value_head is not None)
        zero = logits.float().sum() * 0.0
        if self.value_head is not None:
            zero = zero + self.value_head(hidden).sum() * 0.0
        zero.backward()

    def optimizer_step(self, acc: Accumulator | None = None) -> tuple[float, float, bool]:
        # This optimizer step's statistics, summed over the ranks once.
        if acc is not None:
            reduce_accumulator(acc, self.group, self.device)
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        replicated = [p for p in params if not isinstance(p.grad, DTensor)]  # the value head
        for p in replicated:
            self.group.all_reduce(p.grad)
        sq = torch.zeros(1, dtype=torch.float64, device=self.device)
        for p in params:
            if isinstance(p.grad, DTensor):
                sq += p.grad.to_local().double().pow(2).sum()
        self.group.all_reduce(sq)
        for p in replicated:
            sq += p.grad.double().pow(2).sum()
        norm = math.sqrt(float(sq.item()))
        max_norm = self.config.grad_clip
        if max_norm is not None and math.isfinite(norm):
            # The same coefficient as torch.nn.utils.clip_grad_norm_.
            coef = min(1.0, max_norm / (norm + 1e-6))
            for p in params:
                p.grad.mul_(coef)
        lr = float(self.optimizer.param_groups[0]["lr"])
        skipped = not math.isfinite(norm)
        if not skipped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm, lr, skipped


class ShardedWeights(PolicyWeights):
    """Weights out of a sharded policy: collectives, so every rank calls them."""

    def __init__(self, group: RankGroup, **parts) -> None:
        super().__init__(**parts)
        self.group = group

    def named_weights(self, cpu: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """Full tensors one at a time (a gather per tensor, on every rank); on CPU unless
        ``cpu=False`` (then on the trainer's device, as a GPU broadcast wants them)."""
        for name, t in self.model.state_dict().items():
            full = t.full_tensor() if isinstance(t, DTensor) else t
            yield name, full.detach().cpu() if cpu else full.detach()

    def place_weights(self, layout) -> int:
        """Sharded weights are gathered at each push: there is nothing to place."""
        return 0

    def weight_shapes(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Names, shapes and dtypes of ``named_weights()`` as meta tensors (no collective)."""
        for name, t in self.model.state_dict().items():
            yield name, torch.empty(t.shape, dtype=t.dtype, device="meta")

    def save_pretrained(self, directory: str | Path) -> Path:
        weights = dict(self.named_weights())
        directory = Path(directory)
        if self.group.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(directory, state_dict=weights)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(directory)
        return directory


class ShardedTrainingState(TrainingState):
    """Checkpoint state with weights and optimizer state gathered in full (by parameter name,
    on CPU): the same on every rank, which must all call it."""

    def __init__(self, weights: ShardedWeights, **parts) -> None:
        super().__init__(**parts)
        self.weights = weights

    def state_dict(self, version: int) -> dict:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = super().state_dict(version)
        state["model"] = dict(self.weights.named_weights())
        state["optimizer"] = get_optimizer_state_dict(self.model, self.optimizer, options=opts)
        return state

    def load_state_dict(self, state: dict) -> int:
        """Optimizer (full, by parameter name; each rank keeps its shard), scheduler, version,
        RNG; the weights come from the checkpoint's model folder, loaded before sharding."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"],
                                 options=StateDictOptions(full_state_dict=True))
        self.scheduler.load_state_dict(state["scheduler"])
        self.load_value_head(state)
        set_rng_state(state.get("rng") or {})
        return int(state["version"])


class FSDPTrainer(Trainer):
    """``Trainer`` over ``group.world`` ranks; every rank constructs it and calls the same methods."""

    keeps_casts = False  # autocast would keep casts of the gathered, unsharded weights
    sparse_embedding = False  # sharded parameters take dense gradients

    def __init__(self, model, config, algorithm, *, group: RankGroup, version: int = 0, tokenizer=None) -> None:
        self.group = group
        super().__init__(model, config, algorithm, version=version, tokenizer=tokenizer)

    @property
    def is_writer(self) -> bool:
        return self.group.rank == 0

    def _assemble(self) -> None:
        """Shard the policy, then build the sharded collaborators over it."""
        config = self.config
        shard_model(self.model, self.group.world, self.device.type)
        self.runner = ShardedRunner(self.model, self.device, config.dtype)
        # The parameters are DTensors now: the optimizer must hold those, not the originals.
        self.optimizer = torch.optim.AdamW(self._param_groups(), lr=config.lr, betas=config.betas,
                                           eps=config.adam_eps)
        self.scheduler = build_scheduler(self.optimizer, config)
        super()._assemble()
        g = self.group
        self.batcher = ShardedBatcher(self.batcher, g)
        self.passes = ShardedPasses(g, algorithm=self.algorithm, model=self.model, runner=self.runner,
                                    ref_runner=self.ref_runner, value_head=self.value_head, routing=self.routing,
                                    batcher=self.batcher, chunk=config.logprob_chunk_tokens)
        self.stepper = ShardedStepper(g, config=config, algorithm=self.algorithm, device=self.device,
                                      runner=self.runner, ref_runner=self.ref_runner, value_head=self.value_head,
                                      routing=self.routing, optimizer=self.optimizer)
        self.weights = ShardedWeights(g, model=self.model, is_lora=self.is_lora, device=self.device,
                                      tokenizer=self.tokenizer)
        self.checkpoints = ShardedTrainingState(self.weights, model=self.model, is_lora=self.is_lora,
                                                value_head=self.value_head, optimizer=self.optimizer,
                                                scheduler=self.scheduler)

    def train_step(self, rollouts, *, global_counts=None) -> dict[str, float]:
        metrics = super().train_step(rollouts, global_counts=global_counts)
        local = torch.tensor([metrics["perf/train_tokens"], metrics["perf/micro_batches"],
                              metrics["perf/shared_prompt_tokens"]], dtype=torch.float64, device=self.device)
        tokens, mbs, shared = self.group.all_reduce(local).tolist()
        metrics["perf/tokens_per_s"] *= tokens / max(metrics["perf/train_tokens"], 1.0)
        metrics.update({"perf/train_tokens": tokens, "perf/micro_batches": mbs, "perf/shared_prompt_tokens": shared,
                        "perf/trainer_ranks": float(self.group.world)})
        return metrics

    def weight_shapes(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Names, shapes and dtypes of ``named_weights()`` as meta tensors (no collective)."""
        return self.weights.weight_shapes()


def reduce_accumulator(acc, group: RankGroup, device) -> None:
    """Sum the step's running sums across ranks, and take the min of minima and max of maxima
    (``Accumulator.tables``: its whole state, rewritten in place)."""
    tables = acc.tables()
    for table, op, empty in ((tables["sum"], dist.ReduceOp.SUM, 0.0), (tables["min"], dist.ReduceOp.MIN, math.inf),
                             (tables["max"], dist.ReduceOp.MAX, -math.inf)):
        gathered = group.all_gather_bytes(json.dumps(sorted(table)).encode())
        names = sorted({k for keys in gathered for k in json.loads(keys)})
        if not names:
            continue
        vals = torch.tensor([float(table[k]) if k in table else empty for k in names],
                            dtype=torch.float64, device=device)
        group.all_reduce(vals, op)
        for k, v in zip(names, vals.tolist()):
            table[k] = v

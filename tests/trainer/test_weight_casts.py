"""An optimizer step's micro-batches share one autocast region (``Trainer._casts_kept``): the
float32 weights are cast to bfloat16 once a step, not once a micro-batch, a step after an
optimizer step never runs on the casts of the weights before it, and casts the backward would
recompute are not kept."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.trainer.trainer_testlib import make_rollouts, on_policy, tiny_model
from tokenflow.algorithms import AlgorithmConfig
from tokenflow.trainer import Trainer, TrainerConfig


class HeadCasts(TorchDispatchMode):
    """Counts float32 → bfloat16 copies of a tensor shaped like the output head's weight."""

    def __init__(self, shape: torch.Size) -> None:
        super().__init__()
        self.shape, self.count = shape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and args[0].shape == self.shape \
                and args[0].dtype == torch.float32 and kwargs.get("dtype") == torch.bfloat16:
            self.count += 1
        return func(*args, **kwargs)


def _trainer(keeps_casts: bool, **kw) -> Trainer:
    cfg = TrainerConfig(device="cpu", dtype="bfloat16", lr=1e-2, pack_sequences=False, micro_batch_tokens=40, **kw)
    trainer = Trainer(tiny_model(seed=3, tie=True), cfg, AlgorithmConfig(), version=0)
    trainer.keeps_casts = keeps_casts
    return trainer


def _batch():
    return on_policy(tiny_model(seed=3, tie=True), make_rollouts(seed=8, groups=4, per_group=4))


@pytest.mark.parametrize("kw", [{}, {"mini_batches": 2}, {"mini_batches": 2, "epochs": 2}],
                         ids=["one step", "two steps a batch", "two epochs of two"])
def test_keeping_casts_trains_exactly_the_weights_casting_each_micro_batch_does(kw):
    # the casts are deterministic: made once or per micro-batch they are the same numbers, so
    # the weights after a batch are bitwise equal unless a step ran on a cast of older weights
    kept, fresh = _trainer(True, **kw), _trainer(False, **kw)
    m_kept, m_fresh = kept.train_step(_batch()), fresh.train_step(_batch())
    assert m_kept["perf/micro_batches"] >= 2 * kept.config.mini_batches * kept.config.epochs
    assert m_kept["loss/total"] == m_fresh["loss/total"]
    for (name, a), b in zip(kept.model.named_parameters(), fresh.model.parameters()):
        assert torch.equal(a, b), name
    assert any(not torch.equal(a, b) for a, b in zip(kept.model.parameters(), tiny_model(seed=3, tie=True).parameters()))


@pytest.mark.parametrize("kw", [{}, {"mini_batches": 2}], ids=["one step", "two steps a batch"])
def test_the_output_heads_weight_is_cast_once_an_optimizer_step(kw):
    counts, steps = {}, kw.get("mini_batches", 1)
    for keeps in (True, False):
        trainer, batch = _trainer(keeps, **kw), _batch()
        with HeadCasts(trainer.model.get_output_embeddings().weight.shape) as casts:
            m = trainer.train_step(batch)
        counts[keeps] = casts.count
    micro = m["perf/micro_batches"]
    assert micro >= 2 * steps
    # casting each micro-batch: one per micro-batch (and one per micro-batch of the no-grad
    # pass for pi_prox that two steps a batch need); kept: one per optimizer step instead
    assert counts[False] - counts[True] == micro - steps, (counts, micro)
    if steps == 1:
        assert counts[True] == 1


@pytest.mark.parametrize("kw", [{"gradient_checkpointing": True}, {"logprob_chunk_tokens": 8}],
                         ids=["activations recomputed", "log-probs in recomputed chunks"])
def test_casts_the_backward_would_not_keep_are_not_kept(kw):
    # there the backward recomputes the casts rather than keeping them: kept for the whole step,
    # they would add the weights' bfloat16 copy to the peak the memory estimate counts
    counts = {}
    for keeps in (True, False):
        trainer, batch = _trainer(keeps, **kw), _batch()
        with HeadCasts(trainer.model.get_output_embeddings().weight.shape) as casts:
            m = trainer.train_step(batch)
        counts[keeps] = casts.count
    assert counts[True] == counts[False] >= m["perf/micro_batches"] >= 2, counts

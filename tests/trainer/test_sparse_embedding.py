"""A tied input embedding's gradient is sparse (``loading.sparse_tied_embedding``): no dense
[vocab, hidden] zeros each micro-batch, the same update, and an untied embedding left dense."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.trainer.trainer_testlib import VOCAB, on_policy, tiny_model
from tokenflow.algorithms import AlgorithmConfig
from tokenflow.rollout import Rollout
from tokenflow.trainer import Trainer, TrainerConfig


class DenseEmbeddingBackwards(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten.embedding_dense_backward.default
        return func(*args, **(kwargs or {}))


def _trainer(sparse: bool, tie: bool = True) -> Trainer:
    cfg = TrainerConfig(device="cpu", dtype="bfloat16", lr=1e-2, pack_sequences=False, micro_batch_tokens=40)
    return type("T", (Trainer,), {"sparse_embedding": sparse})(tiny_model(seed=4, tie=tie), cfg,
                                                                AlgorithmConfig(), version=0)


def _distinct_token_rollouts() -> list[Rollout]:
    # every token id once in the whole batch: each embedding row's gradient is one term, which
    # the dense path adds to zeros and the sparse path adds to the head's gradient directly, so
    # both give the head's gradient plus that term, bitwise
    ids = np.random.default_rng(3).permutation(VOCAB)
    out, at = [], 0
    for g in range(2):
        for k in range(3):
            p, c = ids[at:at + 6], ids[at + 6:at + 14]
            at += 14
            out.append(Rollout(prompt_ids=p, completion_ids=c, logprobs=np.zeros(len(c)), versions=np.zeros(len(c)),
                               group_id=g, sample_index=k, reward=float(k), temperature=1.0))
    return on_policy(tiny_model(seed=4, tie=True), out)


def test_a_tied_embeddings_sparse_gradient_trains_the_dense_ones_weights():
    sparse, dense = _trainer(True), _trainer(False)
    emb = sparse.model.get_input_embeddings()
    assert emb.sparse and not dense.model.get_input_embeddings().sparse
    with DenseEmbeddingBackwards() as counted:
        m = sparse.train_step(_distinct_token_rollouts())
    assert counted.count == 0 and m["perf/micro_batches"] >= 2
    with DenseEmbeddingBackwards() as counted:
        dense.train_step(_distinct_token_rollouts())
    assert counted.count == m["perf/micro_batches"]  # one dense [vocab, hidden] gradient each
    for (name, a), b in zip(sparse.model.named_parameters(), dense.model.parameters()):
        assert torch.equal(a, b), name
    assert not torch.equal(emb.weight, tiny_model(seed=4, tie=True).get_input_embeddings().weight)


def test_an_untied_embedding_keeps_its_dense_gradient():
    trainer = _trainer(True, tie=False)
    assert not trainer.model.get_input_embeddings().sparse
    before = trainer.model.get_input_embeddings().weight.clone()
    trainer.train_step(_distinct_token_rollouts())  # AdamW takes no sparse gradient
    assert not torch.equal(before, trainer.model.get_input_embeddings().weight)

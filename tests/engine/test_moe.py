"""Mixture-of-experts families: parity with transformers, checkpoint names, and the routing record."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from tests.engine.engine_testlib import LogitsRecorder, hf_logits, hf_model, make_engine
from tests.engine.moe_testlib import MOE_FAMILIES, hf_routing, moe_hf_model
from tokenflow.engine import Engine, EngineConfig, SamplingParams


def prompts(seed: int, lengths=(5, 11, 8)) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("family", MOE_FAMILIES)
@pytest.mark.slow
def test_moe_logits_and_routing_match_transformers(family):
    hf = moe_hf_model(family, seed=1)
    engine = make_engine(hf, max_num_seqs=3)  # 5 samples in 3 slots: joins, leaves, slot moves
    rec = LogitsRecorder()
    engine.logits_hook = rec
    ps = prompts(3)
    params = [SamplingParams(temperature=1.0, n=2, max_tokens=7, ignore_eos=True, seed=1),
              SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
              SamplingParams(temperature=0.8, n=2, max_tokens=9, ignore_eos=True, seed=2)]
    results = engine.generate(ps, params)
    layers = len(engine.model.moe_layers)
    for prompt, group in zip(ps, results):
        for r in group:
            assert (rec.of(r) - hf_logits(hf, prompt, r.completion_ids)).abs().max().item() <= 1e-4
            read = prompt + r.completion_ids[:-1].tolist()
            assert r.routed_experts.dtype == np.uint8
            assert r.routed_experts.shape == (len(read), layers, hf.config.num_experts_per_tok)
            # float32 on both sides and random routers: no near-ties, so the same experts.
            assert np.array_equal(np.sort(r.routed_experts, -1), np.sort(hf_routing(hf, read), -1))


@pytest.mark.slow
def test_checkpoint_per_expert_names_load_and_fused_names_sync(tmp_path):
    hf = moe_hf_model("mixtral", seed=2)
    hf.save_pretrained(tmp_path)  # writes the older per-expert names (block_sparse_moe.experts.0.w1)
    engine = Engine(tmp_path, EngineConfig(device="cpu"))
    ids = prompts(4)[1]
    assert (engine.runner.score(ids)[:-1] - hf_logits(hf, ids[:1], ids[1:])).abs().max().item() <= 1e-4
    other = moe_hf_model("mixtral", seed=5)
    from tokenflow.engine.loading.weights import weights_checksum

    report = engine.update_weights(other.state_dict(), version=1, checksum=weights_checksum(other.state_dict()))
    assert report["applied"]
    assert engine.weights_checksum() == weights_checksum(other.state_dict())
    assert (engine.runner.score(ids)[:-1] - hf_logits(other, ids[:1], ids[1:])).abs().max().item() <= 1e-4


@pytest.mark.slow
def test_routing_survives_pickling_and_can_be_switched_off():
    hf = moe_hf_model("qwen3_moe", seed=1)
    params = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=3)
    (r,), = make_engine(hf).generate([prompts(5)[0]], params)
    back = pickle.loads(pickle.dumps(r))
    assert np.array_equal(back.routed_experts, r.routed_experts)
    (off,), = make_engine(hf, record_routing=False).generate([prompts(5)[0]], params)
    assert off.routed_experts is None and off.completion_ids.tolist() == r.completion_ids.tolist()
    dense = hf_model("qwen3", seed=1)  # a dense model records nothing
    (d,), = make_engine(dense).generate([prompts(5)[0]], params)
    assert d.routed_experts is None


@pytest.mark.slow
def test_abort_and_resume_keeps_the_routing_that_produced_each_token():
    start, trained = moe_hf_model("qwen3_moe", seed=1), moe_hf_model("qwen3_moe", seed=7)
    prompt = prompts(6)[2]
    params = SamplingParams(temperature=1.0, max_tokens=9, ignore_eos=True, seed=4)
    engine = make_engine(start)
    engine.add_request(prompt, params)
    for _ in range(4):
        engine.step()
    engine.update_weights(trained.state_dict(), version=1, mode="abort")
    (partial,) = engine.step()
    engine.add_request(prompt, params, resume=partial)
    (full,) = list(engine.stream())
    m = partial.num_tokens
    assert full.routed_experts.shape[0] == len(prompt) + full.num_tokens - 1
    # Rows up to the partial's last token: the old weights' routing, as recorded then.
    assert np.array_equal(full.routed_experts[:len(prompt) + m - 1], partial.routed_experts)
    # Rows after: the new weights' routing of the tokens read (transformers under `trained`).
    read = prompt + full.completion_ids[:-1].tolist()
    tail = slice(len(prompt) + m - 1, None)
    assert np.array_equal(np.sort(full.routed_experts[tail], -1), np.sort(hf_routing(trained, read)[tail], -1))

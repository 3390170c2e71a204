"""Weight updates: in-flight swaps, abort + prefix resume, drain, refusals, checksums."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.engine.engine_testlib import (
    VOCAB,
    LogitsRecorder,
    hf_logits,
    hf_model,
    make_engine,
)
from tokenflow.engine import SamplingParams, WeightUpdateError, weights_checksum

TARGET = 7


@pytest.fixture(scope="module")
def models():
    """(random weights, weights trained to always say TARGET)."""
    start = hf_model("qwen3", seed=11)
    trained = copy.deepcopy(start).train()
    opt = torch.optim.Adam(trained.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        ids = torch.randint(3, VOCAB, (8, 24), generator=gen)
        loss = F.cross_entropy(trained(ids).logits.reshape(-1, VOCAB), torch.full((8 * 24,), TARGET))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return start, trained.eval()


def run_all(engine) -> list:
    out = []
    while engine.has_unfinished():
        out += engine.step()
    return out


PROMPTS = [[5, 6, 7, 8, 9], [20, 21], list(range(30, 44))]
PARAMS = SamplingParams(temperature=1.0, top_k=20, n=2, max_tokens=12, seed=9, ignore_eos=True)


@pytest.mark.parametrize("recompute", [True, False])
def test_inflight_update_mid_generation(models, recompute):
    start, trained = models
    engine = make_engine(start, max_num_seqs=4)
    rec = LogitsRecorder()
    engine.logits_hook = rec
    for i, p in enumerate(PROMPTS):
        engine.add_request(p, PARAMS, f"r{i}")
    out = [r for _ in range(4) for r in engine.step()]
    running = engine.num_running
    report = engine.update_weights(trained.state_dict(), version=1, mode="inflight", recompute_kv=recompute)
    assert report["applied"] and not report["pending"] and engine.version == 1
    assert report["recomputed"] == (running if recompute else 0)
    out += run_all(engine)

    assert sorted((r.request_id, r.sample_index) for r in out) == [(f"r{i}", s) for i in range(3) for s in (0, 1)]
    crossed = 0
    for r in out:
        assert r.num_tokens == 12 and r.finish_reason == "length"
        v = r.versions
        assert set(v) <= {0, 1} and (np.diff(v) >= 0).all()  # 0 ... 0 1 ... 1
        after = v == 1
        crossed += bool(after.any() and (~after).any())
        prompt = PROMPTS[int(r.request_id[1:])]
        if after.all():  # started after the swap: exactly the new policy
            assert (rec.of(r) - hf_logits(trained, prompt, r.completion_ids)).abs().max() <= 1e-4
        elif after.any() and recompute:  # KV recomputed: the new tokens are the new policy's
            ref = hf_logits(trained, prompt, r.completion_ids)
            assert (rec.of(r)[after] - ref[after]).abs().max() <= 1e-4
        if after.any():
            assert (r.completion_ids[after] == TARGET).mean() > 0.8
        before = ~after
        if before.any():
            ref = hf_logits(start, prompt, r.completion_ids)
            assert (rec.of(r)[before] - ref[before]).abs().max() <= 1e-4
            assert (r.completion_ids[before] == TARGET).mean() < 0.5
    assert crossed >= 2  # some rollouts really did change policy mid-generation


def test_abort_then_resume_is_one_concatenated_rollout(models):
    start, trained = models
    engine = make_engine(start)
    rid = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=10, seed=4, top_p=0.9, ignore_eos=True))
    for _ in range(4):
        assert engine.step() == []
    report = engine.update_weights(trained.state_dict(), version=3, mode="abort")
    assert report["aborted"] == 1 and engine.version == 3
    (partial,) = engine.step()
    assert partial.finish_reason == "abort" and partial.num_tokens == 4
    assert partial.versions.tolist() == [0] * 4 and partial.request_id == rid
    engine.add_request(PROMPTS[0], SamplingParams(max_tokens=10, seed=4, top_p=0.9, ignore_eos=True),
                       resume=partial)
    (full,) = run_all(engine)
    assert full.request_id == rid and full.finish_reason == "length" and full.num_tokens == 10
    assert full.completion_ids[:4].tolist() == partial.completion_ids.tolist()
    assert np.array_equal(full.logprobs[:4], partial.logprobs)
    assert full.versions.tolist() == [0] * 4 + [3] * 6
    assert len(full.support) == 10 and all(s is not None for s in full.support)
    new_lp = torch.log_softmax(hf_logits(trained, PROMPTS[0], full.completion_ids), -1)
    tail = torch.as_tensor(full.completion_ids[4:], dtype=torch.long)
    full_lp = new_lp[4:].gather(1, tail[:, None])[:, 0].numpy()
    assert np.abs(full.full_logprobs[4:] - full_lp).max() <= 1e-5


def test_abort_and_resume_without_an_update_continues_exactly(models):
    start, _ = models
    params = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    ref = make_engine(start, seed=3).generate([PROMPTS[1]], params)[0][0]
    engine = make_engine(start, seed=3)
    rid = engine.add_request(PROMPTS[1], params)
    for _ in range(5):
        engine.step()
    engine.abort(rid)
    (partial,) = engine.step()
    engine.add_request(PROMPTS[1], params, resume=partial)
    (full,) = run_all(engine)
    assert full.completion_ids.tolist() == ref.completion_ids.tolist()
    assert np.abs(full.logprobs - ref.logprobs).max() <= 1e-5


def test_drain_finishes_running_requests_first(models):
    start, trained = models
    engine = make_engine(start)
    engine.add_request([3, 4, 5], SamplingParams(max_tokens=6, ignore_eos=True), "old")
    engine.step()
    report = engine.update_weights(trained.state_dict(), version=1, mode="drain")
    assert report["pending"] and not report["applied"] and engine.version == 0
    engine.add_request([3, 4, 5], SamplingParams(max_tokens=3, ignore_eos=True), "new")
    out = run_all(engine)
    assert [r.request_id for r in out] == ["old", "new"]  # "new" waited for the drain
    assert out[0].versions.tolist() == [0] * 6 and out[1].versions.tolist() == [1] * 3
    assert engine.version == 1


def test_refused_updates_keep_weights_and_version(models):
    start, trained = models
    engine = make_engine(start)
    before = engine.weights_checksum()
    good = trained.state_dict()
    missing = {k: v for k, v in good.items() if k != "model.layers.1.mlp.up_proj.weight"}
    extra = {**good, "model.layers.9.foo.weight": torch.zeros(3)}
    shaped = {**good, "model.layers.0.self_attn.q_norm.weight": torch.ones(5)}
    for bad, name in [(missing, "missing: model.layers.1.mlp.up_proj.weight"),
                      (extra, "unexpected: model.layers.9.foo.weight"),
                      (shaped, r"mis-shaped: model.layers.0.self_attn.q_norm.weight \(5,\)")]:
        with pytest.raises(WeightUpdateError, match=name):
            engine.update_weights(bad, version=1)
    with pytest.raises(WeightUpdateError, match="checksum"):
        engine.update_weights(good, version=1, checksum="0" * 32)
    assert engine.version == 0 and engine.weights_checksum() == before
    report = engine.update_weights(good.items(), version=2, checksum=weights_checksum(good))
    assert report["applied"] and engine.version == 2
    assert engine.weights_checksum() == weights_checksum(
        {k: v for k, v in good.items() if k != "lm_head.weight" or not engine.model.tied})


def test_tied_embeddings_accept_state_dicts_with_or_without_lm_head():
    hf = hf_model("qwen2", seed=3)  # tie_word_embeddings=True
    engine = make_engine(hf)
    state = hf.state_dict()
    assert "lm_head.weight" in state
    engine.update_weights(state, version=1)
    engine.update_weights({k: v for k, v in state.items() if k != "lm_head.weight"}, version=2)
    assert engine.version == 2
    prompt = list(range(3, 20))
    ref = hf_logits(hf, prompt[:1], prompt[1:])
    assert (engine.runner.score(prompt)[:-1] - ref).abs().max() <= 1e-4


def test_checksum_is_deterministic_and_sensitive():
    a = {"x": torch.arange(6.0).reshape(2, 3), "y": torch.ones(4)}
    same = [("y", torch.ones(4, dtype=torch.bfloat16)), ("x", torch.arange(6.0).reshape(2, 3))]
    assert weights_checksum(a) == weights_checksum(same)
    changed = {**a, "y": torch.tensor([1.0, 1.0, 1.0, 1.0001])}
    assert weights_checksum(a) != weights_checksum(changed)
    assert weights_checksum(a) != weights_checksum({"x": a["x"].reshape(3, 2), "y": a["y"]})


def test_abort_mode_resumes_each_sample_of_a_group_under_its_request_id(models):
    start, trained = models
    engine = make_engine(start)
    params = SamplingParams(n=3, max_tokens=8, seed=2, ignore_eos=True)
    rid = engine.add_request(PROMPTS[2], params, "grp", group_id=5, prompt_id=17)
    engine.step()
    engine.step()
    engine.update_weights(trained.state_dict(), version=1, mode="abort")
    partials = engine.step()
    assert sorted(r.sample_index for r in partials) == [0, 1, 2]
    single = SamplingParams(n=1, max_tokens=8, seed=2, ignore_eos=True)
    for r in partials:  # as the runtime does it: each sample resumed on its own, same id
        engine.add_request(PROMPTS[2], single, request_id=rid, resume=r)
    with pytest.raises(Exception, match="already running"):
        engine.add_request(PROMPTS[2], single, request_id=rid, resume=partials[0])
    done = sorted(run_all(engine), key=lambda r: r.sample_index)
    assert [(r.request_id, r.sample_index, r.group_id, r.prompt_id) for r in done] == [
        ("grp", i, 5, 17) for i in range(3)]
    assert all(r.versions.tolist() == [0, 0] + [1] * 6 for r in done)
    assert len({tuple(r.completion_ids) for r in done}) == 3


def test_drain_applies_when_the_last_running_request_finishes(models):
    start, trained = models
    engine = make_engine(start)
    engine.add_request([3, 4, 5], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()
    assert engine.update_weights(trained.state_dict(), version=1, mode="drain")["pending"]
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    assert steps == 3 and engine.version == 1  # swapped in the step that emptied the batch
    idle = make_engine(start)  # nothing running: a drain applies at once
    assert idle.update_weights(trained.state_dict(), version=4, mode="drain")["applied"]
    assert idle.version == 4

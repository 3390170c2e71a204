"""The built-in engine against transformers on smollm2-135m-instruct (30 layers, 9 query / 3 KV
heads, tied embeddings, a 49k BPE vocabulary): per-token log-probs within a derived float32
bound, identical greedy tokens, top-k/top-p masks, in-flight weight updates, abort and resume,
and a parked-KV continuation through the chat template."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.engine.engine_testlib import LogitsRecorder
from tests.engine.test_parity import kept_set
from tests.real_model.real_testlib import QUESTIONS, chat_ids, float32_bounds, hf_logprobs
from tokenflow.engine import Engine, EngineConfig, SamplingParams, weights_checksum
from tokenflow.envs import ChatBridge

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


def _engine(path, **kw) -> Engine:
    return Engine(path, EngineConfig(device="cpu", dtype="float32", threads=1, seed=0, **kw))


def _check_close(hf, prompt, r, logits, what: str, report: dict | None = None) -> torch.Tensor:
    """The engine's logits and log-probs of rollout ``r`` against transformers' (float32);
    transformers' logits."""
    ref_logits, ref_lp = hf_logprobs(hf, prompt, r.completion_ids)
    max_bound, rms_bound = float32_bounds(hf, ref_logits)
    diff = np.abs(r.logprobs - ref_lp.numpy())
    assert diff.max() <= max_bound, (what, diff.max(), max_bound)
    assert np.sqrt((diff ** 2).mean()) <= rms_bound, (what, np.sqrt((diff ** 2).mean()), rms_bound)
    logit_diff = (logits - ref_logits).abs().max().item()
    assert logit_diff <= max_bound / 2, (what, logit_diff)
    if report is not None:
        report["lp"] = max(report.get("lp", 0.0), float(diff.max()))
        report["lp_rms"] = max(report.get("lp_rms", 0.0), float(np.sqrt((diff ** 2).mean())))
        report["logit"] = max(report.get("logit", 0.0), logit_diff)
        report["bound"] = max_bound
    return ref_logits


def test_greedy_tokens_and_logprobs_match_transformers(engine, hf_smollm2, tokenizer):
    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS]
    rec = LogitsRecorder()
    engine.logits_hook = rec
    try:
        groups = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
    finally:
        engine.logits_hook = None
    report: dict = {}
    for prompt, (r,) in zip(prompts, groups):
        assert r.num_tokens == 64
        logits = rec.of(r)
        ref_logits = _check_close(hf_smollm2, prompt, r, logits, "greedy", report)
        # Greedy: every token is transformers' argmax given the same prefix (teacher-forced).
        assert r.completion_ids.tolist() == ref_logits.argmax(-1).tolist()
    # and transformers' own greedy generate() on one prompt, token for token
    # (the attention mask given: the pad token is <|im_end|>, which the prompt holds, and
    # generate() would mask it out otherwise)
    ids = torch.tensor([prompts[0]])
    with torch.no_grad():
        out = hf_smollm2.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, do_sample=False,
                                  eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    assert out[0, len(prompts[0]):].tolist() == groups[0][0].completion_ids.tolist()
    assert tokenizer.decode(groups[0][0].completion_ids).startswith("17 + 25 = 32")
    print(f"8 prompts x 64 greedy tokens: max |Δ logprob| {report['lp']:.2e} (RMS {report['lp_rms']:.2e}), "
          f"max |Δ logit| {report['logit']:.2e}; bound {report['bound']:.2e}")


def test_top_k_top_p_masks_on_the_real_vocabulary(engine, hf_smollm2, tokenizer):
    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS[:3]]
    params = [SamplingParams(temperature=0.8, top_k=40, top_p=0.9, n=2, max_tokens=16, seed=5, ignore_eos=True),
              SamplingParams(temperature=1.0, top_p=0.7, n=2, max_tokens=16, seed=6, ignore_eos=True),
              SamplingParams(temperature=1.2, top_k=5, n=2, max_tokens=16, seed=7, ignore_eos=True)]
    rec = LogitsRecorder()
    engine.logits_hook = rec
    try:
        groups = engine.generate(prompts, params)
    finally:
        engine.logits_hook = None
    for prompt, sp, group in zip(prompts, params, groups):
        for r in group:
            mine = rec.of(r)
            ref_logits, _ = hf_logprobs(hf_smollm2, prompt, r.completion_ids)
            max_bound, _ = float32_bounds(hf_smollm2, ref_logits)
            assert (mine - ref_logits).abs().max().item() <= max_bound / 2
            full = torch.log_softmax(mine.double() / sp.temperature, -1)
            assert len(r.support) == r.num_tokens
            for t in range(r.num_tokens):
                kept = kept_set(mine[t], sp.temperature, sp.top_k, sp.top_p)
                assert r.support[t].tolist() == kept
                assert int(r.completion_ids[t]) in kept
                if sp.top_k:
                    assert len(kept) <= sp.top_k
                logmass = torch.logsumexp(full[t, kept], 0).item()
                assert abs(r.support_logmass[t] - logmass) <= 1e-5
                assert abs(r.logprobs[t] - (full[t, int(r.completion_ids[t])].item() - logmass)) <= 1e-5


@pytest.fixture(scope="module")
def perturbed(hf_smollm2):
    """transformers' model with every weight scaled by (1 + 0.05·noise): another policy."""
    gen = torch.Generator().manual_seed(0)
    model = copy.deepcopy(hf_smollm2)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + 0.05 * torch.randn(p.shape, generator=gen))
    return model.eval()


def test_an_inflight_update_tags_new_tokens_and_they_follow_the_new_weights(smollm2, hf_smollm2, perturbed,
                                                                             tokenizer):
    engine = _engine(smollm2)
    rec = LogitsRecorder()
    engine.logits_hook = rec
    prompts = {f"r{i}": chat_ids(tokenizer, q) for i, q in enumerate(QUESTIONS[:2])}
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=3, ignore_eos=True)
    for rid, p in prompts.items():
        engine.add_request(p, params, rid)
    out = [r for _ in range(5) for r in engine.step()]
    new = perturbed.state_dict()
    report = engine.update_weights(new, version=1, mode="inflight", recompute_kv=True)
    assert report["applied"] and report["recomputed"] == 2 and engine.version == 1
    # the engine holds the tied head once, as the embedding
    assert engine.weights_checksum() == weights_checksum({k: v for k, v in new.items() if k != "lm_head.weight"})
    prompts["late"] = chat_ids(tokenizer, QUESTIONS[2])
    engine.add_request(prompts["late"], params, "late")  # wholly after the update
    while engine.has_unfinished():
        out += engine.step()
    assert sorted(r.request_id for r in out) == ["late", "r0", "r1"]
    for r in out:
        prompt, v = prompts[r.request_id], r.versions
        assert r.num_tokens == 12 and (np.diff(v) >= 0).all() and set(v) <= {0, 1}
        after = v == 1
        assert after.any() and (r.request_id == "late") == after.all()
        logits = rec.of(r)
        for model, mask, what in ((perturbed, after, "new"), (hf_smollm2, ~after, "old")):
            if not mask.any():
                continue
            ref_logits, ref_lp = hf_logprobs(model, prompt, r.completion_ids)
            max_bound, _ = float32_bounds(model, ref_logits)
            # KV recomputed under the new weights: the new tokens are the new policy's exactly
            assert (logits[mask] - ref_logits[mask]).abs().max().item() <= max_bound / 2, (r.request_id, what)
            assert np.abs(r.logprobs[mask] - ref_lp.numpy()[mask]).max() <= max_bound, (r.request_id, what)
    engine.close()


def test_abort_then_resume_continues_under_the_new_weights(smollm2, hf_smollm2, perturbed, tokenizer):
    engine = _engine(smollm2)
    prompt = chat_ids(tokenizer, QUESTIONS[3])
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=14, seed=4, ignore_eos=True)
    rid = engine.add_request(prompt, params)
    for _ in range(5):
        assert engine.step() == []
    report = engine.update_weights(perturbed.state_dict(), version=2, mode="abort")
    assert report["aborted"] == 1 and engine.version == 2
    (partial,) = engine.step()
    assert partial.finish_reason == "abort" and partial.num_tokens == 5 and partial.versions.tolist() == [0] * 5
    engine.add_request(prompt, params, request_id=rid, resume=partial)
    (full,) = list(engine.stream())
    assert full.finish_reason == "length" and full.num_tokens == 14
    assert full.completion_ids[:5].tolist() == partial.completion_ids.tolist()
    assert np.array_equal(full.logprobs[:5], partial.logprobs)
    assert full.versions.tolist() == [0] * 5 + [2] * 9
    # The resumed tokens are the new policy's: its untruncated log-probs, from a whole prefill.
    ref_logits, ref_lp = hf_logprobs(perturbed, prompt, full.completion_ids)
    max_bound, _ = float32_bounds(perturbed, ref_logits)
    assert np.abs(full.full_logprobs[5:] - ref_lp.numpy()[5:]).max() <= max_bound
    engine.close()


def test_a_parked_continuation_through_the_chat_template_matches_a_whole_prefill(engine, smollm2, hf_smollm2,
                                                                                tokenizer):
    bridge = ChatBridge(tokenizer)
    assert bridge.turn_end_ids == (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    prompt = chat_ids(tokenizer, "What is 17 + 25?")
    env = bridge.environment_ids([{"role": "user", "content": "And what is 3 times 4?"}])
    first = SamplingParams(temperature=0.0, max_tokens=24, park_kv=True, stop_token_ids=bridge.turn_end_ids)

    def episode(e):
        e.add_request(prompt, first, request_id="ep")
        (r,) = list(e.stream())
        assert r.finish_reason == "stop" and int(r.completion_ids[-1]) in bridge.turn_end_ids
        r = r.append_environment(env)
        e.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=r.num_tokens + 24, park_kv=True,
                                             stop_token_ids=bridge.turn_end_ids), resume=r)
        (r2,) = list(e.stream())
        return r, r2

    before = engine.stats.parked_hits, engine.stats.reused_prefix_tokens
    rec = LogitsRecorder()
    engine.logits_hook = rec
    try:
        turn1, parked = episode(engine)
    finally:
        engine.logits_hook = None
    assert engine.stats.parked_hits - before[0] == 1
    # the whole first turn but its last token came from the parked cache
    assert engine.stats.reused_prefix_tokens - before[1] == len(prompt) + turn1.num_tokens - len(env) - 1
    whole_engine = _engine(smollm2, max_parked=0)
    _, whole = episode(whole_engine)
    whole_engine.close()
    assert whole_engine.stats.parked_hits == 0
    assert parked.completion_ids.tolist() == whole.completion_ids.tolist()
    generated = parked.loss_mask == 1
    assert parked.loss_mask.tolist() == [1] * (turn1.num_tokens - len(env)) + [0] * len(env) + \
        [1] * (parked.num_tokens - turn1.num_tokens)
    # the model's second answer, through the template
    assert "12" in tokenizer.decode(parked.completion_ids[turn1.num_tokens:])
    ref_logits, ref_lp = hf_logprobs(hf_smollm2, prompt, parked.completion_ids)
    max_bound, _ = float32_bounds(hf_smollm2, ref_logits)
    assert (rec.of(parked) - ref_logits[generated]).abs().max().item() <= max_bound / 2
    assert np.abs(parked.logprobs[generated] - ref_lp.numpy()[generated]).max() <= max_bound
    assert np.abs(parked.logprobs - whole.logprobs).max() <= max_bound

"""Multi-turn continuation in the built-in engine: parked KV reuse, offsets past a sliding window,
eviction, when parked caches are dropped, and what is refused. (What every backend must do is in
test_conformance.py.)"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.engine.engine_testlib import FAMILIES, LogitsRecorder, hf_logits, hf_model, make_engine
from tests.engine.moe_testlib import moe_hf_model
from tokenflow.engine import InvalidRequest, SamplingParams
from tokenflow.engine.builtin.sampler import counter_uniform

PROMPT = list(range(10, 22))
ENV = ([5, 6, 7], [8, 9])
FIRST = SamplingParams(temperature=1.0, max_tokens=6, seed=3, ignore_eos=True, park_kv=True)


def first_turn(engine, prompt=PROMPT, params=FIRST, request_id="ep"):
    engine.add_request(prompt, params, request_id=request_id)
    (r,) = list(engine.stream())
    return r


def next_turn(engine, r, env, per_turn=5, **changes):
    """Append ``env`` and continue for ``per_turn`` more tokens; returns the extended rollout."""
    r = r.append_environment(env)
    params = dataclasses.replace(FIRST, max_tokens=r.num_tokens + per_turn, **changes)
    engine.add_request(r.prompt_ids.tolist(), params, resume=r)
    (out,) = list(engine.stream())
    return out


def episode(engine, prompt=PROMPT, request_id="ep"):
    """Three model turns; between turns another request overwrites the freed cache slot, as
    other work does in a running engine (a parked cache must not rely on the slot's leftovers)."""
    r = first_turn(engine, prompt, request_id=request_id)
    for env in ENV:
        engine.generate([list(range(60, 80))], SamplingParams(max_tokens=20, seed=9, ignore_eos=True))
        r = next_turn(engine, r, env)
    return r


def float32_logprob_bound(hf, logits: torch.Tensor, temperature: float = 1.0) -> float:
    """How far two float32 computations of the same log-probs may sit apart (parked keys come
    from the earlier turn's decode steps, a full prefill recomputes them in one pass).

    As in test_parity's bfloat16 bound with float32's u = 2⁻²⁴: about 23 roundings per decoder
    layer and 5 around them, each moving a logit by at most u·m (m the largest logit), put each
    run within n·u·m of the exact logits, two runs within 2·n·u·m of each other; a log-softmax
    at temperature T moves at most twice the logit error, over T."""
    n = 23 * hf.config.num_hidden_layers + 5
    return 2 * 2 * n * 2.0**-24 * logits.abs().max().item() / temperature


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_parked_continuation_prefills_only_new_tokens_and_matches_a_full_prefill(family):
    """qwen2 and mistral have an 8-token window: the turns start at offsets 17 and 25, past it."""
    hf = hf_model(family, seed=1)
    runs = {}
    for max_parked in (None, 0):
        engine = make_engine(hf, max_parked=max_parked)
        rec = LogitsRecorder()
        engine.logits_hook = rec
        r = episode(engine)
        runs[max_parked] = (r, rec.of(r), engine.stats)
    (parked, logits, st), (whole, whole_logits, st0) = runs[None], runs[0]

    assert parked.completion_ids.tolist() == whole.completion_ids.tolist()
    assert parked.loss_mask.tolist() == [1] * 6 + [0] * 3 + [1] * 5 + [0] * 2 + [1] * 5
    assert parked.turns.tolist() == [0] * 9 + [1] * 7 + [2] * 5
    bound = float32_logprob_bound(hf, whole_logits)
    assert np.abs(parked.logprobs - whole.logprobs).max() <= bound
    assert np.all(parked.logprobs[parked.loss_mask == 0] == 0)
    # Both are the model: transformers' logits on the whole sequence, at every generated token.
    ref = hf_logits(hf, PROMPT, parked.completion_ids)[parked.loss_mask == 1]
    assert (logits - ref).abs().max().item() <= 1e-4
    assert (whole_logits - ref).abs().max().item() <= 1e-4

    # Turn 1 reuses prompt + 6 tokens − 1 (17), turn 2 prompt + 14 − 1 (25); each prefills the
    # last sampled token and the environment tokens.
    assert (st.parked_hits, st.parked_misses, st.reused_prefix_tokens) == (2, 0, 17 + 25)
    other = 2 * 20  # the interleaved requests' prompts
    assert st.prefill_tokens == other + len(PROMPT) + (1 + 3) + (1 + 2)
    assert (st0.parked_hits, st0.parked_misses, st0.reused_prefix_tokens) == (0, 2, 0)
    assert st0.prefill_tokens == other + len(PROMPT) + (len(PROMPT) + 9) + (len(PROMPT) + 16)


@pytest.mark.slow
def test_new_tokens_follow_the_counter_stream_at_their_completion_position():
    """What the sampler guarantees: completion token j draws u = hash(seed, sample index, j), so
    the continuation's tokens are fixed by the seed and their position in the completion (not by
    a count of tokens generated in this turn, nor by how the prefix was computed)."""
    engine = make_engine(hf_model("llama", seed=2))
    rec = LogitsRecorder()
    engine.logits_hook = rec
    r = episode(engine)
    generated = np.flatnonzero(r.loss_mask)
    logits = rec.of(r)
    seed = torch.tensor([r.info["seed"]] * len(generated))
    u = counter_uniform(seed, torch.full_like(seed, r.sample_index), torch.as_tensor(generated))
    e = torch.exp(logits - logits.amax(1, keepdim=True))
    cdf = e.cumsum(1)
    expected = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    assert r.completion_ids[generated].tolist() == expected.tolist()


@pytest.mark.slow
def test_continuations_of_different_offsets_share_one_extend_and_fresh_prompts_prefill_apart():
    hf = hf_model("qwen2", seed=3)
    engine = make_engine(hf)
    rec = LogitsRecorder()
    engine.logits_hook = rec
    prompts = {"a": PROMPT, "b": list(range(30, 35)), "c": list(range(40, 61))}
    firsts = {rid: first_turn(engine, p, request_id=rid) for rid, p in prompts.items()}
    rec.kinds.clear()
    envs = {"a": [5], "b": [6, 7, 8, 9, 10, 11, 12], "c": [13, 14]}
    for rid, r in firsts.items():
        r = r.append_environment(envs[rid])
        engine.add_request(prompts[rid], dataclasses.replace(FIRST, max_tokens=r.num_tokens + 4), resume=r)
    engine.add_request([3, 4, 5, 6], SamplingParams(max_tokens=4, seed=1, ignore_eos=True), request_id="fresh")
    done = {r.request_id: r for r in engine.stream()}
    assert rec.kinds[:2] == [("prefill", 3), ("prefill", 1)]  # three offsets together, then the fresh one
    assert engine.stats.parked_hits == 3
    for rid, r in done.items():
        prompt = prompts.get(rid, [3, 4, 5, 6])
        ref = hf_logits(hf, prompt, r.completion_ids)[r.loss_mask == 1]
        assert (rec.of(r) - ref).abs().max().item() <= 1e-4, rid


def test_an_extend_near_the_context_end_beside_a_row_with_more_new_tokens():
    """Row a's padding would run past the context (max_model_len 32) if it took positions
    offset + j like its real tokens."""
    hf = hf_model("llama", seed=8)
    engine = make_engine(hf, max_model_len=32)
    rec = LogitsRecorder()
    engine.logits_hook = rec
    a = first_turn(engine, list(range(10, 34)), request_id="a")  # 24 + 6 (+ 1 environment) = 31 tokens
    b = first_turn(engine, [3, 4, 5], request_id="b")
    for r, env in ((a, []), (b, list(range(40, 50)))):
        r = r.append_environment(env or [7])
        engine.add_request(r.prompt_ids.tolist(), dataclasses.replace(FIRST, max_tokens=r.num_tokens + 3), resume=r)
    done = {r.request_id: r for r in engine.stream()}
    assert engine.stats.parked_hits == 2 and done["a"].finish_reason == "length"
    for r in done.values():
        ref = hf_logits(hf, r.prompt_ids.tolist(), r.completion_ids)[r.loss_mask == 1]
        assert (rec.of(r) - ref).abs().max().item() <= 1e-4


@pytest.mark.slow
def test_eviction_falls_back_to_a_full_prefill():
    hf = hf_model("mistral", seed=4)
    engine = make_engine(hf, max_parked=1)
    a = first_turn(engine, request_id="a")
    b = first_turn(engine, list(range(40, 50)), request_id="b")  # parks b, evicting a
    assert len(engine.runner.parked) == 1 and ("b", 0) in engine.runner.parked
    a2 = next_turn(engine, a, [5, 6], park_kv=False)  # parking it would evict b in turn
    assert (engine.stats.parked_hits, engine.stats.parked_misses) == (0, 1)
    b2 = next_turn(engine, b, [5, 6])
    assert (engine.stats.parked_hits, engine.stats.parked_misses) == (1, 1)
    reference = make_engine(hf, max_parked=0)
    ra = next_turn(reference, first_turn(reference, request_id="a"), [5, 6])
    rb = next_turn(reference, first_turn(reference, list(range(40, 50)), request_id="b"), [5, 6])
    assert a2.completion_ids.tolist() == ra.completion_ids.tolist()
    assert b2.completion_ids.tolist() == rb.completion_ids.tolist()
    assert np.abs(a2.logprobs - ra.logprobs).max() == 0  # both prefilled whole: the same arithmetic
    assert np.abs(b2.logprobs - rb.logprobs).max() <= 1e-4


@pytest.mark.slow
def test_parked_caches_are_dropped_on_admission_abort_and_kv_recompute():
    hf = hf_model("llama", seed=5)
    engine = make_engine(hf)
    parked = engine.runner.parked
    r = first_turn(engine)
    assert ("ep", 0) in parked and parked.nbytes() > 0
    next_turn(engine, r, [5], park_kv=False)  # admitted: its entry is used up; not parked again
    assert len(parked) == 0
    first_turn(engine, request_id="x")
    first_turn(engine, request_id="y")
    assert engine.abort("x") == 0 and ("x", 0) not in parked and ("y", 0) in parked
    weights = hf.state_dict()
    engine.update_weights(weights, 1, mode="inflight")  # keys kept, like running sequences'
    engine.update_weights(weights, 2, mode="abort")
    engine.update_weights(weights, 3, mode="drain")
    assert ("y", 0) in parked
    engine.update_weights(weights, 4, mode="inflight", recompute_kv=True)
    assert len(parked) == 0


@pytest.mark.slow
def test_a_continuation_whose_tokens_differ_from_the_parked_ones_prefills_whole():
    hf = hf_model("llama", seed=6)
    engine = make_engine(hf)
    r = first_turn(engine)
    edited = dataclasses.replace(r, completion_ids=np.r_[r.completion_ids[:-2], [3, 3]])
    out = next_turn(engine, edited, [5])
    assert (engine.stats.parked_hits, engine.stats.parked_misses) == (0, 1)
    ref = make_engine(hf, max_parked=0)
    assert out.completion_ids.tolist() == next_turn(ref, edited, [5]).completion_ids.tolist()


@pytest.mark.slow
def test_moe_continuation_uses_parked_kv_and_records_no_routing():
    hf = moe_hf_model("qwen3_moe", seed=1)
    engine = make_engine(hf)
    rec = LogitsRecorder()
    engine.logits_hook = rec
    r = first_turn(engine)
    assert r.routed_experts is not None and r.routed_experts.shape[0] == len(PROMPT) + 5
    out = next_turn(engine, r, [5, 6])
    assert engine.stats.parked_hits == 1 and out.routed_experts is None
    ref = hf_logits(hf, PROMPT, out.completion_ids)[out.loss_mask == 1]
    assert (rec.of(out) - ref).abs().max().item() <= 1e-4


def test_bad_continuations_are_refused():
    engine = make_engine(hf_model("llama", seed=7))
    r = first_turn(engine)
    cont = r.append_environment([5])
    with pytest.raises(InvalidRequest, match="n must be 1"):
        engine.add_request(PROMPT, dataclasses.replace(FIRST, n=2, max_tokens=20), resume=cont)
    with pytest.raises(InvalidRequest, match="environment tokens"):  # finished, last token generated
        engine.add_request(PROMPT, dataclasses.replace(FIRST, max_tokens=20), resume=r)
    with pytest.raises(InvalidRequest, match="bounds the whole completion"):
        engine.add_request(PROMPT, dataclasses.replace(FIRST, max_tokens=cont.num_tokens), resume=cont)
    with pytest.raises(InvalidRequest, match="prompt_ids differ"):
        engine.add_request(PROMPT[1:], dataclasses.replace(FIRST, max_tokens=20), resume=cont)
    assert not engine.has_unfinished() and ("ep", 0) in engine.runner.parked

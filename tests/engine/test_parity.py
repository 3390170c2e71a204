"""Logit and log-prob parity with transformers, for each family, inside a continuous batch."""

from __future__ import annotations

import pytest
import torch

from tests.engine.engine_testlib import (
    FAMILIES,
    LogitsRecorder,
    hf_logits,
    hf_model,
    make_engine,
)
from tokenflow.engine import SamplingParams


def kept_set(row: torch.Tensor, temp: float, top_k: int, top_p: float) -> list[int]:
    """The support the engine must record: top-k, then top-p on the renormalised top-k."""
    p = torch.softmax(row.double() / temp, -1)
    order = torch.argsort(p, descending=True)
    kept = order[:top_k] if top_k else order
    q = p[kept] / p[kept].sum()
    return sorted(kept[(torch.cumsum(q, 0) - q) < top_p].tolist())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_logits_and_logprobs_match_transformers(family):
    hf = hf_model(family, seed=1)
    # 5 slots for 9 samples: requests wait, join when others leave, and slots get moved.
    engine = make_engine(hf, max_num_seqs=5)
    rec = LogitsRecorder()
    engine.logits_hook = rec

    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (5, 11, 8, 17)]
    params = [
        SamplingParams(temperature=0.7, n=3, max_tokens=9, ignore_eos=True, seed=1),
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=12, top_p=0.9, n=2, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=1.3, top_p=0.7, n=3, max_tokens=4, ignore_eos=True),
    ]
    # Prefill logits over a whole prompt, without the cache.
    ref = hf_logits(hf, prompts[3][:1], prompts[3][1:])
    assert (engine.runner.score(prompts[3])[:-1] - ref).abs().max().item() <= 1e-4

    results = engine.generate(prompts, params)
    assert [len(r) for r in results] == [3, 1, 2, 3]
    assert max(n for kind, n in rec.kinds if kind == "decode") == 5
    assert ("prefill", 3) in rec.kinds[2:]  # a later request joined a running batch

    for prompt, sp, group in zip(prompts, params, results):
        temp = sp.temperature or 1.0
        for r in group:
            assert r.num_tokens == sp.max_tokens and r.finish_reason == "length"
            ref = hf_logits(hf, prompt, r.completion_ids)
            mine = rec.of(r)
            assert (mine - ref).abs().max().item() <= 1e-4  # the model: parity with transformers
            # The log-prob definition, exactly, on the logits the engine drew from (transformers'
            # logits differ by float32 noise, which log-softmax may double).
            full = torch.log_softmax(mine.double() / temp, -1)
            tokens = torch.as_tensor(r.completion_ids, dtype=torch.long)
            full_lp = full.gather(1, tokens[:, None])[:, 0].numpy()
            if sp.truncates:
                assert r.support is not None and len(r.support) == r.num_tokens
                for t in range(r.num_tokens):
                    kept = kept_set(mine[t], temp, sp.top_k, sp.top_p)
                    assert r.support[t].tolist() == kept
                    logmass = torch.logsumexp(full[t, kept], 0).item()
                    assert abs(r.support_logmass[t] - logmass) <= 1e-5
                    assert abs(r.logprobs[t] - (full_lp[t] - logmass)) <= 1e-5
            else:
                assert r.support is None and (r.support_logmass == 0).all()
                assert abs(r.logprobs - full_lp).max() <= 1e-5
            if sp.greedy:
                assert r.completion_ids.tolist() == ref.argmax(-1).tolist()


def bf16_error_bounds(hf, f32: torch.Tensor) -> tuple[float, float]:
    """How far bfloat16 logits may sit from float32 ones: (RMS bound, max bound).

    bfloat16 keeps 8 significand bits, so each rounding moves a value by at most u = 2⁻⁸ of
    itself. Along the path to a logit the engine rounds about 23 times per decoder layer (norm
    output and its scale; weights and output of q/k/v, o, gate/up and down projections; q/k
    norms; rotary; scores, softmax, P·V; SiLU and product; two residual adds) and 5 more around
    them (embedding, final norm, output head). With the largest float32 logit m as the scale of
    the values rounded, n roundings move a logit by at most n·u·m (first order, every error
    pushing the same way), and, as independent errors of mean 0 and variance ≤ u²/3, by
    √(n/3)·u·m in root mean square.
    """
    n = 23 * hf.config.num_hidden_layers + 5
    scale = 2.0 ** -8 * f32.abs().max().item()
    return (n / 3) ** 0.5 * scale, n * scale

def assert_bf16_close(bf16: torch.Tensor, f32: torch.Tensor, hf) -> None:
    rms_bound, max_bound = bf16_error_bounds(hf, f32)
    err = bf16 - f32
    assert err.pow(2).mean().sqrt().item() <= rms_bound, (err.pow(2).mean().sqrt().item(), rms_bound)
    assert err.abs().max().item() <= max_bound, (err.abs().max().item(), max_bound)
    # Where float32's best logit leads the runner-up by more than twice the largest error, no
    # bfloat16 rounding can change which token is greedy.
    top2 = f32.topk(2, -1).values
    sure = (top2[:, 0] - top2[:, 1]) > 2 * max_bound
    assert (bf16.argmax(-1) == f32.argmax(-1))[sure].all()


def test_bfloat16_runs_close_to_float32():
    hf = hf_model("qwen3", seed=2)
    prompt = list(range(10, 30))
    f32 = make_engine(hf, dtype="float32").runner.score(prompt)
    bf16 = make_engine(hf, dtype="bfloat16").runner.score(prompt)
    assert bf16.dtype == torch.float32  # logits are handed to the sampler in float32
    assert_bf16_close(bf16, f32, hf)


def test_bfloat16_decodes_with_the_cache():
    hf = hf_model("llama", seed=4)
    engine = make_engine(hf, dtype="bfloat16")
    rec = LogitsRecorder()
    engine.logits_hook = rec
    out = engine.generate([[5, 6, 7], list(range(10, 25))], SamplingParams(n=2, max_tokens=8, ignore_eos=True))
    for group, prompt in zip(out, [[5, 6, 7], list(range(10, 25))]):
        for r in group:
            assert r.num_tokens == 8 and (r.logprobs <= 0).all() and r.logprobs.min() > -30
            ref = hf_logits(hf, prompt, r.completion_ids)  # float32 transformers
            assert_bf16_close(rec.of(r), ref, hf)

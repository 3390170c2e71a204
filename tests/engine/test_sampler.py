"""Sampler: log-prob definitions, kept supports, distribution and batch invariance (no model)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tokenflow.engine import InvalidRequest, SamplingParams
from tokenflow.engine.builtin.sampler import Sampler, SamplingBatch, counter_uniform
from tokenflow.engine.builtin.sequence import Sequence

V = 50


def seqs_for(params_list, seeds=None, steps=None):
    out = []
    for i, p in enumerate(params_list):
        seed = seeds[i] if seeds else 123
        prompt = [1, 2, 3]
        completion = [4] * (steps[i] if steps else 0)
        out.append(Sequence(f"r{i}", 0, p, seed, prompt, prompt + completion, frozenset()))
    return out


def sample(logits, params_list, **kw):
    seqs = seqs_for(params_list, **kw)
    return Sampler()(logits, SamplingBatch.from_seqs(seqs, torch.device("cpu")))


def expected_support(logits_row: torch.Tensor, temp: float, top_k: int, top_p: float) -> set[int]:
    p = torch.softmax(logits_row.double() / temp, -1).numpy()
    order = np.argsort(-p)
    kept = order[:top_k] if top_k else order
    q = p[kept] / p[kept].sum()
    before = np.cumsum(q) - q
    return set(kept[before < top_p].tolist())


def test_bfloat16_logits_at_unit_temperature_sample_exactly_as_their_float32_copy_divided():
    # A decode step hands its logits over in bfloat16 and rows at T = 1 (or greedy) skip the
    # division: tokens, log-probs, kept mass and supports must be bitwise those of the float32
    # logits divided by their temperatures (the path every other batch takes).
    logits = (torch.randn(6, 300, generator=torch.Generator().manual_seed(3)) * 4).to(torch.bfloat16)
    params = [SamplingParams(temperature=t, top_p=p, logprobs=3) for t, p in
              [(1.0, 1.0), (0.0, 1.0), (1.0, 0.7), (1.0, 1.0), (0.0, 1.0), (1.0, 0.9)]]
    seqs = seqs_for(params, seeds=list(range(6)))
    batch = SamplingBatch.from_seqs(seqs, torch.device("cpu"))
    assert batch.unit_temperature
    fast = Sampler()(logits, batch)
    batch.unit_temperature = False
    slow = Sampler()(logits.float(), batch)
    assert fast.tokens == slow.tokens and fast.logprobs == slow.logprobs and fast.logmass == slow.logmass
    assert all((a is None and b is None) or np.array_equal(a, b) for a, b in zip(fast.support, slow.support))
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(fast.top, slow.top))
    assert not SamplingBatch.from_seqs(seqs_for([SamplingParams(temperature=0.7)]), torch.device("cpu")).unit_temperature


def test_counter_uniform_is_a_pure_function_and_uniform():
    n = 20000
    seed = torch.full((n,), 7, dtype=torch.int64)
    idx = torch.zeros(n, dtype=torch.int64)
    step = torch.arange(n)
    u = counter_uniform(seed, idx, step)
    assert torch.equal(u, counter_uniform(seed, idx, step))
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.003
    other = counter_uniform(seed, idx + 1, step)
    assert (u != other).float().mean() > 0.999
    big = counter_uniform(torch.tensor([2**62 + 5]), torch.tensor([3]), torch.tensor([9]))
    assert 0 <= big.item() < 1


def test_full_vocabulary_logprob_and_greedy():
    torch.manual_seed(0)
    logits = torch.randn(3, V) * 3
    params = [SamplingParams(temperature=0.7), SamplingParams(temperature=0), SamplingParams(temperature=1.3)]
    out = sample(logits, params)
    assert out.support is None and out.logmass == [0.0, 0.0, 0.0]
    assert out.tokens[1] == int(logits[1].argmax())
    for i, temp in enumerate([0.7, 1.0, 1.3]):  # greedy: T taken as 1
        ref = torch.log_softmax(logits[i] / temp, -1)[out.tokens[i]].item()
        assert out.logprobs[i] == pytest.approx(ref, abs=1e-6)


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.8), (10, 0.6), (1, 1.0)])
def test_truncated_support_logmass_and_logprob(top_k, top_p):
    torch.manual_seed(1)
    logits = torch.randn(4, V) * 2
    temp = 0.9
    params = [SamplingParams(temperature=temp, top_k=top_k, top_p=top_p)] * 3 + [SamplingParams()]
    out = sample(logits, params, seeds=[1, 2, 3, 4])
    assert out.support[3] is None and out.logmass[3] == 0.0
    for i in range(3):
        kept = expected_support(logits[i], temp, top_k, top_p)
        assert set(out.support[i].tolist()) == kept
        assert list(out.support[i]) == sorted(kept)
        assert out.tokens[i] in kept
        full = torch.log_softmax(logits[i] / temp, -1)
        logmass = torch.logsumexp(full[sorted(kept)], 0).item()
        assert out.logmass[i] == pytest.approx(logmass, abs=1e-6)
        assert out.logprobs[i] == pytest.approx(full[out.tokens[i]].item() - logmass, abs=1e-6)


def test_top_logprobs_are_the_sampled_distributions_most_likely_tokens():
    torch.manual_seed(3)
    logits = torch.randn(4, V) * 2
    params = [SamplingParams(temperature=0.9, top_k=5, logprobs=8), SamplingParams(temperature=0, logprobs=3),
              SamplingParams(temperature=1.2), SamplingParams(temperature=1.2, top_p=0.7, logprobs=2)]
    out = sample(logits, params, seeds=[1, 2, 3, 4])
    assert out.top[2] is None  # not asked
    for i, temp, n in [(0, 0.9, 8), (1, 1.0, 3), (3, 1.2, 2)]:
        ids, values = out.top[i]
        assert len(ids) == len(values) == n
        dist = torch.log_softmax(logits[i] / temp, -1) - out.logmass[i]
        if out.support is not None and out.support[i] is not None:  # cut tokens: -inf
            cut = torch.ones(V, dtype=torch.bool)
            cut[torch.as_tensor(out.support[i], dtype=torch.long)] = False
            dist = dist.masked_fill(cut, float("-inf"))
        want = dist.topk(n)
        assert ids.tolist() == want.indices.tolist()
        np.testing.assert_allclose(values, want.values.numpy(), atol=1e-6)
        if out.tokens[i] in ids.tolist():  # bit for bit the behaviour log-prob
            assert values[ids.tolist().index(out.tokens[i])] == np.float32(out.logprobs[i])
    assert np.isneginf(out.top[0][1][5:]).all()  # top-k 5 keeps five tokens of the eight asked for


def test_a_top_k_past_the_vocabulary_keeps_everything():
    torch.manual_seed(4)
    logits = torch.randn(2, V)
    huge = sample(logits, [SamplingParams(temperature=1.0, top_k=2**70)] * 2, seeds=[1, 2])
    plain = sample(logits, [SamplingParams(temperature=1.0)] * 2, seeds=[1, 2])
    assert huge.tokens == plain.tokens and huge.support is None and huge.logmass == [0.0, 0.0]


@pytest.mark.slow
def test_samples_follow_the_truncated_distribution():
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, 3.0, -2.0])
    n = 6000
    params = [SamplingParams(temperature=1.0, top_k=4)] * n
    out = sample(logits.expand(n, -1).clone(), params, seeds=list(range(n)))
    counts = np.bincount(out.tokens, minlength=8) / n
    p = torch.softmax(logits, -1).numpy()
    kept = [6, 0, 1, 2]
    want = np.zeros(8)
    want[kept] = p[kept] / p[kept].sum()
    assert np.abs(counts - want).max() < 0.025
    assert counts[[3, 4, 5, 7]].sum() == 0


def test_a_row_samples_the_same_whatever_else_is_in_the_batch():
    torch.manual_seed(2)
    logits = torch.randn(6, V)
    params = [SamplingParams(temperature=1.0, top_p=0.9)] * 6
    seeds = [10, 11, 12, 13, 14, 15]
    steps = [0, 1, 2, 3, 4, 5]
    together = sample(logits, params, seeds=seeds, steps=steps).tokens
    alone = [sample(logits[i:i + 1], params[i:i + 1], seeds=seeds[i:i + 1], steps=steps[i:i + 1]).tokens[0]
             for i in range(6)]
    assert together == alone
    shifted = sample(logits[[5, 0, 3]], [params[k] for k in (5, 0, 3)], seeds=[15, 10, 13], steps=[5, 0, 3]).tokens
    assert shifted == [together[5], together[0], together[3]]


@pytest.mark.parametrize("kwargs,field", [
    ({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"n": 0}, "n"), ({"max_tokens": 0}, "max_tokens"),
    ({"stop_token_ids": (3, 500)}, "stop_token_ids"), ({"stop": ("ab",)}, "tokenizer"),
    ({"logprobs": -1}, "logprobs"), ({"logprobs": 101}, "logprobs"),
])
def test_sampling_params_validation_names_the_field(kwargs, field):
    with pytest.raises(InvalidRequest, match=field):
        SamplingParams(**kwargs).validate(100, has_tokenizer=False)
    SamplingParams(top_p=1.0, temperature=0, top_k=5, stop_token_ids=(99,)).validate(100)

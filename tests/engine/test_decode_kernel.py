"""The compiled decode-attention kernel (engine.cpu_kernels): against attention computed in
float64 from the same inputs, within bounds derived from float32's and bfloat16's rounding; rows
read only their own positions; an engine on it matches transformers; and without a compiler the
engine says why and attends with PyTorch's operations."""

from __future__ import annotations

import logging

import pytest
import torch

from tokenflow.engine import SamplingParams
from tokenflow.engine.builtin import kernels
from tests.engine.engine_testlib import FAMILIES, U32, LogitsRecorder, hf_logits, hf_model, make_engine

BF16_HALF_ULP = 2.0**-8
"""bfloat16 keeps 8 significant bits: rounding to nearest moves a value by at most 2^-8 of it."""


def kernel_for(dtype, group, dim):
    fn, why = kernels.decode_attention_kernel(dtype, group, dim)
    assert fn is not None, why
    return fn


def reference(q, k_cache, v_cache, starts, ends, scale):
    """Attention in float64 over each row's positions [start, end): [B, KVH, G, D]."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(q.shape[0]):
        s, e = int(starts[b]), int(ends[b])
        keys, values = k_cache[b, :, s:e].double(), v_cache[b, :, s:e].double()
        probs = torch.softmax(q[b].double() @ keys.transpose(-1, -2) * scale, -1)
        out[b] = probs @ values
    return out


def error_bound(q, k_cache, v_cache, starts, ends, scale, want, dtype):
    """Per element, how far the kernel may be from `reference`. In float32 a score
    scale·Σ_d q_d·k_d summed in another order is off by at most D·u·scale·Σ|q_d·k_d| (γ_D), which
    moves each probability by that much relatively after the exponential, and the softmax's sum
    and the weighted sum of n rows add (n + 2)·u relatively: the output is off by at most
    (2·D·u·S + (n + 4)·u)·max|v|, S the largest scale·Σ|q·k| of the row. bfloat16 output adds one
    rounding of the float32 result (2^-8 of it)."""
    dim = q.shape[-1]
    bound = torch.zeros_like(want)
    for b in range(q.shape[0]):
        s, e = int(starts[b]), int(ends[b])
        keys, values = k_cache[b, :, s:e].double(), v_cache[b, :, s:e].double()
        spread = (q[b].double().abs() @ keys.abs().transpose(-1, -2) * scale).amax(-1, keepdim=True)
        vmax = values.abs().amax(dim=(-1, -2))[:, None, None]
        bound[b] = (2 * dim * U32 * spread + (e - s + 4) * U32) * vmax
    if dtype == torch.bfloat16:
        bound = bound * (1 + BF16_HALF_ULP) + BF16_HALF_ULP * want.abs()
    return bound


def case(dtype, batch, kv_heads, group, dim, capacity, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, kv_heads, group, dim, generator=gen).to(dtype)
    k_cache = (2 * torch.randn(batch + 2, kv_heads, capacity, dim, generator=gen)).to(dtype)
    v_cache = torch.randn(batch + 2, kv_heads, capacity, dim, generator=gen).to(dtype)
    ends = torch.randint(1, capacity + 1, (batch,), generator=gen)
    ends[0] = capacity
    starts = (ends - torch.randint(1, capacity, (batch,), generator=gen)).clamp_(min=0)
    starts[1] = 0
    return q, k_cache, v_cache, starts, ends


def new_rows(q, seed):
    """This step's keys and values, [B, KVH, D], as strided views (the kernel takes them so)."""
    gen = torch.Generator().manual_seed(seed)
    batch, kv_heads, _, dim = q.shape
    wide = torch.randn(batch, kv_heads, 2 * dim, generator=gen).to(q.dtype)
    return wide[..., :dim], wide[..., dim:]


def written(cache, new, ends):
    """The cache as the kernel leaves it: row b's new key/value at position ends[b] - 1."""
    cache = cache.clone()
    for b in range(new.shape[0]):
        cache[b, :, int(ends[b]) - 1] = new[b]
    return cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group,dim", [(1, 32), (3, 64), (4, 24), (7, 128), (8, 16), (2, 80), (16, 8)])
def test_kernel_matches_float64_attention(dtype, group, dim):
    q, k_cache, v_cache, starts, ends = case(dtype, 9, 2, group, dim, 37, seed=group * dim)
    k, v = new_rows(q, seed=dim)
    want_k, want_v = written(k_cache, k, ends), written(v_cache, v, ends)
    scale = dim**-0.5
    got = kernel_for(dtype, group, dim)(q, k_cache, v_cache, k, v, starts, ends, scale)
    assert got.dtype == dtype and got.shape == q.shape
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)  # the new rows, nothing else
    want = reference(q, k_cache, v_cache, starts, ends, scale)
    bound = error_bound(q, k_cache, v_cache, starts, ends, scale, want, dtype)
    excess = (got.double() - want).abs() - bound
    assert excess.max().item() <= 0, f"worst error {excess.max().item():.3g} past the bound"


def test_rows_read_only_their_own_positions():
    """Positions before a row's start and from its end on, and slots past the batch, hold NaN:
    nothing of them may reach the output."""
    q, k_cache, v_cache, starts, ends = case(torch.bfloat16, 6, 3, 3, 64, 20, seed=4)
    for cache in (k_cache, v_cache):
        cache[6:] = float("nan")
        for b in range(6):
            cache[b, :, : int(starts[b])] = float("nan")
            cache[b, :, int(ends[b]):] = float("nan")
    k, v = k_cache[torch.arange(6), :, ends - 1], v_cache[torch.arange(6), :, ends - 1]  # rewrite what is there
    got = kernel_for(torch.bfloat16, 3, 64)(q, k_cache, v_cache, k, v, starts, ends, 0.125)
    assert torch.isfinite(got).all()
    clean = [torch.nan_to_num(c, nan=0.0) for c in (k_cache, v_cache)]
    want = reference(q, *clean, starts, ends, 0.125)
    assert ((got.double() - want).abs() <= error_bound(q, *clean, starts, ends, 0.125, want, torch.bfloat16)).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_on_the_kernel_matches_transformers(family):
    """A straggler among short rows (each row's own length read) and, for qwen2/mistral, windows
    of 8 far shorter than the contexts (each windowed row's own start)."""
    hf = hf_model(family, seed=2)
    engine = make_engine(hf)
    assert engine.runner.attention_kernel is not None
    rec = LogitsRecorder()
    engine.logits_hook = rec
    gen = torch.Generator().manual_seed(5)
    prompts = {f"r{i}": torch.randint(3, 128, (4 + 3 * i,), generator=gen).tolist() for i in range(6)}
    for i, (rid, prompt) in enumerate(prompts.items()):
        engine.add_request(prompt, SamplingParams(temperature=1.0, max_tokens=10 + 8 * i, ignore_eos=True, seed=i),
                           request_id=rid)
    done = []
    while engine.has_unfinished():
        done += engine.step()
    assert len(done) == 6
    for r in done:
        ref = hf_logits(hf, prompts[r.request_id], r.completion_ids)
        # The bound of the engine's parity test: float32 noise, here summed in another order.
        assert (rec.of(r) - ref).abs().max().item() <= 1e-4, r.request_id


def test_without_a_compiler_the_engine_says_why_and_attends_with_torch(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("TOKENFLOW_CACHE", str(tmp_path))  # no build of the kernel there yet
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    hf = hf_model("llama", seed=1)
    with caplog.at_level(logging.WARNING):
        engine = make_engine(hf)
    assert engine.runner.attention_kernel is None
    assert "not the compiled kernel" in caplog.text and "no-such-compiler" in caplog.text
    out = engine.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert out[0][0].num_tokens == 4
    assert not list(tmp_path.glob("kernels/*.so"))


def test_a_kernel_refuses_calls_it_was_not_built_for_or_that_would_overrun():
    q, k_cache, v_cache, starts, ends = case(torch.float32, 2, 1, 3, 64, 5, seed=0)
    k, v = new_rows(q, seed=0)
    with pytest.raises(ValueError, match="another shape"):
        kernel_for(torch.float32, 4, 64)(q, k_cache, v_cache, k, v, starts, ends, 0.125)
    with pytest.raises(ValueError, match="rows end at positions"):  # a write past the cache: refused
        kernel_for(torch.float32, 3, 64)(q, k_cache, v_cache, k, v, starts, ends + 5, 0.125)
    kernel = kernel_for(torch.float32, 3, 64)  # what would make it read or write the wrong memory
    with pytest.raises(ValueError, match="one dtype"):
        kernel(q, k_cache.bfloat16(), v_cache, k, v, starts, ends, 0.125)
    with pytest.raises(ValueError, match="int64"):
        kernel(q, k_cache, v_cache, k, v, starts.int(), ends, 0.125)
    with pytest.raises(ValueError, match="kv heads and head dim"):
        kernel(q, k_cache[:, :, :, :32], v_cache, k, v, starts, ends, 0.125)


def test_unsupported_shapes_are_named():
    assert "head dim 20" in kernels.supports(torch.float32, 1, 20)
    assert "17 query heads" in kernels.supports(torch.bfloat16, 17, 64)
    assert "float16" in kernels.supports(torch.float16, 1, 64)
    assert kernels.supports(torch.bfloat16, 16, 256) is None


def test_switched_off_nothing_is_built(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENFLOW_CACHE", str(tmp_path))
    engine = make_engine(hf_model("llama", seed=1), cpu_kernels=False)
    assert engine.runner.attention_kernel is None
    assert not (tmp_path / "kernels").exists()


def test_a_killed_builds_temporary_file_is_removed_by_the_next_build(monkeypatch, tmp_path):
    """A process killed mid-build leaves ``.build-*.so`` behind; the next build removes any older
    than a build may take (a newer one may belong to a build still running)."""
    import os
    import time

    from tokenflow.engine.builtin.kernels import build

    folder = tmp_path / "kernels"
    folder.mkdir()
    stale, fresh = folder / ".build-stale.so", folder / ".build-fresh.so"
    stale.write_bytes(b"half a library")
    fresh.write_bytes(b"a build in progress")
    old = time.time() - 3 * build.BUILD_TIMEOUT_S
    os.utime(stale, (old, old))
    monkeypatch.setenv("TOKENFLOW_CACHE", str(tmp_path))
    assert kernels.rms_norm_kernel()[0] is not None  # built anew in this cache
    assert not stale.exists() and fresh.exists()

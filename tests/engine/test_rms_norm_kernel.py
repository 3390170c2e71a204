"""The compiled RMSNorm kernel (engine.cpu_kernels) against transformers' own LlamaRMSNorm: the
residual sum bitwise, the norm within what a different summation order of the variance allows."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm as HFRMSNorm

from tokenflow.engine.builtin.kernels import rms_norm_kernel
from tests.engine.engine_testlib import U32

BF16_ULP = 2.0**-7
"""bfloat16's spacing relative to a value's leading power of two (8 significant bits)."""


@pytest.fixture(scope="module")
def kernel():
    fn, why = rms_norm_kernel()
    assert fn is not None, why
    return fn


def norm_and_rows(dtype, hidden, rows, seed):
    gen = torch.Generator().manual_seed(seed)
    hf = HFRMSNorm(hidden, eps=1e-5).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(1 + 0.3 * torch.randn(hidden, generator=gen))
    h = (3 * torch.randn(rows, 1, hidden, generator=gen)).to(dtype)
    delta = torch.randn(rows, 1, hidden, generator=gen).to(dtype)
    return hf, h, delta


@pytest.mark.parametrize("hidden", [64, 576])
def test_bfloat16_norm_is_transformers(kernel, hidden):
    """Both normalise in float32 and round twice (normalised, then scaled); only the order of
    the variance's sum differs, which moves the float32 value by about H·u of itself and so can
    flip its rounding only within that distance of a bfloat16 rounding boundary: expected share
    2·H·u·2^8, 0.2% at H = 64 and 1.8% at H = 576, and then by one bfloat16 step."""
    hf, h, delta = norm_and_rows(torch.bfloat16, hidden, 64, seed=hidden)
    summed, got = kernel(delta, hf.weight.data, hf.variance_epsilon, residual=h)
    assert torch.equal(summed, h + delta)
    want = hf(h + delta)
    diff = (got.float() - want.float()).abs()
    assert (diff <= 2 * BF16_ULP * want.float().abs()).all()
    assert (diff > 0).float().mean().item() <= 2 * 2 * hidden * U32 * 2**8
    alone = kernel(h, hf.weight.data, hf.variance_epsilon)  # no residual: the norm alone
    assert ((alone.float() - hf(h).float()).abs() <= 2 * BF16_ULP * hf(h).float().abs()).all()


@pytest.mark.parametrize("hidden", [64, 576])
def test_float32_norm_is_transformers_up_to_summation_order(kernel, hidden):
    """float32: the variance summed in another order (γ_H) and a reciprocal square root instead of
    rsqrt (an ulp or two), then two products: within (2·H + 8)·u of the value."""
    hf, h, delta = norm_and_rows(torch.float32, hidden, 64, seed=hidden)
    summed, got = kernel(delta, hf.weight.data, hf.variance_epsilon, residual=h)
    assert torch.equal(summed, h + delta)
    want = hf(h + delta)
    assert ((got - want).abs() <= (2 * hidden + 8) * U32 * want.abs()).all()


def test_non_contiguous_rows_keep_their_shape(kernel):
    """Qwen3's q/k norms run on heads sliced out of the fused projection."""
    hf, h, _ = norm_and_rows(torch.bfloat16, 64, 8, seed=3)
    wide = torch.cat([h, h], dim=-1).view(8, 1, 2, 64)[:, :, 1]
    assert not wide.is_contiguous()
    assert torch.equal(kernel(wide, hf.weight.data, hf.variance_epsilon), kernel(h.view(8, 1, 64), hf.weight.data,
                                                                                  hf.variance_epsilon))

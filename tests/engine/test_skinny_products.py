"""The engine's float32 products of a few rows (`packed.SKINNY_ROWS`: a decode step) by a large
weight run as ``weight @ x.T``; they must equal ``F.linear`` up to float32 rounding, bias and
batch shape included, on both sides of the row limit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.engine.engine_testlib import float32_product_bound
from tokenflow.engine.builtin.models import LARGE_WEIGHT
from tokenflow.engine.builtin.models.packed import SKINNY_ROWS, Linear


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 5, SKINNY_ROWS, SKINNY_ROWS + 1, 300])
def test_a_product_of_few_rows_is_the_plain_one_up_to_rounding(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    k, n = 576, 512
    assert k * n >= LARGE_WEIGHT  # a weight large enough to take that path
    layer = Linear(k, n, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, k, generator=gen) * 0.05)
        if bias:
            layer.bias.copy_(torch.randn(n, generator=gen))
    x = torch.randn(rows, 1, k, generator=gen)  # [batch, one new token, hidden], as a decode step
    with torch.no_grad():
        got, want = layer(x), F.linear(x, layer.weight, layer.bias)
        bound = float32_product_bound(x, layer.weight, want)
    assert got.shape == want.shape == (rows, 1, n) and got.is_contiguous()
    assert (got - want).abs().le(bound).all(), (got - want).abs().max()

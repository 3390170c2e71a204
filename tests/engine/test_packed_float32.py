"""``engine.pack_weights`` in float32: the large linear weights are packed for oneDNN (its kernels
beat MKL's sgemm at a decode step's rows), their products equal the plain ones up to summation
order, small weights stay as they are, every weight update packs them again, and `--dry-run`'s
estimate counts what they take. (The real model's parity with transformers, with packing on:
tests/real_model/test_engine.py.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig

from tests.engine.engine_testlib import float32_product_bound, make_engine, randomize
from tokenflow.engine.builtin.models import LARGE_WEIGHT
from tokenflow.engine.builtin.models.packed import Linear, can_pack
from tokenflow.runtime.run.memory_estimate import ModelShape, packed_float32_params

pytestmark = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.float32),
                                reason="this torch has no oneDNN to pack float32 weights with")

HIDDEN = 512


def wide_model(seed: int):
    """A Llama whose layers straddle the packing limit: q/k/v, output and gate/up weights of at
    least 2^18 elements, the down projection (256 × 512) under it."""
    config = LlamaConfig(vocab_size=600, hidden_size=HIDDEN, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    return randomize(AutoModelForCausalLM.from_config(config).eval(), seed, std=0.05)


def assert_plain_up_to_rounding(layer: Linear, x: torch.Tensor) -> None:
    with torch.no_grad():
        got, want = layer(x), F.linear(x, layer.weight, layer.bias)
        bound = float32_product_bound(x, layer.weight, want)
    assert got.shape == want.shape and got.is_contiguous()
    assert (got - want).abs().le(bound).all(), (got - want).abs().max()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
def test_a_packed_float32_product_is_the_plain_one_up_to_rounding(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    k, n = 576, 512
    layer = Linear(k, n, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, k, generator=gen) * 0.05)
        if bias:
            layer.bias.copy_(torch.randn(n, generator=gen))
    layer.pack()
    assert layer.packed is not None
    assert_plain_up_to_rounding(layer, torch.randn(rows, 1, k, generator=gen))


def test_large_float32_weights_are_packed_small_ones_not_and_the_estimate_counts_them(tmp_path):
    hf = wide_model(seed=1)
    hf.save_pretrained(tmp_path)
    engine = make_engine(hf, dtype="float32", max_num_seqs=4, pack_weights=True)
    layer = engine.model.model.layers[0]
    assert layer.mlp.down_proj.weight.numel() < LARGE_WEIGHT and layer.mlp.down_proj.packed is None
    for big in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, engine.model.lm_head):
        assert big.weight.numel() >= LARGE_WEIGHT and big.packed is not None
    per_layer = HIDDEN * (HIDDEN + 2 * 256) + HIDDEN * HIDDEN + 2 * HIDDEN * 256
    assert engine.model.packed_bytes == 4 * (2 * per_layer + 600 * HIDDEN)
    assert engine.model.packed_bytes == 4 * packed_float32_params(ModelShape.read(tmp_path))
    plain = make_engine(hf, dtype="float32", max_num_seqs=4, pack_weights=False)
    assert plain.model.packed_bytes == 0 and plain.model.lm_head.packed is None


def test_every_weight_update_packs_the_new_weights():
    engine = make_engine(wide_model(seed=1), dtype="float32", max_num_seqs=4, pack_weights=True)
    other = wide_model(seed=2)
    engine.update_weights(list(other.state_dict().items()), version=1)
    assert torch.equal(engine.model.lm_head.weight, other.lm_head.weight)
    gen = torch.Generator().manual_seed(0)
    packed = [m for m in engine.model.modules() if isinstance(m, Linear) and m.packed is not None]
    assert len(packed) == 2 * 3 + 1
    for layer in packed:  # a stale packed copy would multiply by seed 1's weights
        assert_plain_up_to_rounding(layer, torch.randn(5, 1, layer.in_features, generator=gen))

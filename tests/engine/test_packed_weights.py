"""``engine.pack_weights``: oneDNN's packed weights on the CPU in bfloat16 give the very tokens and
log-probs of the plain products, and are packed again after every weight update."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.engine.engine_testlib import hf_model, make_engine
from tokenflow.engine import SamplingParams
from tokenflow.engine.builtin.models.packed import Linear, can_pack

pytestmark = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.bfloat16),
                                reason="no oneDNN bfloat16 here to pack weights with (this torch, or this CPU: AVX2 only)")

PROMPTS = [[5, 6, 7, 8, 9], [20, 21], list(range(30, 44))]
PARAMS = SamplingParams(temperature=1.0, n=3, max_tokens=10, seed=4, ignore_eos=True, logprobs=2)


def generate(engine) -> list:
    return [(r.completion_ids.tolist(), r.logprobs.tolist(), [t[1].tolist() for t in r.top_logprobs])
            for group in engine.generate(PROMPTS, PARAMS) for r in group]


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
def test_a_packed_product_is_bitwise_the_plain_one(rows):
    gen = torch.Generator().manual_seed(rows)
    layer = Linear(96, 160, bias=True).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(160, 96, generator=gen))
        layer.bias.copy_(torch.randn(160, generator=gen))
    x = torch.randn(rows, 1, 96, generator=gen).to(torch.bfloat16)
    plain = F.linear(x, layer.weight, layer.bias)
    layer.pack()
    assert torch.equal(layer(x), plain)


def test_packed_weights_generate_what_plain_ones_do_and_follow_every_update():
    start, other = hf_model("llama", seed=1), hf_model("llama", seed=2)
    packed = make_engine(start, dtype="bfloat16", max_num_seqs=8, pack_weights=True)
    plain = make_engine(start, dtype="bfloat16", max_num_seqs=8, pack_weights=False)
    assert packed.model.packs_weights and packed.model.packed_bytes > 0
    assert not plain.model.packs_weights and plain.model.lm_head.packed is None
    assert generate(packed) == generate(plain)
    # New weights: the packed copies must be made again from them, not kept from the start.
    for engine in (packed, plain):
        engine.update_weights(list(other.state_dict().items()), version=1)
    fresh = make_engine(other, dtype="bfloat16", max_num_seqs=8, pack_weights=False)
    assert generate(packed) == generate(fresh) == generate(plain)


def test_the_engine_names_what_packing_costs_when_it_starts(caplog):
    hf = hf_model("llama", seed=1)
    with caplog.at_level("INFO", logger="tokenflow.engine.builtin.llm_engine"):
        packed = make_engine(hf, dtype="bfloat16", pack_weights=True, cpu_kernels=False)
        make_engine(hf, dtype="bfloat16", pack_weights=False, cpu_kernels=False)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("engine: ")]
    assert len(lines) == 2
    assert lines[0].endswith(f"linear weights also packed for oneDNN ({packed.model.packed_bytes / 1e6:.0f} MB; "
                             "engine.pack_weights)")
    assert "packed" not in lines[1]

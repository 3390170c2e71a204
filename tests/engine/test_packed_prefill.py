"""A prefill step runs its prompts packed (`ModelRunner._prefill_packed`): the products see each
prompt's real tokens and nothing else, attention still runs per prompt (windowed layers
included), each prompt's keys/values land in its own slots, and the engine's logits, prefill and
decode, match transformers prompt for prompt. An MoE model that does not record its routing
takes the same path."""

from __future__ import annotations

import pytest
import torch

from tests.engine.engine_testlib import FAMILIES, LogitsRecorder, hf_logits, hf_model, make_engine
from tests.engine.moe_testlib import moe_hf_model
from tokenflow.engine import SamplingParams

LENGTHS = [70, 3, 66, 5, 72, 4, 2, 68]  # long and short interleaved; longer than the 8-token windows


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(3, 128, (n,), generator=gen).tolist() for n in LENGTHS]


def check_against_transformers(hf, engine) -> list[int]:
    """Generate from every prompt in one prefill step; returns the row counts the first layer's
    fused q/k/v product saw in that step."""
    rec = LogitsRecorder()
    engine.logits_hook = rec
    rows: list[int] = []
    qkv = engine.runner.model.model.layers[0].self_attn.qkv_proj
    hook = qkv.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[:-1].numel()))
    params = [SamplingParams(temperature=0.8, n=2, max_tokens=6, ignore_eos=True, seed=i) for i in range(len(LENGTHS))]
    try:
        results = engine.generate(prompts(), params)
    finally:
        hook.remove()
    assert rec.kinds[0] == ("prefill", 2 * len(LENGTHS))  # all of them admitted in one prefill step
    for prompt, group in zip(prompts(), results):
        for r in group:
            assert r.num_tokens == 6
            ref = hf_logits(hf, prompt, r.completion_ids)
            assert (rec.of(r) - ref).abs().max().item() <= 1e-4  # the parity tests' tolerance
    return rows


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_prompts_match_transformers_prompt_for_prompt(family):
    hf = hf_model(family, seed=1)
    rows = check_against_transformers(hf, make_engine(hf, max_num_seqs=16))
    assert rows[0] == sum(LENGTHS)  # one forward over the real tokens: 290, where padding takes 576


def test_an_moe_model_not_recording_routing_prefills_packed():
    hf = moe_hf_model("qwen3_moe", seed=1)
    rows = check_against_transformers(hf, make_engine(hf, max_num_seqs=16, record_routing=False))
    assert rows[0] == sum(LENGTHS)
    recorded = check_against_transformers(hf, make_engine(hf, max_num_seqs=16))
    assert recorded[0] == len(LENGTHS) * max(LENGTHS)  # recording reads routing back as [G, L]: padded

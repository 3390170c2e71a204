"""The decode split: a batch with a few long rows attends over the short rows' length, and the
long rows again over every position. The logits must stay those of transformers. (With
``engine.cpu_kernels`` each row reads its own length and nothing is split:
tests/engine/test_decode_kernel.py.)"""

from __future__ import annotations

import pytest
import torch

import tokenflow.engine.builtin.model_runner as model_runner
from tokenflow.engine import SamplingParams
from tokenflow.engine.builtin.models.attention import decode_split
from tests.engine.engine_testlib import FAMILIES, LogitsRecorder, hf_logits, hf_model, make_engine


def test_split_takes_the_cheapest_cut_and_only_when_it_pays():
    # One row of 300 among 15 of 10: attend over 10, then the long row alone.
    assert decode_split([10] * 7 + [300] + [10] * 8) == (10, [7])
    # Two long rows: cutting both (16*12 + 2*2*300) beats cutting one (16*280 + 2*300).
    assert decode_split([12] * 14 + [280, 300]) == (12, [14, 15])
    # Lengths alike, or too few rows to be worth a second pass: no split.
    assert decode_split([50 + i for i in range(16)]) is None
    assert decode_split([10, 10, 10, 300]) is None
    # Most rows long: cutting off a quarter of them saves too little.
    assert decode_split([300] * 12 + [10] * 4) is None


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_split_decode_matches_transformers(family, monkeypatch):
    splits = []

    def counted(lengths):
        split = decode_split(lengths)
        splits.append(split)
        return split

    monkeypatch.setattr(model_runner, "decode_split", counted)
    hf = hf_model(family, seed=2)
    engine = make_engine(hf, cpu_kernels=False)  # the split serves PyTorch's attention only
    rec = LogitsRecorder()
    engine.logits_hook = rec
    gen = torch.Generator().manual_seed(5)
    prompt = lambda n: torch.randint(3, 128, (n,), generator=gen).tolist()  # noqa: E731

    # A straggler alone for 60 tokens, then eleven short requests join it (staggered starts,
    # as in an asynchronous run): the batch is one long row among short ones.
    long_prompt, short_prompts = prompt(5), [prompt(4) for _ in range(11)]
    prompts = {"long": long_prompt, **{f"short{i}": p for i, p in enumerate(short_prompts)}}
    engine.add_request(long_prompt, SamplingParams(temperature=0, max_tokens=100, ignore_eos=True), request_id="long")
    done = []
    for _ in range(60):
        done += engine.step()
    for i, p in enumerate(short_prompts):
        engine.add_request(p, SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True, seed=3),
                           request_id=f"short{i}")
    while engine.has_unfinished():
        done += engine.step()

    assert any(s is not None for s in splits), "the scenario never split a decode batch"
    assert len(done) == 12
    for r in done:
        ref = hf_logits(hf, prompts[r.request_id], r.completion_ids)
        # The bound of the engine's parity test: float32 noise, here summed in another order.
        assert (rec.of(r) - ref).abs().max().item() <= 1e-4, r.request_id

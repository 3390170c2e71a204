"""A prefill step runs its prompts in runs of similar length (`prefill_buckets.length_buckets`):
the cut is the cheapest one, every prompt lands in exactly one run, and the engine's logits,
prefill and decode, still match transformers prompt for prompt (the runs' results put back in
order, each prompt's keys/values in its own slots)."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from tests.engine.engine_testlib import LogitsRecorder, hf_logits, hf_model, make_engine
from tokenflow.engine import SamplingParams
from tokenflow.engine.builtin.prefill_buckets import length_buckets


def cost(lengths: list[int], runs: list[list[int]], forward_rows: int) -> int:
    return sum(len(run) * max(lengths[i] for i in run) + forward_rows for run in runs)


def test_the_cut_is_the_cheapest_and_covers_every_prompt_once():
    rng = np.random.default_rng(0)
    for _ in range(60):
        n = int(rng.integers(1, 9))
        lengths = rng.integers(1, 120, size=n).tolist()
        forward_rows = int(rng.choice([0, 16, 64, 500]))
        runs = length_buckets(lengths, forward_rows)
        assert sorted(i for run in runs for i in run) == list(range(n))
        ordered = [lengths[i] for run in runs for i in run]
        assert ordered == sorted(lengths)  # shortest first, no run overlapping another
        # Every cut of the sorted prompts into contiguous runs, by brute force.
        order = sorted(range(n), key=lengths.__getitem__)
        best = min(cost(lengths, [order[a:b] for a, b in zip((0, *cuts), (*cuts, n))], forward_rows)
                   for k in range(n) for cuts in itertools.combinations(range(1, n), k))
        assert cost(lengths, runs, forward_rows) == best, (lengths, forward_rows, runs)
    assert length_buckets([30, 30, 30]) == [[0, 1, 2]]
    assert length_buckets([]) == []


def test_prompts_prefilled_in_runs_match_transformers_prompt_for_prompt():
    hf = hf_model("llama", seed=1)
    engine = make_engine(hf, max_num_seqs=16)
    rec = LogitsRecorder()
    engine.logits_hook = rec
    gen = torch.Generator().manual_seed(5)
    lengths = [70, 3, 66, 5, 72, 4, 2, 68]
    prompts = [torch.randint(3, 128, (n,), generator=gen).tolist() for n in lengths]
    assert length_buckets(lengths) == [[6, 1, 5, 3], [2, 7, 0, 4]]  # two runs, interleaved in the batch
    params = [SamplingParams(temperature=0.8, n=2, max_tokens=6, ignore_eos=True, seed=i) for i in range(len(prompts))]
    results = engine.generate(prompts, params)
    assert rec.kinds[0] == ("prefill", 2 * len(prompts))  # all of them admitted in one prefill step
    for prompt, group in zip(prompts, results):
        for r in group:
            assert r.num_tokens == 6
            ref = hf_logits(hf, prompt, r.completion_ids)
            assert (rec.of(r) - ref).abs().max().item() <= 1e-4  # the parity tests' tolerance

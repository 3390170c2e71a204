"""FSDP2 over 2 gloo ranks trains exactly like one process on the same global batch."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from tests.distributed.ranks_testlib import CASES, STEPS, build, fsdp_rank
from tokenflow.sync.broadcast import free_port
from tokenflow.trainer import Trainer

pytestmark = pytest.mark.slow  # a real run (or several processes) per test

KEYS = ("loss/total", "loss/policy", "loss/kl", "loss/value", "optim/grad_norm", "policy/clip_frac",
        "policy/entropy", "offpolicy/is_ratio_max", "offpolicy/is_ratio_min", "routing/disagreement")


@pytest.fixture(scope="module")
def two_ranks():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=fsdp_rank, args=(r, 2, port, out), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = out.get(timeout=240)
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return results


@pytest.mark.parametrize("case", list(CASES))
def test_two_fsdp_ranks_match_one_process(two_ranks, case):
    model, tcfg, algo, rollouts = build(case)
    single = Trainer(model, tcfg, algo)
    want = [single.train_step(rollouts) for _ in range(STEPS)]
    got, weights = two_ranks[case]
    for g, w in zip(got, want):
        for key in KEYS:
            if key in w:
                assert g[key] == pytest.approx(w[key], abs=1e-5, rel=1e-5), key
        # every token trained once (a prompt once per rank that holds samples of its group)
        assert g["perf/train_tokens"] + g["perf/shared_prompt_tokens"] == \
            w["perf/train_tokens"] + w["perf/shared_prompt_tokens"]
        assert (g["perf/shared_prompt_tokens"] > 0) == (w["perf/shared_prompt_tokens"] > 0) == (case == "grpo_shared_prompts")
        assert g["perf/trainer_ranks"] == 2.0
        assert g["perf/skipped_sequences"] == w["perf/skipped_sequences"] == (8 if case == "grpo_flat_groups" else 0)
    ref = dict(single.named_weights())
    assert set(weights) == set(ref)
    for name, t in ref.items():
        assert (torch.from_numpy(weights[name]) - t).abs().max().item() <= 1e-5, name
    moved = max((t - p).abs().max().item() for (name, t), p in zip(ref.items(), build(case)[0].state_dict().values()))
    assert moved > 1e-4  # the parameters did change

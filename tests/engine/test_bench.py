"""`tokenflow bench engine`: the printed figures against their definitions (tokens/s = tokens /
seconds of the best run, speedup = engine tokens/s / transformers tokens/s), on a real tiny
workload and on one with timings fixed in advance (a known answer)."""

from __future__ import annotations

import json

import pytest
import torch

from tokenflow.bench import engine as bench_engine
from tokenflow.cli.main import main


@pytest.mark.slow
def test_bench_engine_prints_one_json_object(capsys):
    threads = torch.get_num_threads()
    try:
        assert main(["bench", "engine", "--prompts", "3", "--samples", "2", "--max-tokens", "6",
                     "--threads", "1", "--json"]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads(capsys.readouterr().out)
    tokens = result["requested_tokens"]  # ignore_eos: every request generates its max_tokens
    assert 3 * 2 <= tokens <= 3 * 2 * 6
    assert result["engine_mean_decode_step_ms"] > 0
    # Each rate from the printed seconds. The seconds are rounded to 1 ms, so the measured ones lie
    # within 0.5 ms of them, and the rate (rounded to 0.1 token/s) within the rates of that interval.
    for key in ("engine", "hf_generate"):
        seconds = result[f"{key}_seconds"]
        assert seconds == min(result[f"{key}_seconds_all"]) > 0.0005
        rate = result[f"{key}_tokens_per_s"]
        assert tokens / (seconds + 0.0005) - 0.05 <= rate <= tokens / (seconds - 0.0005) + 0.05
    # The speedup (rounded to 0.001) from the two rates (each rounded to 0.1 token/s).
    engine_rate, hf_rate = result["engine_tokens_per_s"], result["hf_generate_tokens_per_s"]
    low, high = (engine_rate - 0.05) / (hf_rate + 0.05), (engine_rate + 0.05) / (hf_rate - 0.05)
    assert low - 0.0005 <= result["speedup"] <= high + 0.0005


def test_bench_engine_figures_on_known_timings(capsys, monkeypatch):
    """Timings fixed in advance: the engine's best run 0.5 s and transformers' best 2.0 s for the
    same tokens, so the engine is exactly 4x faster; the best of the repeats is the one reported."""
    engine_s, hf_s = iter([0.8, 0.5]), iter([2.0, 3.0])

    def fake_engine(args, engine, prompts, max_tokens):
        return {"seconds": next(engine_s), "tokens": args.samples * sum(max_tokens), "decode_steps": 10,
                "recorded": 0, "prefill_steps": 1, "mean_decode_step_ms": 1.0, "prefill_seconds": 0.0}

    def fake_hf(args, hf_model, prompts, max_tokens):
        return {"seconds": next(hf_s), "tokens": args.samples * sum(max_tokens), "generated_including_waste": 0}

    monkeypatch.setattr(bench_engine, "_run_engine", fake_engine)
    monkeypatch.setattr(bench_engine, "_run_hf", fake_hf)
    threads = torch.get_num_threads()
    try:
        assert main(["bench", "engine", "--prompts", "3", "--samples", "2", "--max-tokens", "6",
                     "--threads", "1", "--repeat", "2", "--json"]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads(capsys.readouterr().out)
    tokens = result["requested_tokens"]
    assert result["engine_seconds"] == 0.5 and result["hf_generate_seconds"] == 2.0
    assert result["engine_tokens_per_s"] == round(tokens / 0.5, 1)
    assert result["hf_generate_tokens_per_s"] == round(tokens / 2.0, 1)
    assert result["speedup"] == 4.0


@pytest.mark.slow
def test_bench_engine_on_a_moe_prints_the_routing_record_overhead(capsys):
    threads = torch.get_num_threads()
    try:
        assert main(["bench", "engine", "--moe", "--prompts", "3", "--samples", "2", "--max-tokens", "6",
                     "--threads", "1", "--skip-hf", "--json"]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads(capsys.readouterr().out)
    assert result["engine_routing_recorded"] and result["engine_tokens_per_s_no_routing"] > 0
    assert "routing_record_overhead_pct" in result

